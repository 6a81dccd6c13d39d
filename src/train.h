/*
 * train.h: the training loop shared by every device and transport.
 *
 * dt_train_run() trains one model with data parallelism over a communicator
 * (NULL or size 1: one process). It is written once against the compute
 * interface (ops.h) and the communication interface (comm.h) and knows neither
 * device nor transport by name (docs/DESIGN.md rule 1).
 *
 * World-size invariance (docs/DESIGN.md rule 2): the global batch B of a step is the
 * same whatever the world size W; it is split into S micro-batches of B/S
 * samples and rank r computes the contiguous block [r*S/W, (r+1)*S/W). Each
 * micro-batch's gradient is the gradient of (sum of its losses) / B, its local
 * micro-batches are summed pairwise (a binary counter), and the all-reduce
 * continues the same binary tree across ranks, so for power-of-two W dividing S
 * the summed gradient, and therefore the weights, are bitwise those of W = 1.
 *
 * The library never prints (docs/DESIGN.md rule 5): progress reaches the caller through an
 * event callback, and the program decides how to show it. A bad option is
 * DT_ERR_INVALID with a message that opens with the field's name
 * ("micro_batches: 3 is not a multiple of the world size 2"); a program that
 * sets the field from a flag shows the flag instead.
 */
#ifndef DT_TRAIN_H
#define DT_TRAIN_H

#include <signal.h>   /* sig_atomic_t */
#include <stdint.h>
#include "comm.h"
#include "data.h"    /* dt_data_opts */
#include "mem.h"     /* dt_mem_stats */
#include "model.h"   /* dt_loss */
#include "optim.h"   /* dt_optim_config */
#include "ops.h"
#include "status.h"

typedef enum {
    DT_EV_START,     /* before the first step: sizes are known */
    DT_EV_STEP,      /* after an optimizer step (every log_every steps and the last one) */
    DT_EV_EPOCH,     /* after an epoch (or the final partial one) and its evaluation */
    DT_EV_RANKS,     /* per-rank figures (rank_stats), after each epoch and every rank_stats_every steps */
    DT_EV_EVAL,      /* a validation pass every eval_every steps: test_loss, test_acc */
    DT_EV_FIRST,     /* after the first step this run took (a resumed run's too): step, elapsed_s */
} dt_train_event_kind;

typedef struct {
    dt_train_event_kind kind;
    int      epoch;            /* 0-based epoch of the event */
    int      epochs;
    int64_t  step;             /* optimizer steps done so far (global count) */
    int64_t  total_steps;      /* steps this run will do */
    int64_t  steps_per_epoch;
    int64_t  step_in_epoch;    /* steps done in this epoch */
    double   loss;             /* STEP: the step's mean loss over the global batch;
                                * EPOCH: mean train loss over the epoch's steps */
    double   lr;               /* learning rate of the last step */
    double   grad_norm;        /* global gradient norm of the last step (before clipping) */
    double   samples_per_s;    /* global samples per second over the epoch so far */
    double   elapsed_s;        /* since the first step */
    double   eta_s;            /* estimated seconds to the end of the run */
    int      evaluated;        /* EPOCH: test_loss / test_acc are valid */
    double   test_loss, test_acc;
    int64_t  nparams;          /* START: parameter count */
    int64_t  train_samples, test_samples;
    const char *note;          /* START: what resume did ("resumed from ..."), else NULL */
    const char *precision;     /* START: "fp32", "bf16" or "fp16" (mixed precision, amp.h) */
    const char *pipeline;      /* START, --pipeline: the stages, their modules and parameters (and
                                * with --schedule-dump each stage's actions), else NULL */
    double   loss_scale;       /* STEP, fp16: the loss scale the step used (0: no loss scaling) */
    int64_t  skipped;          /* STEP, fp16: steps skipped so far for inf/NaN gradients (the last
                                * step was one when the count grew; its grad_norm is then 0) */
    int      world_size, micro_batches;
    int      stages;           /* pipeline stages (--pipeline; 1 without): rank r runs stage r % stages */
    int64_t  tokens_per_sample; /* START: positions per sample with a label each (T of a token
                                 * window; 1 for classification), for tokens/s */
    double   flops_per_token;   /* START, token models: nanoGPT's estimate of the training FLOPs
                                 * per token, 6N + 12 L C T (N without the position table) */
    double   plan_bytes;        /* START: dtrain plan's estimate of a rank's peak accounted memory
                                 * for this run (plan.h; in a pipeline its stage's; 0: not planned) */
    uint64_t batch_hash;       /* STEP: fingerprint of the step's global batch (sample order) */
    double   threads;          /* STEP: rank 0's compute threads per step since the last STEP event,
                                * as the tuner set them (adapt_threads; 0: the count is fixed) */
    /* RANKS: world_size rows of DT_RANK_STATS values: steps, step seconds, data wait,
     * compute, communication wait (seconds since the last report), peak memory (MiB:
     * the device's own count when it keeps one, else the resident set),
     * samples this rank has seen; then from DT_RANK_MEM the accounted bytes now (mem.h:
     * DT_MEM_NCAT categories, then the total) and from DT_RANK_MEM_PEAK their peaks */
    const double *rank_stats;
} dt_train_event;

