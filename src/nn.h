/*
 * nn.h: the layers of a dtrain model — one row per kind — and their passes.
 *
 * A layer kind is one row of a table (dt_layer_def) with labelled
 * initialisers: its spec name, its argument schema (which the parser and its
 * error messages read), shape inference (which also declares the parameters
 * and buffers with their PyTorch names and shapes), initialisation, forward
 * and backward. The spec parser, the model builder, the parameter registry and
 * the summary read rows; nothing switches on the kind. A kind's own arguments
 * and state live in its own struct (dt_layer.self), not in dt_layer.
 *
 * Models are trees: seq(...) and residual(...) containers hold layers and are
 * named as nested nn.Sequential modules are ("3.0.weight"). The builder
 * flattens a tree into one list in execution order; a residual block becomes
 * a "residual" row that opens it (its output is its input) and a
 * "residual_end" row that closes it (y = f(x) + x), so forward and backward
 * stay a walk over one list.
 *
 * Shapes here are per sample, without the batch dimension: (C, H, W) for
 * images, (F) for flat features, (T) for token ids and (T, C) for sequences of
 * T positions (linear and layer norm act on the last dimension). Every buffer is device memory obtained from
 * the dt_ops table, and every numeric step goes through that table, so the same
 * code runs on the CPU and the CUDA backend (docs/DESIGN.md rule 1).
 *
 * Adding a layer: one entry in DT_LAYER_LIST below and its row in
 * src/layers*.c (an element-wise one is one line there, over its ops).
 */
#ifndef DT_NN_H
#define DT_NN_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "status.h"

/* The layer kinds: X(ENUM_SUFFIX, row_name). The row of kind DT_LAYER_<K> is
 * the dt_layer_def dt_layer_def_<row_name>. */
#define DT_LAYER_LIST(X)                                                                   \
    X(LINEAR, linear)             /* linear(out[,bias=0])                 (F) -> (out) */   \
    X(CONV, conv)                 /* conv(out,k[,stride][,pad][,bias])  (C,H,W) -> (out,H',W') */ \
    X(MAXPOOL, maxpool)           /* maxpool(k[,stride][,pad]), stride defaults to k */   \
    X(AVGPOOL, avgpool)           /* avgpool(k[,stride][,pad]), count_include_pad as PyTorch */ \
    X(GAP, gap)                   /* global average pool        (C,H,W) -> (C) */          \
    X(BN, bn)                     /* BatchNorm1d on (F), BatchNorm2d on (C,H,W) */         \
    X(LN, ln)                     /* LayerNorm over the last dimension */                  \
    X(RMSNORM, rmsnorm)           /* rmsnorm([eps]): RMSNorm over the last dimension, weight only */ \
    X(RELU, relu)                                                                          \
    X(GELU, gelu)                 /* exact (erf) GELU, PyTorch's default */                \
    X(TANH, tanh)                                                                          \
    X(SILU, silu)                 /* x * sigmoid(x), as nn.SiLU */                         \
    X(SIGMOID, sigmoid)                                                                    \
    X(SWIGLU, swiglu)             /* swiglu(hidden): down(silu(gate(x)) * up(x)), no biases */ \
    X(DROPOUT, dropout)           /* dropout(p), inverted: kept values scaled by 1/(1-p) */ \
    X(FLATTEN, flatten)           /* (C,H,W) -> (C*H*W) */                                 \
    X(EMBED, embed)               /* embed(vocab, dim): token ids (T) -> (T, dim), nn.Embedding */ \
    X(POS, pos)                   /* pos(block): (T, C) + a learned row per position t < block */ \
    X(ATTN, attn)                 /* attn(heads[,kv_heads][,rope]): causal self-attention (T, C) -> (T, C) */ \
    X(UNEMBED, unembed)           /* (T, C) -> (T, vocab) with the embedding's weight (tied head) */ \
    X(RESIDUAL, residual)         /* residual(layers...): opens y = x + f(x) */            \
    X(RESIDUAL_END, residual_end) /* closes it (internal: not written in specs) */

