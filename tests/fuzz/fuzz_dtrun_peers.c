/*
 * fuzz_dtrun_peers.c: libFuzzer target for the parser of a rendezvous PEERS
 * (src/tools/dtrun_parse.c): the line comes over the network from whoever serves the
 * rendezvous with the job's secret, and its addresses and ports are where a node goes
 * should node 0 be lost. Whatever the line holds, the parser refuses it or returns
 * 1 .. DTRUN_MAX_NODES entries with node ranks strictly increasing below
 * DTRUN_MAX_NODES, each address a non-empty string of hex digits, '.' and ':' that ends
 * inside its buffer, each port in 0 .. 65535.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/dtrun_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dtrun_peers pe;   /* 300 KiB: not on the stack */
    if (size > 1 << 14) return 0;
    char *args = malloc(size + 1);
    if (!args) return 0;
    memcpy(args, data, size);
    args[size] = '\0';
    if (dtrun_parse_peers(args, &pe) == 0) {
        if (pe.n < 1 || pe.n > DTRUN_MAX_NODES) abort();
        for (int i = 0; i < pe.n; i++) {
            if (pe.node[i] < 0 || pe.node[i] >= DTRUN_MAX_NODES || (i && pe.node[i] <= pe.node[i - 1])) abort();
            size_t l = strnlen(pe.addr[i], DTRUN_ADDR_MAX);
            if (l == 0 || l == DTRUN_ADDR_MAX || strspn(pe.addr[i], "0123456789abcdefABCDEF.:") != l) abort();
            if (pe.port[i] < 0 || pe.port[i] > 65535) abort();
        }
    } else if (pe.n != 0) {
        abort();
    }
    free(args);
    return 0;
}
