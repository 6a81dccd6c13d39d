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
dt_status layer_linear_forward(const dt_ops *o, float *y, const float *x, const float *w, const float *b,
                               int rows, int in, int out, int relu);
dt_status layer_linear_backward(const dt_ops *o, float *dx, float *dw, float *db, const float *dy, const float *x,
                                const float *w, int rows, int in, int out);

#endif /* DT_LAYERS_H */