typedef enum {
#define DT_LAYER_ENUM_(K, name) DT_LAYER_##K,
    DT_LAYER_LIST(DT_LAYER_ENUM_)
#undef DT_LAYER_ENUM_
    DT_LAYER_NKINDS
} dt_layer_kind;

/* A per-sample shape: ndim 1 is (F) or (T), 2 is (T, C), 3 is (C, H, W). */
typedef struct {
    int     ndim;
    int64_t d[3];
} dt_shape;

/* Number of elements of a per-sample shape. */
DT_API int64_t     dt_shape_numel(const dt_shape *s);
/* Writes "(B, C, H, W)"-style text (with batch "B" when with_batch) into buf. */
DT_API void        dt_shape_str(const dt_shape *s, int with_batch, char *buf, size_t n);
/* Reads "C,H,W", "T,C" or "F" (1 to 3 sizes in 1..2^31, decimal, comma-separated, as a
 * checkpoint records the input); DT_ERR_FORMAT quoting the text otherwise. */
DT_API dt_status   dt_shape_parse(const char *text, dt_shape *s);

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
/* Called around every layer's forward and backward (a backward's POST after its
 * grad_ready), so sharding (shard.h) can gather the parameters a layer reads just
 * before it runs and drop them after. Recomputation calls RECOMPUTE before a layer's
 * forward runs again in backward, and PREFETCH for the next layer of the block: its
 * parameters are needed soon; RECOMPUTE_POST after it, but for the block's last layer
 * (whose backward comes next). */
typedef enum {
    DT_HOOK_FWD_PRE, DT_HOOK_FWD_POST, DT_HOOK_BWD_PRE, DT_HOOK_BWD_POST, DT_HOOK_RECOMPUTE, DT_HOOK_PREFETCH,
    DT_HOOK_RECOMPUTE_POST
} dt_layer_phase;
typedef dt_status (*dt_layer_hook_fn)(void *ctx, int layer, dt_layer_phase phase);

/* ---- the layer table ------------------------------------------------------ */

typedef struct dt_layer     dt_layer;
typedef struct dt_layer_def dt_layer_def;

/* Where a layer's device memory comes from: the model's driver hands one to each
 * layer, and rows never call ops->alloc themselves. Own buffers are allocated and
 * counted as activations (mem.h) and freed by dt_layer_free; in an arena a layer
 * takes shares of one buffer that other layers share too (the layers of recomputed
 * blocks, model.h); measuring only counts the bytes (dt_model_plan_memory), with the
 * same calls, so a plan and a built model agree. */
#define DT_LAYER_MAX_DEPTH 16  /* containers nest at most this deep */

/* Scratch: memory a row needs only while it runs, shared by every layer of a model.
 * DT_SCRATCH_PASS lives inside one forward or backward call (attention's gradient of
 * its projections' inputs); DT_SCRATCH_BLOCK from a block's closing row's backward to
 * its opening row's (the skip gradient), one lane per nesting depth, because blocks at
 * one depth never run their backward at once. DT_SCRATCH_STAGE0/1 are the f32 outputs
 * of layers that keep theirs in 16 bits (dt_layer.out16), alternating along a chain of
 * them: valid from the layer's forward to the next layer's, and in backward from the
 * driver's widening to the next layer's backward. A model sizes each lane by the layer
 * that takes the most and keeps one buffer for all (dt_layer_scratch); a layer alone
 * (no scratch given) owns its pieces, and so do the layers of recomputed blocks, in the
 * arena that holds one block at a time. */
typedef enum { DT_SCRATCH_PASS, DT_SCRATCH_STAGE0, DT_SCRATCH_STAGE1, DT_SCRATCH_BLOCK } dt_scratch_kind;
#define DT_SCRATCH_LANES (3 + DT_LAYER_MAX_DEPTH)
typedef struct {
    unsigned char *base;                     /* the shared buffer; NULL while measuring */
    size_t         off[DT_SCRATCH_LANES];    /* each lane's offset in it */
    size_t         most[DT_SCRATCH_LANES];   /* the most one layer takes of each lane */
    size_t         used[DT_SCRATCH_LANES];   /* the layer being allocated's so far */
} dt_layer_scratch;

