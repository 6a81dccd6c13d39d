/*
 * fuzz_safetensors.c: libFuzzer target for the safetensors reader (header JSON,
 * offsets, dtypes, the name index) as checkpoints and weight files use it.
 */
#include <stdint.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_st_file *f = NULL;
    if (dt_st_open_mem(data, size, "fuzz.safetensors", &f) != DT_OK) return 0;
    for (size_t i = 0; i < dt_st_count(f); i++) {
        dt_st_tensor t;
        if (dt_st_tensor_at(f, i, &t) == DT_OK) (void)dt_st_find(f, t.name, &t);
    }
    for (size_t i = 0; i < dt_st_meta_count(f); i++) {
        const char *k, *v;
        dt_st_meta_at(f, i, &k, &v);
        (void)dt_st_meta_get(f, k);
    }
    dt_st_close(f);
    return 0;
}
