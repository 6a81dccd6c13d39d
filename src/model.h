/*
 * model.h: the model spec language, shape inference, the parameter registry
 * and the forward/backward pass of a whole model.
 *
 * A model is written as a whitespace-separated layer list, e.g.
 *     conv(32,3,pad=1) bn relu maxpool(2) flatten linear(128) relu linear(10)
 * whose elements may be containers: seq(...) (a nested nn.Sequential) and
 * residual(...) (y = x + f(x), f the nested list), named as PyTorch names
 * nested modules ("3.0.weight"); or a preset name (mlp, cnn, resnet), or
 * "@file" / the path of a file holding the list (lines, '#' comments). Shapes
 * are inferred from the per-sample input shape of the data.
 *
 * Parameters live in one flat contiguous device array in PyTorch parameter
 * order, gradients in a second one of the same layout: DDP buckets and fused
 * optimizer updates are then slices of one array. Each parameter is a named
 * view ("3.weight", shape, offset). BatchNorm running statistics live in a
 * separate buffer array; num_batches_tracked (int64 in PyTorch) is a host
 * counter exposed with dtype I64 so the safetensors writer can emit it.
 */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"     /* dt_dtype */
#include "mem.h"       /* DT_MEM_NCAT */
#include "nn.h"
#include "ops.h"
#include "status.h"

/* ---- spec ---------------------------------------------------------------- */

/* A parsed model, flattened into execution order (a residual block is its
 * opening row, its layers, and its closing row). Shapes and parameter counts are filled by dt_spec_infer. */
typedef struct {
    int       n;
    dt_layer *layers;
    int64_t   nparams;      /* total parameter elements (after dt_spec_infer) */
    int       ntensors;     /* number of parameter tensors */
    size_t    nbuffers;     /* floats of float buffers (running statistics) */
    size_t    nrecord;      /* floats of a batchnorm statistics record (see below) */
} dt_spec;

/* The text of a preset ("mlp", "cnn"), or NULL when name is not one. */
DT_API const char *dt_spec_preset(const char *name);
/* Parse a preset name, "@file", an existing file path, or a layer list. */
DT_API dt_status   dt_spec_parse(const char *spec, dt_spec *out);
/* Infer shapes and parameter counts for a per-sample input shape ((C,H,W) or (F)). */
DT_API dt_status   dt_spec_infer(dt_spec *s, const dt_shape *input);
/* What token data (data.h, tokens:DIR) needs from a token model: the window is the
 * block of its learned positions (pos), the vocabulary its embedding's. DT_ERR_INVALID
 * when the model has no embed or pos layer. */
DT_API dt_status   dt_spec_token_dims(const char *spec, int64_t *window, int *vocab);
/* Release a parsed spec. */
DT_API void        dt_spec_free(dt_spec *s);

/* ---- model --------------------------------------------------------------- */

typedef struct dt_model dt_model;

typedef enum { DT_LOSS_CE, DT_LOSS_MSE } dt_loss_kind;
#define DT_LOSS_COUNT 2

typedef struct {
    dt_loss_kind kind;
    float        label_smoothing;   /* cross-entropy only, 0 = none */
} dt_loss;

/* A loss's row (model.c): its name as --loss spells it and what it asks of the data
 * and the trainer. The kernels it runs are the row's own, inside model.c. */
typedef struct {
    const char   *name;       /* "ce", "mse" */
    unsigned char one_hot;    /* its targets are one-hot rows (B, C) of floats made from the labels;
                               * 0: the int32 labels themselves */
    unsigned char smoothing;  /* takes label smoothing */
    unsigned char windows;    /* scores token windows (a label per position) */
} dt_loss_def;
/* The row of a loss (NULL for an unknown kind). */
DT_API const dt_loss_def *dt_loss_def_of(dt_loss_kind kind);

/* Loss names, as the --loss flag spells them: "ce" (cross-entropy over class labels),
 * "mse" (mean squared error). */
DT_API const char *dt_loss_name (dt_loss_kind kind);                    /* "?" if invalid */
/* DT_ERR_INVALID "loss: expected ce or mse, got 'NAME'" for an unknown name. */
DT_API dt_status   dt_loss_parse(const char *name, dt_loss_kind *kind);

/* Build a model: parse spec, infer shapes for input, allocate parameters,
 * gradients, buffers and activations for up to max_batch samples with ops, and
 * initialise parameters as PyTorch does from (seed, parameter index). */
DT_API dt_status dt_model_build(const char *spec, const dt_shape *input, const dt_ops *ops,
                                uint64_t seed, int max_batch, dt_model **out);