#define DT_RANK_MEM      7
#define DT_RANK_MEM_PEAK (DT_RANK_MEM + DT_MEM_NCAT + 1)
#define DT_RANK_STATS    (DT_RANK_MEM_PEAK + DT_MEM_NCAT + 1)

typedef void (*dt_train_event_fn)(void *ctx, const dt_train_event *ev);

typedef struct {
    const char *model;          /* spec or preset (model.h); default "cnn" */
    const char *data;           /* data spec (data.h); default the Fashion-MNIST directory */
    int         epochs;         /* default 15 */
    int64_t     max_steps;      /* stop after this many optimizer steps; 0: none */
    int64_t     batch;          /* global batch; default 256 */
    int64_t     micro_batches;  /* S; 0: the world size */
    const char *optim;          /* an optimizer row's name (optim.h): "sgd" (default), "adamw" */
    double      lr;             /* default 0.05 (sgd) */
    double      momentum;       /* sgd; default 0.9 */
    double      dampening;      /* sgd; default 0 */
    int         nesterov;
    double      beta1, beta2;   /* adamw; default 0.9, 0.999 */
    double      eps;            /* adamw; default 1e-8 */
    double      weight_decay;   /* default 5e-4 (sgd), 0.01 (adamw) */
    const char *schedule;       /* "cosine" (default), "constant", "step" */
    int64_t     step_size;      /* step schedule: steps between decays */
    double      gamma;          /* step schedule: decay factor */
    int64_t     warmup;         /* linear warm-up steps; default 0 */
    double      clip;           /* max global gradient norm; 0: no clipping */
    double      label_smoothing; /* cross-entropy only */
    const char *loss;           /* "ce" (default): cross-entropy over the class labels; "mse": mean
                                 * squared error against one-hot targets (the label's output 1, the
                                 * others 0), the mean over all B x outputs elements, as PyTorch's
                                 * nn.MSELoss()(out, one_hot(y, outputs).float()) */
    const char *shard;          /* "none" (default: DDP), "optim" (ZeRO-1: optimizer state sharded),
                                 * "grads" (ZeRO-2: gradients reduce-scattered too) or "params"
                                 * (ZeRO-3: parameters gathered layer by layer); shard.h.
                                 * Same bits as none; checkpoints load in any mode */
    double      shard_unit_mb;  /* shard params: consecutive layers are gathered in units of at
                                 * least this many MiB of parameters (default 1) */
    const char *backward_prefetch; /* shard params: "pre" (default) or "post", shard.h */
    int         pipeline;       /* pipeline stages P (default 1: none); the world is P x data-parallel
                                 * replicas, stage = rank % P (pipeline.h) */
    const char *pipeline_schedule; /* "1f1b" (default), "gpipe" or "interleaved" */
    int         virtual_stages; /* interleaved: chunks per stage V (default 1); the model is cut into
                                 * P x V chunks, stage s running chunks s, s + P, ... */
    const char *stages;         /* "auto" (default: balanced by parameters and activations) or
                                 * "A-B,C-D,...": the top-level modules of each stage */
    int         schedule_dump;  /* print each stage's action list at the start */
    const char *decay;          /* weight decay on "all" parameters (default) or "matrices" only
                                 * (every parameter of 2 or more dimensions, as nanoGPT and llm.c) */
    double      min_lr;         /* cosine schedule: the learning rate it ends at (default 0) */
    int64_t     eval_every;     /* validation every this many steps (0: after each epoch only) */
    int64_t     eval_batches;   /* token data: validation over this many global batches of fixed
                                 * windows (default 20) */
    const char *init_weights;   /* start from the weights of this safetensors file (PyTorch names),
                                 * e.g. trained in PyTorch, or of a sharded checkpoint (its index
                                 * JSON or directory: dt_model_load); a resumed checkpoint takes
                                 * precedence */
    const char *precision;      /* "fp32" (default), "bf16" or "fp16": torch.autocast's split, GEMM and
                                 * convolution inputs rounded, f32 accumulation (model.h
                                 * dt_model_set_precision); fp16 adds dynamic loss scaling with
                                 * GradScaler's rule and defaults (amp.h) */
    const char *grad_dtype;     /* "f32" (default) or "bf16": gradients summed and all-reduced in bf16 */
    const char *normalize;      /* input normalisation: "auto" (default: u8 images get the training
                                 * set's per-channel mean/std after scaling to [0, 1]; float data as
                                 * stored), "standard" (mean/std for every type), "unit" (u8 scaled
                                 * to [0, 1] only), "none" (every value as stored: u8 as 0..255) */
    uint64_t    seed;           /* default 0 */
    double      bucket_mb;      /* gradient bucket size in MiB (default 25; the first bucket 1) */
    int         overlap;        /* launch buckets during backward (default 1) */
    int         adapt_threads;  /* a host device's compute threads follow the cores the process
                                 * gets, between 1 and the count set (default 1; tuner.h) */
    int         sync_bn;        /* batchnorm statistics over all ranks */
    int         recompute;      /* recompute the activations of residual blocks in backward
                                 * instead of keeping them (model.h: dt_model_opts) */
    const char *lr_scale;       /* "none" (default), "linear" or "sqrt": lr x W or x sqrt(W) */
    int         eval;           /* evaluate on the test split after each epoch (default 1) */
    const char *ckpt_dir;       /* write checkpoints here (NULL: none) */
    int64_t     ckpt_every;     /* ... every this many steps (0: only at the end) */
    int         ckpt_keep;      /* keep the newest K checkpoints (0: all); default 3 */
    const char *snapshot_dir;   /* this node's memory (tmpfs) directory for snapshots, shared by
                                 * its ranks (dtrun --nnodes MIN:MAX gives DT_SNAPSHOT_DIR);
                                 * NULL: no snapshots */
    int64_t     snapshot_every; /* with snapshot_dir: keep the state there every this many steps,
                                 * each shard also on another node (0: never; -1, the default:
                                 * ckpt_every, else 50), and resume from the newest state the
                                 * nodes hold together when it is newer than the disk's */
    int64_t     stop_at;        /* end this process's run after global step N (0: never), as an
                                 * interruption would, leaving the schedule of the full run */
    const char *resume;         /* NULL, "auto" (newest in ckpt_dir, if any), a checkpoint
                                 * directory (its newest) or one step-* directory */
    int         resume_override; /* resume although the model, data or hyper-parameters differ
                                 * from the checkpoint's (refused by default, naming each) */
    int         log_every;      /* STEP events every this many steps; default 50 */
    int         rank_stats_every; /* RANKS events every this many steps (0: after each epoch only) */
    const char *trace;          /* write every rank's timeline here (trace.h; rank 0 writes the
                                 * file, NULL: none) */
    const char *trace_steps;    /* "A:B" or "A:": the steps traced (NULL: all) */
    size_t      max_memory;     /* > 0: a cap in bytes on the memory each rank counts (mem.h,
                                 * dt_mem_set_limit), as a device of that size would impose: an
                                 * allocation over it, or a step, evaluation or end whose peak
                                 * went over it, stops the run with DT_ERR_NOMEM saying what was
                                 * held; 0: none (default) */
    dt_train_event_fn on_event;
    void       *event_ctx;
    /* Not an option (no row, like on_event): where the caller says "stop", e.g. from a
     * SIGTERM handler it installed (the library installs none, docs/DESIGN.md rule 5).
     * When non-NULL, at the end of every step the ranks agree (one all-reduce of an int,
     * max) whether *stop_request is non-zero on any of them; if so every rank ends after
     * that same step as stop_at does: checkpointed (with ckpt_dir), res->stopped = 2. */
    const volatile sig_atomic_t *stop_request;
} dt_train_opts;