typedef struct {
    const dt_ops  *ops;
    unsigned char *arena;      /* in_arena and not measuring: the arena's memory */
    int            in_arena;   /* 1: shares of an arena, each rounded to DT_LAYER_MEM_ALIGN */
    int            measure;    /* 1: count only; pointers are set to NULL */
    size_t         used;       /* bytes taken so far */
    dt_layer_scratch *scratch; /* the model's scratch, or NULL: scratch is taken as own memory */
} dt_layer_mem;

#define DT_LAYER_MEM_ALIGN 256
#define DT_LAYER_MAX_OWN   8   /* own buffers of one layer (its output and its row's state) */

/* One argument of a layer kind, in positional order. Values are checked
 * against [lo, hi] (hi excluded when hi_open); a bad one gets the message
 * "'<expect>', got '<text>'". */
typedef enum { DT_ARG_INT, DT_ARG_BOOL, DT_ARG_FLOAT } dt_arg_type;
typedef struct {
    const char *name;        /* "out", "k", "p" */
    dt_arg_type type;        /* stored as int (INT, BOOL) or float (FLOAT) */
    size_t      offset;      /* of the field in the kind's own struct */
    int         required;    /* required arguments come first */
    double      def;         /* default when not given */
    double      lo, hi;      /* accepted range */
    int         hi_open;     /* 1: hi itself is refused */
    const char *expect;      /* "'out' expects a positive integer" */
} dt_arg_def;

/* What a parameter or buffer of a layer is. */
typedef enum {
    DT_TENSOR_PARAM,         /* float parameter, has a gradient (model.parameters()) */
    DT_TENSOR_BUFFER,        /* float buffer in the model's buffer array (running_mean) */
    DT_TENSOR_COUNTER,       /* host int64 scalar (num_batches_tracked) */
    DT_TENSOR_TIED           /* another name for an earlier parameter (a tied lm_head.weight):
                              * listed in the state dict, no storage or gradient of its own */
} dt_tensor_role;

#define DT_LAYER_MAX_TENSORS 8
/* Largest element count of one parameter or buffer, and of one sample's
 * activation: kernels take 32-bit counts. */
#define DT_LAYER_MAX_NUMEL  INT64_C(2147483647)

/* A parameter or buffer declared by a row's infer, in state_dict order. */
typedef struct dt_layer_tensor_ {
    const char    *suffix;   /* "weight", "running_var": the name after the module path */
    dt_tensor_role role;
    int            ndim;
    int64_t        shape[4];
    int64_t        numel;
    size_t         offset;   /* floats into params/grads (PARAM, TIED) or buffers (BUFFER) */
    int64_t       *counter;  /* COUNTER: the host value, inside the layer's own struct */
    const struct dt_layer_tensor_ *tie; /* TIED: the parameter it names (set by its row's infer) */
} dt_layer_tensor;