/* Where the flat parameter and gradient arrays live (sharding, shard.h): capacity floats
 * each (0 or below nparams: nparams; the padding is zero), and with keep_hi > keep_lo
 * only the range [keep_lo, keep_hi) stays resident: each tensor's pages outside it are
 * discarded (ops discard) as soon as the tensor is initialised, and the gradients
 * outside it are not touched, so no rank ever holds the whole model. */
typedef struct {
    size_t capacity;
    size_t keep_lo, keep_hi;
} dt_model_layout;

/* How a model holds its memory.
 * recompute (activation checkpointing): the activations inside each outermost
 * residual block are not kept from forward to backward. The layers of every such
 * block share one scratch arena (as large as the largest block needs); a block
 * keeps only its output (the next block's input), and backward runs the block's
 * forward again from its input (kept: the output of the layer before it) just
 * before its layers' backward. Dropout masks are keyed by sample and batchnorm's
 * statistics are recomputed without touching its running buffers, so the weights
 * are bitwise those of a run without recomputation. */
typedef struct {
    int recompute;
    /* DT_BF16 or DT_F16: the precision the model will run in (dt_model_set_precision,
     * which then refuses another), so that outputs that only matrix products read (a
     * norm's before a linear or attention, GELU's before c_proj) are kept in 16 bits for
     * backward, as autocast keeps them: the same bits, half the bytes. DT_F32: f32. */
    dt_dtype act_dtype;
    dt_model_layout layout;   /* where parameters and gradients live (sharding); zero: as usual */
    size_t unit_floats;       /* sharding's units (dt_model_units), for the plan's gathered
                               * units; 0: DT_MODEL_UNIT_FLOATS */
} dt_model_opts;

/* Sharding's units (shard.h, --shard params): runs of consecutive layers, a unit closed
 * as soon as it holds at least unit_floats parameters (a tied name counted where it is
 * read), as FSDP wraps modules. unit (optional, one per layer) receives each layer's
 * unit, *max (optional) the most parameters of one unit; returns the number of units. */
#define DT_MODEL_UNIT_FLOATS ((size_t)1 << 18)   /* 1 MiB of parameters */
DT_API int dt_model_units(const dt_model *m, size_t unit_floats, int *unit, int64_t *max);
/* The same for a spec after dt_spec_infer. */
DT_API int dt_spec_units(const dt_spec *s, size_t unit_floats, int *unit, int64_t *max);

DT_API void      dt_model_opts_default(dt_model_opts *o);   /* everything off */
/* dt_model_build with options (NULL: the defaults). */
DT_API dt_status dt_model_build_ex(const char *spec, const dt_shape *input, const dt_ops *ops, uint64_t seed,
                                   int max_batch, const dt_model_opts *mo, dt_model **out);

/* What a model built with these arguments holds, from the same layout code that
 * dt_model_build_ex allocates with, without allocating anything (dtrain plan). */
typedef struct {
    size_t  bytes[DT_MEM_NCAT];  /* by category (mem.h): params (with buffers), grads, acts, other */
    int64_t nparams;             /* parameter elements (a tied weight once) */
    size_t  nbuffers;            /* floats of buffers (running statistics) */
    size_t  nrecord;             /* floats of one micro-batch's batchnorm record */
    int64_t unit_params_max;     /* the most parameters of one of sharding's units
                                  * (dt_model_units: what --shard params gathers at once) */
    int     nblocks;             /* outermost residual blocks */
    size_t  block_acts;          /* activation bytes of all blocks (their layers' outputs and
                                  * state; with recompute the blocks' outputs and the arena) */
    size_t  arena;               /* recompute: bytes of the shared arena (else 0) */
    size_t  scratch;             /* the layers' shared scratch (nn.h dt_layer_scratch; under
                                  * recompute the blocks' scratch is in the arena instead) */
    size_t  lp_scratch;          /* mixed precision: bytes of its two scratch buffers */
    size_t  lp_scratch_rounding; /* ... the same where gemm_lp rounds its operands itself
                                  * (ops.h dt_ops_gemm_lp_rounds): no copy of the weights then */
    int     lp_copy_rounding;    /* ... unless a row rounds for another op: 1 (copy and
                                  * both buffers, as lp_scratch) */
} dt_model_mem;

DT_API dt_status dt_model_plan_memory(const char *spec, const dt_shape *input, int max_batch,
                                      const dt_model_opts *mo, dt_model_mem *out);
