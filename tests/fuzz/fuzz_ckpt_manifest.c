/*
 * fuzz_ckpt_manifest.c: libFuzzer target for restoring a sharded checkpoint (ckpt.h):
 * the manifest (train_state.safetensors: the run's metadata, "dtrain.shards" and each
 * shard's "lo,len,checksum"), the shard files (their range, "params" and the
 * optimizer's arrays) and the buffers of model.safetensors, read into a model by the
 * restores `dtrain export` and a resume run.
 *
 * The input is three little-endian u32 lengths L0 L1 L2, then L0 bytes of manifest, L1
 * of shard 0, L2 of shard 1 and the rest as model.safetensors, written as the step
 * directory step-000000000001 of a private directory (one per input, removed after
 * it). Shard 0 goes in as shard-00000-of-00001 and shard-00000-of-00002, shard 1 as
 * shard-00001-of-00002, so a manifest of one shard or of two finds its files. The
 * seeds are real checkpoints of the model below (4418 parameters: shards of 4096 and
 * 322) after one step of `dtrain train --data synthetic:64,1,8,8,2 --batch 8
 * --micro-batches 2`: AdamW on 2 ranks with --shard optim and --shard params, SGD with
 * momentum on 2 ranks with --shard grads, AdamW on 1 rank unsharded (manifest = its
 * train_state, no shards). Checksums cannot be forged by a fuzzer, so the testing
 * hook lets a mismatch through (testing.h) and the checks behind it run.
 *
 * An opened checkpoint is restored as export does (its recorded input shape read,
 * every parameter, no optimizer), as one rank resuming it unsharded (AdamW over all
 * parameters), and as each of two ranks of --shard params (its range of parameters and
 * of the AdamW state). Any of them may refuse; none may crash, leak or read outside a
 * file, and a refusal always leaves a message (docs/DESIGN.md rule 5).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "model.h"
#include "ops.h"
#include "optim.h"
#include "testing.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SPEC  "flatten linear(64) bn relu linear(2)"   /* on 1x8x8 inputs */
#define CHUNK 4096                                    /* a shard is whole chunks (shard.h) */

static dt_model *model;
static dt_optim *whole, *part[2];   /* AdamW over all parameters; over rank r's range */
static size_t nparams, lo[2], hi[2];

static void setup(void) {
    const dt_ops *ops = dt_ops_cpu();
    dt_shape in = {.ndim = 3, .d = {1, 8, 8}};
    if (dt_model_build(SPEC, &in, ops, 0, 1, &model) != DT_OK) abort();
    nparams = dt_model_nparams(model);
    lo[0] = 0, hi[0] = nparams < CHUNK ? nparams : CHUNK;
    lo[1] = hi[0], hi[1] = nparams;
    dt_optim_config c = dt_optim_defaults(DT_OPTIM_ADAMW, 1e-3f);
    if (dt_optim_init(&c, ops, nparams, &whole) != DT_OK) abort();
    for (int r = 0; r < 2; r++)
        if (dt_optim_init(&c, ops, hi[r] - lo[r], &part[r]) != DT_OK) abort();
    dt_testing_set_unverified(1);
}

static uint32_t take_len(const uint8_t **data, size_t *size) {
    if (*size < 4) return 0;
    uint32_t l = (uint32_t)(*data)[0] | (uint32_t)(*data)[1] << 8 | (uint32_t)(*data)[2] << 16 |
                 (uint32_t)(*data)[3] << 24;
    *data += 4;
    *size -= 4;
    return l;
}

/* A refusal names what is wrong. */
static void refused(dt_status s) {
    if (s != DT_OK && !dt_last_error()[0]) abort();
}

static void restore(const char *step) {
    dt_ckpt *c = NULL;
    dt_error_clear();
    dt_status s = dt_ckpt_open(step, &c);
    refused(s);
    if (s != DT_OK) return;
    const dt_ckpt_info *ci = dt_ckpt_info_of(c);
    if (ci->shards < 0 || ci->batch < 1 || ci->micro_batches < 1) abort();   /* validated on open */
    /* dtrain export: the input shape, then every parameter */
    dt_shape shape;
    const char *text = dt_ckpt_extra(c, "input_shape");
    if (text && dt_shape_parse(text, &shape) == DT_OK && (shape.ndim < 1 || shape.ndim > 3)) abort();
    dt_error_clear();
    refused(dt_ckpt_restore_range(c, model, 0, nparams, NULL, 0));
    /* a resume on one rank, unsharded */
    dt_error_clear();
    refused(dt_ckpt_restore(c, model, whole));
    /* a resume on two ranks with --shard params: each its own range */
    for (int r = 0; r < 2; r++) {
        dt_error_clear();
        refused(dt_ckpt_restore_range(c, model, lo[r], hi[r], part[r], lo[r]));
    }
    dt_ckpt_close(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (4u << 20)) return 0;
    if (!model) setup();
    uint32_t len[3];
    for (int i = 0; i < 3; i++) len[i] = take_len(&data, &size);
    const uint8_t *part_at[3];
    for (int i = 0; i < 3; i++) {
        if (len[i] > size) len[i] = (uint32_t)size;
        part_at[i] = data;
        data += len[i];
        size -= len[i];
    }
    char dir[64], step[128], one[256], two[256];
    fuzz_dir(dir, sizeof dir, "ckpt_manifest");
    snprintf(step, sizeof step, "%s/step-000000000001", dir);
    if (mkdir(step, 0700) != 0) abort();
    snprintf(one, sizeof one, "%s/shard-00000-of-00001.safetensors", step);
    snprintf(two, sizeof two, "%s/shard-00000-of-00002.safetensors", step);
    if (fuzz_put(step, "train_state.safetensors", part_at[0], len[0]) &&
        fuzz_put(step, "shard-00000-of-00002.safetensors", part_at[1], len[1]) && link(two, one) == 0 &&
        fuzz_put(step, "shard-00001-of-00002.safetensors", part_at[2], len[2]) &&
        fuzz_put(step, "model.safetensors", data, size))
        restore(step);
    fuzz_dir_done(dir);
    return 0;
}