/* Row flags. */
enum {
    DT_LDEF_NO_OUTPUT     = 1 << 0,  /* output is the input memory (no y buffer allocated) */
    DT_LDEF_GRAD_IN_PLACE = 1 << 1,  /* backward leaves dx in dy's memory (dx == dy) */
    DT_LDEF_FUSE_RELU     = 1 << 2,  /* can apply a following relu itself (sets fuse_relu) */
    DT_LDEF_CONTAINER     = 1 << 3,  /* written kind(layers...): its arguments are a layer list */
    DT_LDEF_INTERNAL      = 1 << 4,  /* made by the builder, never written in a spec */
    DT_LDEF_GEMM          = 1 << 5,  /* its weights (tensors of 2+ dimensions, tied ones too) are
                                      * GEMM or convolution operands: rounded in low precision */
    DT_LDEF_LP_OWN        = 1 << 6,  /* in low precision its weights and inputs reach an op other
                                      * than gemm_lp (a convolution): they are rounded for it into
                                      * the weight copy and the scratch, whatever gemm_lp does */
    DT_LDEF_OUT_UNREAD    = 1 << 7,  /* writes its own output buffer and no backward reads it
                                      * (unless a fused relu's does): a residual block ending in
                                      * it adds the skip in place there (dt_layer.out_in_place) */
    DT_LDEF_IN_GEMM       = 1 << 8   /* reads its input only as a matrix product's operand,
                                      * rounded in low precision, in forward and backward: the
                                      * layer before may keep its output in 16 bits (out16) */
};

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
    int              replay_batch; /* a replay: the samples behind each record (> 0), so a layer
                                   * this process did not run (a pipeline's other stage) can
                                   * apply it; 0: the layer's last train forward's */
    float           *replay_scratch[2]; /* a replay's scratch (each at least a layer's output of
                                   * one sample), or NULL: the layer's own (which a pipeline
                                   * stage's other layers have given back) */
    int              recompute;   /* 1: a forward run again during backward (model.h,
                                   * recomputation): it must leave the model's state as the
                                   * first run left it (no running-statistics update) */
    int              decode;      /* incremental decoding (sampling): the model was built for
                                   * one position; pos adds row decode_pos and attn attends over
                                   * its cache of positions 0..decode_pos */
    int              decode_pos;
    /* mixed precision (model.h dt_model_set_precision, src/lowp.h): lp is DT_BF16 or
     * DT_F16 (dtype.h) when GEMM and convolution inputs are rounded to it, 0 (DT_F32)
     * when not; then lp_params is the parameter array with the GEMM weights rounded
     * (same layout as params) and lp_scratch two buffers of lp_scratch_n floats for
     * rounded activations and gradients. lp_gemm_rounds: gemm_lp rounds its operands
     * itself (ops.h dt_ops_gemm_lp_rounds), so a matrix product takes the f32 values and
     * weights as they are (layer_lp_gemm_operand, layer_lp_gemm_weight); lp_params and
     * the scratch are then made only for the rows that round for another op
     * (DT_LDEF_LP_OWN), and NULL without one */
    int              lp;
    int              lp_gemm_rounds;
    const float     *lp_params;
    float           *lp_scratch[2];
    size_t           lp_scratch_n;
    /* backward: where in16 is not NULL, the layer's input x (== in16_of) is kept in 16
     * bits of lp at in16 and x itself was not written (dt_ops_gemm_lp_reads16): a weight
     * gradient reads it with gemm_lp_b16 (layer_linear_backward); DT_LDEF_IN_GEMM says
     * that is the only read */
    const float     *in16_of;
    const uint16_t  *in16;
} dt_nn_ctx;

/* A layer kind. Required: name, help, torch, infer, forward, backward. */
struct dt_layer_def {
    const char       *name;        /* spec name: "linear" */
    const char       *help;        /* spec syntax: "linear(out[, bias=1])" */
    const char       *torch;       /* the PyTorch module: "nn.Linear" */
    unsigned          flags;       /* DT_LDEF_* */
    size_t            self_size;   /* bytes of the kind's own struct (arguments first) */
    const dt_arg_def *args;        /* positional order, ended by a zero entry; NULL: none */
    const dt_layer_def *closer;    /* CONTAINER: the row that ends the block */
    /* after the arguments are read: derived defaults and cross-argument checks */
    dt_status (*check)   (dt_layer *L);
    /* out = the output shape for input L->in; declares tensors (dt_layer_tensor_add) */
    dt_status (*infer)   (dt_layer *L, dt_shape *out);
    /* device state beyond the output y (allocated by the driver unless NO_OUTPUT), each
     * buffer taken with dt_layer_mem_take (the driver frees it); nothing else happens here,
     * so the same call can only measure (the contents start undefined) */
    dt_status (*alloc)   (dt_layer_mem *a, dt_layer *L, int max_batch);
    /* optional: free what the passes themselves allocated (a decoding cache) */
    void      (*free)    (const dt_ops *ops, dt_layer *L);
    /* parameters and buffers as PyTorch initialises them, from (seed, parameter index) */
    dt_status (*init)    (const dt_nn_ctx *c, dt_layer *L);
    /* y = layer(x): x (B, in); the result is left in L->out_ptr (B, outs) */
    dt_status (*forward) (const dt_nn_ctx *c, dt_layer *L, const float *x, int B);
    /* backward of the last forward: dy (B, outs) -> dx (B, in) (NULL: not wanted);
     * parameter gradients are OVERWRITTEN in c->grads */
    dt_status (*backward)(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                          float *dx, int B);
    /* deferred running statistics: apply a record written by a train forward */
    dt_status (*replay)  (const dt_nn_ctx *c, dt_layer *L, const float *rec);
};

