/*
 * fuzz_tokens.c: libFuzzer target for the token file readers (llm.c's format and
 * nanoGPT's raw uint16, src/data_tokens.c). The input becomes both train.bin and
 * val.bin of a private directory (one per input, removed after it), opened as
 * tokens:DIR with a window of 8 tokens; the first byte picks the vocabulary (even:
 * from the files, odd: 256). When the files are accepted, a window is gathered and
 * the split fingerprinted.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20)) return 0;
    char dir[64];
    fuzz_dir(dir, sizeof dir, "tokens");
    if (!fuzz_put(dir, "train.bin", data + 1, size - 1) || !fuzz_put(dir, "val.bin", data + 1, size - 1)) {
        fuzz_dir_done(dir);
        return 0;
    }
    char spec[96];
    snprintf(spec, sizeof spec, "tokens:%s", dir);
    dt_data_opts o;
    dt_data_opts_default(&o);
    o.window = 8;
    o.classes = (data[0] & 1) ? 256 : 0;
    dt_dataset *train = NULL, *test = NULL;
    if (dt_dataset_open_pair(spec, &o, &train, &test) == DT_OK) {
        float x[8];
        int32_t y[8];
        int64_t last = dt_dataset_get_info(train)->n - 1;
        uint64_t h;
        if (dt_dataset_gather(train, &last, 1, x, y) != DT_OK) abort();   /* an accepted file serves every window */
        dt_dataset_fingerprint(test, &h);
    }
    dt_dataset_free(train);
    dt_dataset_free(test);
    fuzz_dir_done(dir);
    return 0;
}
