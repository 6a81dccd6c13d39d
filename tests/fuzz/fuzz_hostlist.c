/*
 * fuzz_hostlist.c: libFuzzer target for the Slurm compressed host-list parser
 * (SLURM_JOB_NODELIST, "node[01-04,07],gpu-[1-2]").
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "launch_env.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    char **hosts = NULL;
    size_t n = 0;
    if (dt_hostlist_expand(text, &hosts, &n) == DT_OK) dt_hostlist_free(hosts, n);
    free(text);
    return 0;
}