/* The row of a kind, and the kind of a spec name (-1 when none). */
DT_API const dt_layer_def *dt_layer_def_of(dt_layer_kind k);
DT_API int                 dt_layer_kind_find(const char *name);
/* The spec name of a layer kind ("linear", "conv", ...). */
DT_API const char         *dt_layer_kind_name(dt_layer_kind k);
/* "linear, conv, ..." : every kind a spec may name, for messages and --help. */
DT_API const char         *dt_layer_kind_list(void);
/* NULL when the row has every required member, else the name of the first missing one. */
DT_API const char         *dt_layer_def_missing(const dt_layer_def *d);

/* One layer of a model: what every kind shares. Filled by dt_spec_parse /
 * dt_spec_infer and the model builder. */
struct dt_layer {
    const dt_layer_def *def;
    dt_layer_kind kind;
    char     text[128];      /* the spec text as written, for messages and the summary (a preset's
                              * longest, a llama attn(...), fits; longer ends in "...") */
    char     name[48];       /* module path: "3", "3.0" (nn.Sequential nesting) */
    int      index;          /* position in the flat layer list (dropout stream) */
    int      depth;          /* container nesting depth, 0 at the top */
    void    *self;           /* the kind's own struct (def->self_size bytes) */

    /* shapes, per sample */
    dt_shape in, outs;
    int64_t  in_numel, out_numel;

    /* parameters and buffers, in state_dict order */
    int             ntensors;
    dt_layer_tensor t[DT_LAYER_MAX_TENSORS];
    int      nparams;        /* PARAM tensors among them */
    int      first_param;    /* index of the first parameter in the model registry */
    size_t   nrecord;        /* floats of this layer's deferred-statistics record (bn) */
    size_t   rec_off;        /* its offset in a record */

    /* device memory, sized for the model's max batch (dt_layer_alloc) */
    float   *y;              /* own output buffer (B, outs); NULL for NO_OUTPUT rows */
    float   *out_ptr;        /* output of the last forward: y, or the input for views */
    int      last_train;     /* mode of the last forward */
    /* relu fusion (set by the model builder): a FUSE_RELU layer followed by relu
     * applies the relu itself (fuse_relu) and the relu passes its input on
     * (relu_fused), saving one pass over the activations; the bits are the same. */
    int      fuse_relu, relu_fused;
    /* set by the model builder on a residual block's closing row when the block's last
     * layer is OUT_UNREAD, not fused with a relu, and not recomputed: y = f(x) + x is
     * written over f(x), so the row keeps no output of its own */
    int      out_in_place;
    /* set by the model builder in low precision when the layer's output is OUT_UNREAD and
     * the next layer (in its top-level module) is IN_GEMM: y16 keeps the output rounded to
     * the 16-bit type for backward, y is f32 scratch (lane DT_SCRATCH_STAGE0 + out16 - 1)
     * that the next layer's forward reads, and its backward reads y16 widened there */
    int      out16;
    uint16_t *y16;
    /* set by the model builder to DT_BF16 or DT_F16 when the model runs in that precision
     * and the layer is not recomputed (0 otherwise): a row may keep saved tensors it
     * rounds to it in 16 bits (dt_keep16) and widen them for its backward (dt_widen16) */
    int      lp16;
    dt_layer *partner;       /* residual / residual_end: the other end of the block */
    void    *own[DT_LAYER_MAX_OWN];   /* buffers allocated for it (freed by dt_layer_free) */
    int      nown;
};