/* The activations of n runs of whole modules, run r layers [bounds[r], bounds[r + 1]),
 * in a model built with these arguments (a pipeline's stages): own[r] the bytes of the
 * run's own buffers (what dt_model_acts_only keeps, dt_model_acts_all takes again),
 * set[r] one of its activation sets (dt_model_act_sets). Both 0 with recomputation
 * (the layers share the arena, and nothing is given back). */
DT_API dt_status dt_model_plan_ranges(const char *spec, const dt_shape *input, int max_batch, const dt_model_opts *mo,
                                      int n, const int *bounds, size_t *own, size_t *set);
/* Incremental decoding (sampling): a token model built for one position (input (1))
 * runs position pos of a sequence per forward, attention reading its cache of the
 * positions before; pos 0 starts a new sequence. pos < 0 turns it off. */
DT_API void      dt_model_set_decode(dt_model *m, int pos);
/* Release everything the model holds (NULL is fine). */
DT_API void      dt_model_free(dt_model *m);

/* Mixed precision, torch.autocast's split (src/lowp.h): DT_BF16 or DT_F16 rounds the
 * inputs of every matrix multiplication and convolution (activations and weights; in
 * backward the output gradients too) to that type and multiplies them with f32
 * accumulation; softmax, normalisation, losses and reductions, the parameters and their
 * gradients stay f32. DT_F32 (the default) turns it off. Low precision keeps a rounded
 * copy of the GEMM weights (nparams floats, made at the first forward; not with
 * dt_model_set_views_only) and two activation-sized scratch buffers. */
DT_API dt_status dt_model_set_precision(dt_model *m, dt_dtype precision);
DT_API dt_dtype  dt_model_precision(const dt_model *m);
/* Device bytes the precision setting holds beyond f32 training (0 in f32). */
DT_API size_t    dt_model_precision_bytes(const dt_model *m);
/* Backward starts from the gradient of loss x scale (fp16 loss scaling; 1 = none, the
 * default): every gradient comes out multiplied by it. */
DT_API void      dt_model_set_loss_scale(dt_model *m, float scale);
/* The rounded weights of mixed precision are made again at the next forward whenever
 * the parameters may have been written: taking dt_model_params() or a state tensor
 * (dt_model_state, _param, _state_find) says so. Code that writes through a pointer it
 * kept from earlier calls this after writing. */
DT_API void      dt_model_params_changed(dt_model *m);
/* The parameters [lo, hi) of layer `layer` were just written in the middle of a pass
 * (sharding gathers them layer by layer), where the layer reads them (its view, below):
 * their derived copies are made now (the rounded weights: in the flat array's copy, or
 * in the view itself, in place). */
DT_API dt_status dt_model_params_arrived(dt_model *m, int layer, size_t lo, size_t hi);
/* Layer `layer` reads its parameters from base + offset instead of the flat array (NULL:
 * the flat array again): sharding's gathered copy of its unit. Only passes read views;
 * dt_model_params() and the state registry still address the flat array. In mixed
 * precision the view's GEMM weights are rounded in place (dt_model_params_arrived). */
DT_API dt_status dt_model_set_param_view(dt_model *m, int layer, float *base);
/* 1: every layer with parameters reads them through a view while a pass runs (set
 * before the layer runs: sharding's pool), so mixed precision makes no rounded copy of
 * the flat array; 0 (the default): layers without a view read the flat array. */
DT_API void      dt_model_set_views_only(dt_model *m, int on);
/* The parameters [lo, hi) of the flat array are resident (the rest given back:
 * sharding; a model built with a kept range starts with that, otherwise the whole): a
 * forward rounds those for mixed precision, and the others as they arrive. */
DT_API void      dt_model_set_resident(dt_model *m, size_t lo, size_t hi);
/* Mixed precision's rounded weight copy (lowp.h) for a pipeline's stage: it holds only
 * the ranges rounded into it (the resident range's GEMM weights, a tied weight the stage
 * reads: dt_model_params_arrived); dt_model_precision_keep gives back what lies outside
 * [lo, hi) after the stage held the whole model (before a call of
 * dt_model_set_precision, or before its first forward). */
DT_API void      dt_model_precision_partial(dt_model *m);
DT_API dt_status dt_model_precision_keep(dt_model *m, size_t lo, size_t hi);
/* Layer `layer`'s backward writes its parameter gradients at base + offset instead of
 * the flat gradient array (NULL: the flat array again). */
DT_API dt_status dt_model_set_grad_view(dt_model *m, int layer, float *base);
/* Where the layer whose backward ran last wrote its gradients (base + offset): its view
 * or the flat array; the gradient hook reads them there. */
DT_API float    *dt_model_grads_written(const dt_model *m);