/* The defaults listed above (the rows of options.h). */
DT_API void dt_train_opts_default(dt_train_opts *o);

typedef struct {
    int64_t steps;
    double  final_loss;        /* mean loss of the last step */
    double  test_loss, test_acc;
    int     evaluated;
    int     stopped;           /* ended early: 1 at opts.stop_at, 2 on opts.stop_request */
    double  seconds;           /* training time, evaluation excluded */
    double  samples_per_s;     /* global training throughput */
    int     norm_channels;     /* the input normalisation applied, per channel: */
    float   norm_mean[64];     /*   x' = (x - norm_mean[c]) / norm_std[c] */
    float   norm_std[64];      /*   (after u8 scaling to [0, 1] unless "none"; 0 and 1
                                *   when no statistics apply) */
    dt_mem_stats mem;          /* this rank's accounted memory at the end, and its peaks
                                * over the run (mem.h) */
    int64_t skipped_steps;     /* fp16: steps the loss scaler skipped (inf/NaN gradients) */
    double  loss_scale;        /* fp16: the loss scale at the end (0: no loss scaling) */
} dt_train_result;

/* Train as the options say, on device `ops`, across `comm` (NULL: one process).
 * On success *model_out (optional) receives the trained model (free it with
 * dt_model_free): the whole model on every rank, except with --shard params on several
 * ranks, where rank 0's is whole and the others hold their shard of the parameters
 * only (as FSDP's rank0_only state dict); *res (optional) the summary. Every rank
 * calls it. */
