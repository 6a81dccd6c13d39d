/*
 * layers.h: private helpers shared by the layer rows (src/layers*.c) and the
 * driver (src/nn.c). Not installed.
 */
#ifndef DT_LAYERS_H
#define DT_LAYERS_H

#include "nn.h"

/* Every row, declared from the kind list. */
#define DT_LAYER_EXTERN_(K, name) extern const dt_layer_def dt_layer_def_##name;
DT_LAYER_LIST(DT_LAYER_EXTERN_)
#undef DT_LAYER_EXTERN_

/* The kind's own struct of L. */
#define LAYER_SELF(type, L) ((type *)(L)->self)

/* Spatial size of a (C, H, W) shape, 1 for (F). */
static inline int layer_hw(const dt_shape *s) { return s->ndim == 3 ? (int)(s->d[1] * s->d[2]) : 1; }

/* "model spec: layer 3.1 'conv(8,3)': <what>, but its input is (B, 784)<hint>" */
dt_status layer_shape_error(const dt_layer *L, const char *what, const char *hint);
/* infer for rows whose output shape is their input shape */
dt_status layer_same_shape(dt_layer *L, dt_shape *out);
/* forward of a NO_OUTPUT row that computes nothing: its output is its input */
dt_status layer_view_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B);

/* Parameter t of L drawn from normal(0, std), its stream the parameter's index. */
dt_status layer_init_normal(const dt_nn_ctx *c, dt_layer *L, int t, float std);
/* A linear map over rows: y (rows, out) = x (rows, in) W^T + b (b may be NULL; relu
 * fused when asked), and its backward (dx, dw, db may be NULL to skip them). */
dt_status layer_linear_forward(const dt_nn_ctx *c, float *y, const float *x, const float *w, const float *b,
                               int rows, int in, int out, int relu);
dt_status layer_linear_backward(const dt_nn_ctx *c, float *dx, float *dw, float *db, const float *dy, const float *x,
                                const float *w, int rows, int in, int out);
/* The same with dy taken as it is: in low precision the caller rounded it in place
 * (layer_lp_round), as a row does with its own gradient buffers wider than the scratch. */
dt_status layer_linear_backward_rounded(const dt_nn_ctx *c, float *dx, float *dw, float *db, const float *dy,
                                        const float *x, const float *w, int rows, int in, int out);

/* Mixed precision (src/lowp.c; every helper is a no-op or plain f32 when c->lp is 0):
 *   layer_lp_operand  *x (n floats) becomes its rounding in scratch buffer slot (0, 1)
 *   layer_lp_round    buf (n) rounded in place (a row's own buffers)
 *   layer_lp_weight   the rounded copy of parameter pointer w (w itself in f32)
 *   layer_lp_gemm_operand, layer_lp_gemm_weight: the same for an operand that only a
 *                     matrix product reads: left as it is where gemm_lp rounds it
 *   layer_gemm        C = op(A) op(B): gemm_lp on rounded operands, else sgemm */
dt_status    layer_lp_operand(const dt_nn_ctx *c, int slot, const float **x, size_t n);
dt_status    layer_lp_gemm_operand(const dt_nn_ctx *c, int slot, const float **x, size_t n);
dt_status    layer_lp_round(const dt_nn_ctx *c, float *buf, size_t n);
const float *layer_lp_weight(const dt_nn_ctx *c, const float *w);
const float *layer_lp_gemm_weight(const dt_nn_ctx *c, const float *w);
dt_status    layer_gemm(const dt_nn_ctx *c, int transA, int transB, int M, int N, int K, const float *A, int lda,
                        const float *B, int ldb, float *C, int ldc);

#endif /* DT_LAYERS_H */
