/*
 * export.c: `dtrain export` — the whole model of a training checkpoint as one
 * safetensors file in PyTorch's layout, the file `torch.load_state_dict` (or dtrain's
 * --weights and --init) takes.
 *
 * A sharded checkpoint (ckpt.h) keeps the parameters in one file per rank and no
 * loadable model file; an unsharded one has it already, and exporting it gives the
 * same tensors. The model is rebuilt on the CPU from the spec and the per-sample input
 * shape the checkpoint records, its parameters read from the shards.
 */
#include "config.h"
#include "dtrain.h"
#include "checkpoint.h"
#include "ckpt.h"
#include "tool_util.h"
#include "tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage_export[] =
    "usage: dtrain export CKPT -o FILE\n"
    "Write the model of a checkpoint (a step-* directory, or a checkpoint directory: its\n"
    "newest valid one) as one safetensors file with PyTorch's names and layouts.\n"
    "  -o, --output FILE     the file to write (replaced atomically)\n";

/* The recorded "1,28,28" into shape; DT_ERR_FORMAT naming the checkpoint otherwise. */
static dt_status parse_shape(const char *ckpt, const char *text, dt_shape *shape) {
    memset(shape, 0, sizeof *shape);
    if (!text || !*text) return dt_error(DT_ERR_FORMAT, "%s: no input shape recorded (written by an older dtrain: "
                                         "its model.safetensors is the whole model already)", ckpt);
    dt_status s = dt_shape_parse(text, shape);
    return s == DT_OK ? s : dt_error_wrap(s, "%s: ", ckpt);
}

int dtrain_export_main(int argc, char **argv) {
    const char *ckpt = NULL, *out = NULL;
    dt_status s = DT_OK;
    for (int i = 1; i < argc && s == DT_OK; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { fputs(usage_export, stdout); return 0; }
        if (dt_arg_match("--output", argc, argv, &i, &v, &s) || dt_arg_match("-o", argc, argv, &i, &v, &s)) out = v;
        else if (argv[i][0] == '-') s = dt_error(DT_ERR_INVALID, "unknown flag '%s' (see dtrain export --help)", argv[i]);
        else if (!ckpt) ckpt = argv[i];
        else s = dt_error(DT_ERR_INVALID, "export: one checkpoint at a time, got '%s' and '%s'", ckpt, argv[i]);
    }
    if (s == DT_OK && (!ckpt || !out))
        s = dt_error(DT_ERR_INVALID, "export: expected a checkpoint and -o FILE (see dtrain export --help)");
    if (s != DT_OK) return dt_tool_fail(s);

    /* a step-* directory, or the newest valid one of a checkpoint directory */
    char path[4096], probe[4200];
    snprintf(probe, sizeof probe, "%s/train_state.safetensors", ckpt);
    snprintf(path, sizeof path, "%s", ckpt);
    if (access(probe, F_OK) != 0) s = dt_ckpt_latest(ckpt, path, sizeof path, NULL, 0);
    dt_ckpt *c = NULL;
    dt_model *m = NULL;
    dt_shape shape;
    const dt_ops *ops = dt_ops_cpu();
    if (s == DT_OK) s = dt_ckpt_open(path, &c);
    if (s == DT_OK) s = parse_shape(path, dt_ckpt_extra(c, "input_shape"), &shape);
    if (s == DT_OK) s = dt_model_build(dt_ckpt_info_of(c)->model_spec, &shape, ops, 0, 1, &m);
    if (s == DT_OK) s = dt_ckpt_restore_range(c, m, 0, dt_model_nparams(m), NULL, 0);
    if (s == DT_OK) {
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)dt_ckpt_info_of(c)->step);
        const char *meta[] = {"format", "pt", "dtrain.model", dt_ckpt_info_of(c)->model_spec, "dtrain.step", step};
        s = dt_model_save(m, out, meta, 3);
    }
    if (s == DT_OK)
        printf("dtrain: wrote %s: the %zu parameters of %s (step %lld)\n", out, dt_model_nparams(m), path,
               (long long)dt_ckpt_info_of(c)->step);
    dt_model_free(m);
    dt_ckpt_close(c);
    /* a checkpoint that cannot be read is bad input */
    if (s == DT_ERR_IO || s == DT_ERR_FORMAT) s = DT_ERR_INVALID;
    return s == DT_OK ? 0 : dt_tool_fail(s);
}