DT_API dt_status dt_train_run(const dt_train_opts *o, const dt_ops *ops, dt_comm *comm,
                              dt_model **model_out, dt_train_result *res);

/* The options o->data is opened with: the normalisation of o->normalize and, for
 * token data, the window and vocabulary of o->model (its pos block and embed
 * vocabulary). DT_ERR_INVALID naming the field for a bad name or a model that is not a
 * token model. `dtrain check` opens the data as the trainer will. */
DT_API dt_status dt_train_data_opts(const dt_train_opts *o, dt_data_opts *out);

/* The split of a global batch into S micro-batches over `world` ranks: k local
 * micro-batches of b samples each; DT_ERR_INVALID naming micro_batches or batch
 * when S is not a multiple of the world size or does not divide the batch. */
DT_API dt_status dt_train_split(int64_t batch, int64_t S, int world, int64_t *k, int64_t *b);

/* A pipeline (o->pipeline > 1) on `world` ranks with S micro-batches, checked as the
 * trainer checks it at the start: the world a multiple of the stages, no --shard params
 * or --sync-bn, a schedule the trainer runs (not interleaved), at least one micro-batch
 * per stage on each replica. DT_ERR_INVALID or DT_ERR_UNSUPPORTED with the trainer's
 * message; DT_OK without a pipeline. */
DT_API dt_status dt_train_pipe_check(const dt_train_opts *o, int world, int64_t S);

/* The world sizes on which these options give bitwise the same weights, ascending, at
 * most max of them: P x d for every power of two d dividing --micro-batches S with
 * S / d >= P (P the pipeline depth; with --virtual-stages above 1 S / d a multiple of P,
 * as the interleaved schedule needs). An elastic job may move between them. Fails,
 * saying why, where a change of world size cannot keep the result: no --micro-batches
 * (the split then follows the world), --lr-scale linear|sqrt, --sync-bn. */
DT_API dt_status dt_train_exact_worlds(const dt_train_opts *o, int *sizes, int max, int *n);

/* The optimizer configuration the options make (their optimizer row's defaults with
 * the options' hyper-parameters); DT_ERR_INVALID for an unknown optimizer name. */
DT_API dt_status dt_train_optim_config(const dt_train_opts *o, dt_optim_config *out);

/* The bytes of the trainer's device buffers for a batch of n samples of sample_floats
 * values and `labels` labels each (C outputs; mse: one-hot targets too), counted as
 * "other" (mem.h): the step's batch (n = k micro-batches x b) and, while evaluation
 * runs, its batch (n = b). */
typedef struct { size_t x, y, hot; } dt_train_batch_bytes;
DT_API dt_train_batch_bytes dt_train_batch_size(int64_t n, int64_t sample_floats, int64_t labels, int64_t C, int mse);

/* Evaluate a model on the test split of a data spec: mean loss (lf; NULL:
 * cross-entropy) and accuracy (argmax = label, whatever the loss). With comm, the test set is sharded across ranks and the sums all-reduced. */
DT_API dt_status dt_evaluate(dt_model *m, const dt_dataset *test, const dt_loss *lf, dt_comm *comm, double *loss,
                             double *acc);

#endif /* DT_TRAIN_H */
