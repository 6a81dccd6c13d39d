/*
 * nn.h: the layers of a dtrain model and their forward/backward passes.
 *
 * A model is a flat list of layers with nn.Sequential semantics: layer i gets
 * the output of layer i-1, and its parameters are named "<i>.weight" and
 * "<i>.bias" exactly as PyTorch numbers them (flatten and relu take indices
 * too), so weights move to and from PyTorch by name.
 *
 * Shapes here are per sample, without the batch dimension: (C, H, W) for
 * images, (F) for flat features. Every buffer is device memory obtained from
 * the dt_ops table, and every numeric step goes through that table, so the same
 * code runs on the CPU and the CUDA backend (DESIGN.md rule 1).
 */
#ifndef DT_NN_H
#define DT_NN_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "status.h"

typedef enum {
    DT_LAYER_LINEAR,   /* linear(out[,bias=0])                 (F) -> (out) */
    DT_LAYER_CONV,     /* conv(out,k[,stride=s][,pad=p][,bias=0]) (C,H,W) -> (out,H',W') */
    DT_LAYER_MAXPOOL,  /* maxpool(k[,stride][,pad]), stride defaults to k */
    DT_LAYER_AVGPOOL,  /* avgpool(k[,stride][,pad]), count_include_pad as PyTorch */
    DT_LAYER_GAP,      /* global average pool        (C,H,W) -> (C) */
    DT_LAYER_BN,       /* BatchNorm1d on (F), BatchNorm2d on (C,H,W) */
    DT_LAYER_LN,       /* LayerNorm over the last dimension */
    DT_LAYER_RELU,
    DT_LAYER_GELU,     /* exact (erf) GELU, PyTorch's default */
    DT_LAYER_TANH,
    DT_LAYER_DROPOUT,  /* dropout(p), inverted: kept values scaled by 1/(1-p) */
    DT_LAYER_FLATTEN,  /* (C,H,W) -> (C*H*W) */
    DT_LAYER_NKINDS
} dt_layer_kind;

/* A per-sample shape: ndim 1 is (F), ndim 3 is (C, H, W). */
typedef struct {
    int     ndim;
    int64_t d[3];
} dt_shape;

/* Number of elements of a per-sample shape. */
int64_t     dt_shape_numel(const dt_shape *s);
/* Writes "(B, C, H, W)"-style text (with batch "B" when with_batch) into buf. */
void        dt_shape_str(const dt_shape *s, int with_batch, char *buf, size_t n);
/* The spec name of a layer kind ("linear", "conv", ...). */
const char *dt_layer_kind_name(dt_layer_kind k);

/* Called with per-channel statistics of a train-mode batchnorm so DDP can make
 * them global (synchronised batchnorm). Forward (backward = 0): stats is device
 * memory [sum(C) | sumsq(C)] (n = 2C) over *count values per channel; the hook
 * replaces both by their sums over the process group and *count by the global
 * count. Backward (backward = 1): stats is [sum_dy(C) | sum_dy_xhat(C)], to be
 * summed the same way (*count is the global count, read only). NULL: local. */
typedef dt_status (*dt_bn_sync_fn)(void *ctx, int backward, float *stats, size_t n, int64_t *count);
/* Called during backward as soon as the gradients of parameters
 * [first_param, first_param + nparams) are final (after each layer's backward,
 * in reverse layer order), so DDP can launch buckets while backward goes on. */
typedef dt_status (*dt_grad_ready_fn)(void *ctx, int first_param, int nparams);

/* One layer: its spec arguments, inferred shapes, and where its parameters,
 * buffers and saved state live. Filled by dt_spec_parse / dt_spec_infer and the
 * model builder. */
typedef struct dt_layer {
    dt_layer_kind kind;
    char    text[64];        /* the spec text as written, for messages and the summary */
    int     index;           /* position in the layer list = nn.Sequential index */

    /* arguments */
    int     out;             /* linear: out features; conv: out channels */
    int     k, stride, pad;  /* conv / pools */
    int     bias;            /* linear / conv: has a bias (default 1) */
    float   p;               /* dropout probability */

    /* shapes, per sample */
    dt_shape in, outs;
    int64_t in_numel, out_numel;

    /* parameters: offsets (in floats) into the model's flat parameter/gradient
     * arrays, in PyTorch order (weight then bias). */
    int     nparams;         /* 0, 1 or 2 */
    int     first_param;     /* index of the first parameter in the model registry */
    size_t  w_off, w_numel;  /* weight: linear [out,in], conv [out,in,k,k], bn/ln [C] */
    size_t  b_off, b_numel;  /* bias (b_numel 0 when absent) */
    /* batchnorm buffers: offsets (floats) into the model's buffer array */
    size_t  rm_off, rv_off;  /* running_mean [C], running_var [C] */
    int64_t num_batches_tracked;
    int64_t bn_count;        /* values per channel behind the last train statistics */
    size_t  rec_off;         /* bn: offset (floats) of its [sum|sumsq|count] (2C+2) in a record */

    /* device memory, sized for the model's max batch (dt_layer_alloc) */
    float  *y;               /* own output buffer (B, outs); NULL for flatten */
    float  *out_ptr;         /* output of the last forward: y, or the input for
                              * flatten and for dropout in eval mode */
    float  *save;            /* bn: [mean|invstd|s1|s2|zero] (5C); ln: [mean|rstd] (2 rows) */
    int32_t *idx;            /* maxpool: argmax of each output (B, outs) */
    int     last_train;      /* mode of the last forward */
    /* relu fusion (set by the model builder): a linear, conv or bn followed by relu
     * applies the relu itself (fuse_relu) and the relu layer passes its input on
     * (relu_fused), saving one pass over the activations; the bits are the same. */
    int     fuse_relu, relu_fused;
} dt_layer;

/* Everything a layer pass needs besides the layer itself. */
typedef struct {
    const dt_ops    *ops;
    float           *params, *grads, *buffers;  /* the model's flat device arrays */
    int              train;                      /* batch statistics, dropout on */
    uint64_t         seed;                       /* model seed (dropout key) */
    uint32_t         epoch;
    uint64_t         sample0;                    /* global index of the batch's first sample */
    dt_bn_sync_fn    bn_sync;
    void            *bn_sync_ctx;
    float           *bn_record;   /* non-NULL: train-mode batchnorm writes its statistics
                                   * here instead of updating the running buffers */
} dt_nn_ctx;

/* Allocate a layer's output and saved state for max_batch samples / free them. */
dt_status dt_layer_alloc(const dt_ops *ops, dt_layer *L, int max_batch);
void      dt_layer_free(const dt_ops *ops, dt_layer *L);
/* Initialise the layer's parameters and buffers as PyTorch's defaults, drawn
 * from (seed, parameter index) with the counter-based generator. */
dt_status dt_layer_init(const dt_nn_ctx *c, dt_layer *L);
/* Apply a batchnorm's running-statistics update from a record written by a
 * train forward (rec points at the record's start), as that forward would
 * have; increments num_batches_tracked. No-op for other layers. */
dt_status dt_layer_bn_replay(const dt_nn_ctx *c, dt_layer *L, const float *rec);
/* y = layer(x): x (B, in), result in L->out_ptr (B, outs). */
dt_status dt_layer_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B);
/* Backward of the last forward: dy (B, outs) -> dx (B, in) (dx NULL: skip the
 * input gradient where the layer can; dx may equal dy only for flatten), and
 * the layer's parameter gradients written (overwritten) into c->grads. */
dt_status dt_layer_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                            float *dx, int B);

#endif /* DT_NN_H */
