/*
 * fuzz_dtrun_start.c: libFuzzer target for the parser of a rendezvous START
 * (src/tools/dtrun_parse.c): the line comes over the network from whoever reaches
 * --master-port with the job's secret, and a wrong field becomes a wrong MASTER_PORT,
 * RANK or NODE_RANK. Whatever the line holds, the parser refuses it or returns fields
 * within the ranges dtrun_parse.h promises: a world of 1 .. DTRUN_MAX_RANKS x
 * DTRUN_MAX_NODES ranks that holds ranks rank0 .. rank0+nlocal-1, a group in
 * [0, ngroups) with a port in 1 .. 65535 (a spare: group -1, a port in 0 .. 65535),
 * a finite non-negative change time and a change text that ends inside its buffer
 * with no tab left.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dtrun_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 12) return 0;
    char *args = malloc(size + 1);   /* exactly the bytes given, and the NUL the parser reads to */
    if (!args) return 0;
    memcpy(args, data, size);
    args[size] = '\0';
    dtrun_start st;
    if (dtrun_parse_start(args, &st) == 0) {
        long max_world = (long)DTRUN_MAX_RANKS * DTRUN_MAX_NODES;
        if (st.attempt < 0 || st.kind < 0 || st.kind > 2 || st.restarts < 0) abort();
        if (st.world < 1 || st.world > max_world || st.ngroups < 1 || st.ngroups > DTRUN_MAX_NODES ||
            st.ngroups > st.world)
            abort();
        if (st.nlocal < 0 || st.nlocal > DTRUN_MAX_RANKS || st.rank0 < 0 || (long)st.rank0 + st.nlocal > st.world)
            abort();
        if (st.port < 0 || st.port > 65535) abort();
        if (st.nlocal > 0 && (st.group < 0 || st.group >= st.ngroups || st.port < 1)) abort();
        if (st.nlocal == 0 && st.group != -1) abort();
        if (!isfinite(st.change_at) || st.change_at < 0) abort();
        size_t l = strnlen(st.change, sizeof st.change);
        if (l == sizeof st.change || memchr(st.change, '\t', l)) abort();
    }
    free(args);
    return 0;
}
