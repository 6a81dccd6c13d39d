/*
 * lowp.h: mixed precision inside a model (not installed) — the rounded weight copies,
 * the scratch for rounded activations, and the helpers the layer rows call.
 *
 * With --precision bf16 or fp16 (model.h dt_model_set_precision) a model runs
 * torch.autocast's split: the inputs of every matrix multiplication and convolution
 * (activations and weights in forward; output gradients, saved inputs and weights in
 * backward) are rounded to the 16-bit type and multiplied with f32 accumulation
 * (ops.h gemm_lp); softmax, normalisation, losses, reductions, the master weights,
 * gradients and optimizer state stay f32. The weights of GEMM rows (nn.h DT_LDEF_GEMM)
 * are rounded once into a copy that lives beside the parameters and is made again at
 * the first forward after the parameters may have changed; a layer that reads its
 * parameters through a view (model.h dt_model_set_param_view: sharding's pool) has them
 * rounded there, in place, when they arrive (dt_lowp_round_layer). Activations are
 * rounded into two scratch buffers per model.
 *
 * Where this differs from PyTorch: autocast's GEMM OUTPUTS are bf16/f16 tensors; here
 * they stay f32 (one rounding fewer per layer), and the biases are added in f32. The
 * attention kernel rounds its inputs (q, k, v), output and output gradient, but its
 * probabilities P enter P V in f32.
 */
#ifndef DT_LOWP_H
#define DT_LOWP_H

#include <stddef.h>

#include "dtype.h"
#include "model.h"
#include "nn.h"

typedef struct dt_lowp dt_lowp;

/* The low-precision state of a model of spec with up to max_batch samples: dtype is
 * DT_BF16 or DT_F16 (DT_ERR_INVALID otherwise). */
dt_status dt_lowp_init(const dt_ops *ops, const dt_spec *spec, int max_batch, dt_dtype dtype, dt_lowp **out);
void      dt_lowp_free(const dt_ops *ops, dt_lowp *lp);                /* NULL is fine */
dt_dtype  dt_lowp_dtype(const dt_lowp *lp);                            /* DT_F32 for NULL */
/* The rounded copy of the parameter array (NULL until a forward made it, or for NULL). */
const float *dt_lowp_weights(const dt_lowp *lp);
/* The parameters may have changed: the rounded weights are made again before the next
 * forward (NULL is fine). */
void      dt_lowp_stale(dt_lowp *lp);
/* A pipeline's stage: the copy, once made, holds (and counts) only what is rounded into
 * it, and dt_lowp_keep gives back what lies outside [lo, hi) (parameter offsets). Before
 * the copy is made (no effect after); dt_lowp_keep does nothing without it. */
void      dt_lowp_partial(dt_lowp *lp);
dt_status dt_lowp_keep(dt_lowp *lp, const dt_ops *ops, size_t lo, size_t hi);
/* Before a forward that reads the parameter array: round the GEMM weights of params in
 * [lo, hi) (what is resident: the rest is rounded as it arrives) into the copy if it is
 * stale (the copy is made at its first use). */
dt_status dt_lowp_prepare(dt_lowp *lp, const dt_ops *ops, const float *params, size_t lo, size_t hi);
/* Layer L's parameters [lo, hi) (offsets into the parameter array) were just written
 * (sharding gathered them): round its GEMM weights there from src + offset to
 * dst + offset; dst NULL is the copy, dst == src rounds a view in place. Only L's own
 * tensors are rounded: a range another layer reads too (a tied embedding) is left. */
dt_status dt_lowp_round_layer(dt_lowp *lp, const dt_ops *ops, const dt_layer *L, const float *src, float *dst,
                              size_t lo, size_t hi);
/* Fill the lp fields of a pass's context (lp NULL: f32). */
void      dt_lowp_ctx(const dt_lowp *lp, dt_nn_ctx *c);
/* Device bytes held: the weight copy (once made) and the scratch. */
size_t    dt_lowp_bytes(const dt_lowp *lp);
/* For dtrain plan, with gemm_rounds as dt_ops_gemm_lp_rounds says for the device: the
 * floats of each scratch buffer for spec at max_batch, how many buffers (1 or 2), and
 * whether the weight copy is made (1) or not (0). */
size_t    dt_lowp_scratch_floats(const dt_spec *spec, int max_batch, int gemm_rounds);
int       dt_lowp_scratch_count(const dt_spec *spec, int gemm_rounds);
int       dt_lowp_copies_weights(const dt_spec *spec, int gemm_rounds);
/* ... and the floats of [lo, hi) that a partial copy holds once it rounded that range:
 * the GEMM rows' 2-d weights there, a tied one once. */
size_t    dt_lowp_copy_floats(const dt_spec *spec, size_t lo, size_t hi);

#endif /* DT_LOWP_H */