/* Declare a tensor of L (from a row's infer): PARAM/BUFFER get their offsets
 * later from dt_spec_infer; counter is the host int64 of a COUNTER. ndim 0..4. */
DT_API dt_status dt_layer_tensor_add(dt_layer *L, const char *suffix, dt_tensor_role role, int64_t *counter,
                                     int ndim, const int64_t *shape);
/* The device pointer of L's i-th tensor in c's arrays (params or buffers), NULL if absent. */
DT_API float    *dt_layer_tensor_ptr(const dt_nn_ctx *c, const dt_layer *L, int i);
/* The nearest layer of kind k before L in its model's flat list (the layers of a
 * spec are one array in execution order), NULL when none. */
DT_API dt_layer *dt_layer_find_before(dt_layer *L, dt_layer_kind k);
/* The value of a named argument of L (as a double); NAN when the kind has none. */
DT_API double    dt_layer_arg(const dt_layer *L, const char *name);

/* Allocate a layer's output and saved state for max_batch samples / free them. */
DT_API dt_status dt_layer_alloc(const dt_ops *ops, dt_layer *L, int max_batch);
DT_API void      dt_layer_free(const dt_ops *ops, dt_layer *L);
/* The same from allocators (own, arena or measuring): the output y (unless NO_OUTPUT)
 * from y_mem, then the row's state from state_mem (they may be the same). */
DT_API dt_status dt_layer_alloc_in(dt_layer_mem *y_mem, dt_layer_mem *state_mem, dt_layer *L, int max_batch);
/* Take bytes from a for *p (rows call it from their alloc). */
DT_API dt_status dt_layer_mem_take(dt_layer_mem *a, dt_layer *L, void **p, size_t bytes);
/* Take bytes of scratch of the given kind for *p (rows call it from their alloc): from
 * a->scratch's lane (with the layers that take the same lane, the contents undefined at
 * every pass), or as own memory without one. */
DT_API dt_status dt_layer_scratch_take(dt_layer_mem *a, dt_layer *L, dt_scratch_kind kind, void **p, size_t bytes);
/* After measuring every layer into sc (most[] filled): lay the lanes out one after the
 * other in a buffer of the returned bytes; sc->base is set by the caller. */
DT_API size_t    dt_layer_scratch_layout(dt_layer_scratch *sc);
/* f32 values already rounded to t (DT_BF16 or DT_F16) kept in 16 bits, and back: exact. */
DT_API dt_status dt_keep16(const dt_ops *o, int t, uint16_t *dst, const float *src, size_t n);
DT_API dt_status dt_widen16(const dt_ops *o, int t, float *dst, const uint16_t *src, size_t n);
/* Initialise the layer's parameters and buffers as PyTorch's defaults, drawn
 * from (seed, parameter index) with the counter-based generator. */
DT_API dt_status dt_layer_init(const dt_nn_ctx *c, dt_layer *L);
/* Apply the deferred running-statistics update of L from a record written by
 * a train forward (rec points at the record's start); no-op for kinds without. */
DT_API dt_status dt_layer_bn_replay(const dt_nn_ctx *c, dt_layer *L, const float *rec);
/* y = layer(x): x (B, in), result in L->out_ptr (B, outs). */
DT_API dt_status dt_layer_forward(const dt_nn_ctx *c, dt_layer *L, const float *x, int B);
/* Backward of the last forward: dy (B, outs) -> dx (B, in) (dx NULL: skip the
 * input gradient where the layer can; dx == dy only for GRAD_IN_PLACE rows),
 * and the layer's parameter gradients written (overwritten) into c->grads. */
DT_API dt_status dt_layer_backward(const dt_nn_ctx *c, dt_layer *L, const float *x, const float *dy,
                                   float *dx, int B);

#endif /* DT_NN_H */