DT_API int             dt_model_nlayers(const dt_model *m);
DT_API const dt_layer *dt_model_layer(const dt_model *m, int i);
DT_API const dt_shape *dt_model_output_shape(const dt_model *m);
DT_API int             dt_model_max_batch(const dt_model *m);
DT_API const dt_ops   *dt_model_ops(const dt_model *m);

/* Flat device arrays: parameters and gradients (nparams floats each, same
 * layout), float buffers (running_mean/var, nbuffers floats). */
DT_API size_t dt_model_nparams(const dt_model *m);
DT_API float *dt_model_params(dt_model *m);
DT_API float *dt_model_grads(dt_model *m);
DT_API size_t dt_model_nbuffers(const dt_model *m);
/* Grow the parameter and gradient arrays to hold `floats` (>= nparams) floats, the
 * parameters kept and the padding zero (sharding pads them to equal shards); pointers
 * taken before are invalid. nparams is unchanged. */
DT_API dt_status dt_model_reserve(dt_model *m, size_t floats);
DT_API float *dt_model_buffers(dt_model *m);

/* One named tensor of the model's state, in PyTorch state_dict order. */
typedef struct {
    const char *name;       /* "0.weight", "1.running_mean", "1.num_batches_tracked" */
    int         ndim;       /* 0 for the num_batches_tracked scalar */
    int64_t     shape[4];
    int64_t     numel;
    dt_dtype    dtype;      /* DT_F32, or DT_I64 for num_batches_tracked */
    int         is_param;   /* 1: parameter (has a gradient); 0: buffer */
    int         in_params;  /* 1: the data lives in the parameter array (a parameter, or a
                             * tied name of one) */
    int         param_index;/* index among parameters (is_param), else -1 */
    int         on_host;    /* 1 for num_batches_tracked (host int64), 0 device */
    void       *data;       /* device float* view, or host int64_t* */
    float      *grad;       /* device gradient view (params), else NULL */
    size_t      offset;     /* floats into params/grads (param) or buffers (buffer) */
} dt_tensor_info;

/* Number of parameter tensors, and the i-th one (model.parameters() order). */
DT_API int       dt_model_nparam_tensors(const dt_model *m);
DT_API dt_status dt_model_param(dt_model *m, int i, dt_tensor_info *info);
/* Number of state tensors (parameters and buffers), and the i-th (state_dict order). */
DT_API int       dt_model_nstate(const dt_model *m);
DT_API dt_status dt_model_state(dt_model *m, int i, dt_tensor_info *info);
/* Find a state tensor by name; DT_ERR_INVALID if absent. */
DT_API dt_status dt_model_state_find(dt_model *m, const char *name, dt_tensor_info *info);

/* Hooks (see the typedefs above). */
DT_API void dt_model_set_bn_sync(dt_model *m, dt_bn_sync_fn fn, void *ctx);
DT_API void dt_model_set_grad_ready(dt_model *m, dt_grad_ready_fn fn, void *ctx);
DT_API void dt_model_set_layer_hook(dt_model *m, dt_layer_hook_fn fn, void *ctx);

/* Deferred batchnorm running statistics, for world-size invariance. A rank
 * that runs only its own micro-batches would otherwise update the running
 * buffers with a subset of them. With a record set, each train forward writes
 * its batchnorm statistics (per bn layer [sum(C) | sumsq(C)]) into record
 * (device memory of dt_model_bn_record_size floats) instead of updating the
 * buffers; the trainer gathers the records of all micro-batches and replays
 * them in global micro-batch order on every rank, which gives the buffers (and
 * num_batches_tracked) of a single process bit for bit. A replay takes the
 * values per channel from the model's last train forward: every record must
 * come from a micro-batch of that size. */
DT_API size_t    dt_model_bn_record_size(const dt_model *m);     /* 0 when the model has no bn */
DT_API void      dt_model_set_bn_record(dt_model *m, float *record);  /* NULL: update in place (default) */
DT_API dt_status dt_model_bn_replay(dt_model *m, const float *record);

/* Forward pass over x (B, input shape), device memory, B <= max_batch. train
 * selects batch statistics and dropout; dropout masks are keyed by
 * (seed, epoch, sample_base + i) for sample i of the batch. *out (optional)
 * receives the device output (B, output shape), valid until the next forward.
 * x must stay unchanged until the backward of this forward. */
DT_API dt_status dt_model_forward(dt_model *m, const float *x, int B, int train,
                                  uint64_t epoch, int64_t sample_base, const float **out);
/* The model as a pipeline sees it: a run of top-level modules (a layer, or a whole
 * residual block, never cut inside). Returns their count; cuts (count + 1 ints, may be
 * NULL) receives module k's layers as [cuts[k], cuts[k + 1]). */
