/*
 * fuzz_ckpt.c: libFuzzer target for the checkpoint reader (src/ckpt.c): the metadata
 * of train_state.safetensors (step, epoch, batch, micro-batches, world size, model
 * spec, optimizer and its hyper-parameters, the trainer's values) and the pairing with
 * model.safetensors. The input is a little-endian u32 L, then L bytes of
 * model.safetensors, then train_state.safetensors, written into a step directory of
 * a private checkpoint directory (one per input, removed after it). Checksums cannot
 * be forged by a fuzzer, so the testing hook lets a mismatch through (testing.h) and
 * the checks behind it run. A sharded checkpoint's manifest (the seed
 * sharded_manifest) reaches the shard list parser; its shard files are absent, so
 * opening them is the error path (fuzz_ckpt_manifest.c gives it shards and restores).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "testing.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4 || size > (4u << 20)) return 0;
    char dir[64], step[128];
    dt_testing_set_unverified(1);
    fuzz_dir(dir, sizeof dir, "ckpt");
    snprintf(step, sizeof step, "%s/step-000000000001", dir);
    if (mkdir(step, 0700) != 0) abort();
    uint32_t l = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
    if (l > size - 4) l = (uint32_t)(size - 4);
    dt_ckpt *c = NULL;
    if (fuzz_put(step, "model.safetensors", data + 4, l) &&
        fuzz_put(step, "train_state.safetensors", data + 4 + l, size - 4 - l) && dt_ckpt_open(step, &c) == DT_OK) {
        const dt_ckpt_info *ci = dt_ckpt_info_of(c);
        if (ci->batch < 1 || ci->micro_batches < 1 || ci->step < 0) abort();   /* validated on open */
        (void)dt_ckpt_extra(c, "data");
    }
    dt_ckpt_close(c);
    fuzz_dir_done(dir);
    return 0;
}
