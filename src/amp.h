/*
 * amp.h: mixed-precision training above the model — the --precision and --grad-dtype
 * names, the dynamic loss scaler with torch.cuda.amp.GradScaler's rule, the found-inf
 * decision that every rank takes together, and the scaler's checkpoint text.
 *
 * The model side (rounded GEMM inputs) is model.h's dt_model_set_precision. With fp16
 * the trainer multiplies the loss by the scale before backward (dt_model_set_loss_scale),
 * and after the gradient all-reduce asks dt_amp_check whether the step is to be taken:
 * each rank looks for inf/NaN in the gradient it holds, one all-reduce (max) of a 4-byte
 * flag makes the decision common, and the scaler is updated as GradScaler.update() does.
 * A skipped step changes no weight and no optimizer state (the optimizer's step count
 * does not advance either, as when GradScaler skips optimizer.step()); the schedule
 * advances, as a PyTorch loop that calls scheduler.step() every iteration. A taken step
 * unscales through the factor it returns, folded into clipping and the optimizer's
 * grad_scale: multiplying by a power of two is exact, so the bits are those of
 * GradScaler's unscale_ followed by the step.
 */
#ifndef DT_AMP_H
#define DT_AMP_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "dtype.h"
#include "model.h"
#include "ops.h"
#include "status.h"

/* ---- names ------------------------------------------------------------------------------ */

/* --precision: "fp32" (DT_F32), "bf16" (DT_BF16), "fp16" (DT_F16); DT_ERR_INVALID
 * "precision: expected fp32, bf16 or fp16, got 'X'" otherwise. */
DT_API dt_status   dt_precision_parse(const char *name, dt_dtype *out);
DT_API const char *dt_precision_name(dt_dtype p);                   /* "fp32", ...; "?" if not one */
/* --grad-dtype: the all-reduce's type, "f32" or "bf16" (DT_ERR_INVALID naming grad_dtype). */
DT_API dt_status   dt_grad_dtype_parse(const char *name, dt_dtype *out);

/* ---- the loss scaler -------------------------------------------------------------------- */

typedef struct {
    double init_scale;        /* 65536 (2^16) */
    double growth_factor;     /* 2 */
    double backoff_factor;    /* 0.5 */
    int    growth_interval;   /* 2000 steps without inf/NaN */
} dt_scaler_opts;

typedef struct {
    float          scale;           /* f32, as GradScaler's _scale tensor */
    int32_t        growth_tracker;  /* good steps since the last change (int32, as GradScaler's) */
    dt_scaler_opts o;
} dt_scaler;

DT_API void      dt_scaler_opts_default(dt_scaler_opts *o);   /* GradScaler's defaults, above */
DT_API void      dt_scaler_init(dt_scaler *s, const dt_scaler_opts *o);   /* o NULL: the defaults */
/* One GradScaler.update() after a step whose gradients had (found_inf != 0) or had not an
 * inf/NaN, ATen's _amp_update_scale_: found: scale *= backoff, tracker = 0; else
 * tracker + 1, and on reaching the interval scale *= growth (kept when the product
 * overflows f32) and tracker = 0. */
DT_API void      dt_scaler_update(dt_scaler *s, int found_inf);
/* 1 when some rank's grads (n floats, device memory) hold an inf or a NaN: each rank
 * checks its own (ops nonfinite into the device word flag), then one all-reduce (max)
 * over comm (NULL: this process alone). */
DT_API dt_status dt_found_inf(const dt_ops *ops, dt_comm *comm, int32_t *flag, const float *grads, size_t n,
                              int *found);

/* ---- a trainer's mixed-precision state ------------------------------------------------- */

typedef struct dt_amp dt_amp;

/* The settings of a run (names as above; NULL means the default), applied to model m:
 * its precision is set; with fp16 a scaler starts at its initial scale. */
DT_API dt_status dt_amp_init(const char *precision, const char *grad_dtype, dt_model *m, dt_comm *comm,
                             dt_amp **out);
DT_API void      dt_amp_free(dt_amp *a);
/* GradScaler's other settings (init_scale, growth and backoff factors, growth interval):
 * the scaler restarts from them. DT_ERR_INVALID for a state without a scaler (not fp16)
 * or values GradScaler refuses (growth <= 1, backoff outside (0, 1), interval < 1). */
DT_API dt_status dt_amp_set_scaler(dt_amp *a, const dt_scaler_opts *o);
DT_API dt_dtype  dt_amp_precision(const dt_amp *a);
DT_API dt_dtype  dt_amp_grad_dtype(const dt_amp *a);
/* Before a step's backward: the model's loss scale is the scaler's (1 without one). */
DT_API void      dt_amp_begin_step(dt_amp *a);
/* After the gradient all-reduce of global step g (0-based): *skip = 1 when the step must
 * be skipped (fp16, inf/NaN on some rank), *unscale the factor that turns the summed
 * gradient into the true one (1/scale; 1 without a scaler); the scaler is updated.
 * Without a scaler: no collective, *skip = 0, *unscale = 1. */
DT_API dt_status dt_amp_check(dt_amp *a, int64_t g, float *grads, size_t n, int *skip, float *unscale);
/* The same over several parts of the gradient (a pipeline stage's chunks, each a model of
 * its own): parts[i] of n[i] floats, one all-reduce each, one decision and one update. */
DT_API dt_status dt_amp_check_parts(dt_amp *a, int64_t g, float *const *parts, const size_t *n, int nparts, int *skip,
                                    float *unscale);
/* a's scaler becomes from's (the other chunks of a stage follow the first one's decision). */
DT_API void      dt_amp_follow(dt_amp *a, const dt_amp *from);
/* The scale the last checked step used, the scale now (0 without a scaler), and the
 * steps skipped so far. */
DT_API double    dt_amp_step_scale(const dt_amp *a);
DT_API double    dt_amp_scale(const dt_amp *a);
DT_API int64_t   dt_amp_skipped(const dt_amp *a);
/* The scaler for a checkpoint as exact text, "SCALE TRACKER SKIPPED" ("none" without a
 * scaler), and restored from it (NULL or "none": the scaler keeps its initial state; a
 * text that is not one is DT_ERR_FORMAT). */
DT_API void      dt_amp_scaler_text(const dt_amp *a, char *buf, size_t n);
DT_API dt_status dt_amp_restore(dt_amp *a, const char *text);

#endif /* DT_AMP_H */