DT_API int       dt_model_modules(const dt_model *m, int *cuts);
DT_API int       dt_spec_modules(const dt_spec *s, int *cuts);   /* the same for a parsed spec */
/* Forward over layers [lo, hi) (whole modules) from x, layer lo's input (B, its input
 * shape), device memory, as dt_model_forward over the whole model (which is the range
 * [0, n)); *out receives layer hi - 1's output. x must stay unchanged until the
 * backward of this forward. */
DT_API dt_status dt_model_forward_range(dt_model *m, int lo, int hi, const float *x, int B, int train,
                                        uint64_t epoch, int64_t sample_base, const float **out);
/* Backward over layers [lo, hi) of the last forward (which ran them all), from dy, the
 * gradient of layer hi - 1's output (B, its output shape; a layer whose gradient is
 * computed in place may overwrite it). The parameters' gradients OVERWRITE the grad
 * array's part of those layers, as dt_model_loss_backward's do; dx (may be NULL: not
 * needed) receives the gradient of layer lo's input (B, its input shape). A pipeline
 * stage runs its range from the gradient its successor sends and sends dx back. */
DT_API dt_status dt_model_backward_range(dt_model *m, int lo, int hi, const float *dy, float *dx);

/* Activation sets, for a pipeline stage with several micro-batches in flight: layers
 * [lo, hi) (whole modules) keep n sets of their activations instead of one, and
 * dt_model_act_use(set) selects the set the next forward over the range fills, or the
 * one whose pass the next backward runs (its input, batch and dropout keys restored, as
 * that forward left them). Not with recomputation (DT_ERR_UNSUPPORTED); once per model. */
DT_API dt_status dt_model_act_sets(dt_model *m, int lo, int hi, int n);
DT_API dt_status dt_model_act_use(dt_model *m, int set);

/* A pipeline stage runs layers [lo, hi) only: the others give their activation buffers
 * back (dt_model_acts_only; with recomputation, whose blocks share one arena, nothing
 * goes), and take them again before a pass over the whole model (dt_model_acts_all: an
 * evaluation, the model handed back at the end). A layer without its buffers must not run. */
DT_API dt_status dt_model_acts_only(dt_model *m, int lo, int hi);
DT_API dt_status dt_model_acts_all(dt_model *m);

/* Loss of the last forward and backward through the model. target: int32
 * labels (B) for cross-entropy, float (B, output shape) for MSE, device memory.
 * The loss is sum over the batch of per-sample losses / normaliser (MSE per
 * sample is the mean over features, as PyTorch's mean MSELoss when
 * normaliser = B); the gradient of that value OVERWRITES the grad array.
 * *loss_out (optional) receives it. The last forward's outputs may be gone after it
 * (the loss's gradient takes their place when no backward reads them): read them, or
 * the accuracy (dt_model_correct), before. */
DT_API dt_status dt_model_loss_backward(dt_model *m, const dt_loss *loss, const void *target,
                                        int B, float normaliser, float *loss_out);
/* The same for a pipeline's last stage, whose forward was a range from layer lo: the
 * backward runs down to lo and dx (may be NULL) receives the gradient of lo's input. */
DT_API dt_status dt_model_loss_backward_to(dt_model *m, const dt_loss *loss, const void *target, int B,
                                           float normaliser, float *loss_out, float *dx);
/* The device float that holds the loss of the last dt_model_loss(_backward), valid
 * until the next: a trainer copies it on the device and reads a step's losses once. */
DT_API const float *dt_model_loss_dev(const dt_model *m);
/* Loss only (no backward), e.g. for evaluation; *correct (optional, CE only)
 * receives the number of samples whose argmax equals the label. */
DT_API dt_status dt_model_loss(dt_model *m, const dt_loss *loss, const void *target, int B,
                               float normaliser, float *loss_out, int64_t *correct);
/* The number of samples of the last forward (B of them) whose argmax output equals
 * their label (int32 labels (B), device memory), whatever the loss. */
DT_API dt_status dt_model_correct(dt_model *m, const int32_t *labels, int B, int64_t *correct);

/* Write a torchinfo-like table (layer, output shape, parameter count, totals)
 * into buf (always NUL-terminated); returns the length the full text needs. */
DT_API size_t dt_model_summary(const dt_model *m, char *buf, size_t n);
/* Same for a spec after dt_spec_infer, without building a model. */
DT_API size_t dt_spec_summary(const dt_spec *s, const dt_shape *input, char *buf, size_t n);

#endif /* DT_MODEL_H */
