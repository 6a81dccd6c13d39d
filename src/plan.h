/*
 * plan.h: how much memory one rank of a training run will hold, before running it
 * (dtrain plan), for every sharding mode and precision.
 *
 * The model's part comes from the model's own layout code (dt_model_plan_memory:
 * the buffers dt_model_build_ex would allocate, activations included, with or
 * without recomputation), the optimizer's from its row (dt_optim_nstate_of), the
 * gradient accumulation tree from DDP (dt_ddp_tree_floats) and the trainer's
 * batch buffers from dt_train_batch_size: the same code the run allocates with,
 * so for what runs today (--shard none, fp32) the estimate is the accounted peak
 * (mem.h) up to small transients.
 *
 * Sharding and precision enter through two tables of rows in plan.c, one formula
 * reading both; a row states what a mode keeps on a rank (what the ZeRO stages and
 * mixed precision are specified to keep), so the rows can be adjusted to the code
 * when it lands:
 *   shard none    everything whole on every rank
 *   shard optim   optimizer state of P/W parameters
 *   shard grads   also P/W of the gradient, plus one gradient bucket of communication buffer
 *   shard params  also P/W of the parameters, plus the gathered parameters of two units
 *                 (the current and the prefetched: an outermost residual block, or a
 *                 layer outside blocks); with the CPU's pool, its slots as shard.c
 *                 makes them (pool_slots in plan.c)
 *   fp32          4-byte weights, gradients, optimizer state and activations
 *   bf16, fp16    fp32 master weights and optimizer state plus a 2-byte rounded copy of
 *                 the weights (gathered in 2 bytes when sharded); gradients and
 *                 activations as fp32
 * The accumulation tree (k > 1 micro-batches per rank) as DDP keeps it: in place, but
 * copied under sharded parameters (ddp.h dt_ddp_tree_floats).
 *
 * A pipeline (--pipeline P: W / P replicas x P stages, train_pipe.c) is planned stage by
 * stage, from the trainer's own cut (pipeline.h dt_pp_cut_spec) and its schedule's lists:
 * a stage's rank holds its range's parameters and gradients (padded to whole shards when
 * sharded over its replicas), the tied tensors it reads or relays, its range's
 * accumulation tree, its optimizer state (sharded over the replicas), the activations of
 * the micro-batches its list keeps in flight (dt_pp_held; with --recompute the model's
 * buffers as they are, its arena shared), its boundary tensors, the step's batch and the
 * chunks of the norm that the stages' edges cut. Evaluation and the end of the run gather
 * every stage's parameters onto every rank and take every layer's buffers again, and the
 * start holds every layer's buffers beside the stage's activation sets for a moment: the
 * total is the most of those moments, each category its own peak.
 */
#ifndef DT_PLAN_H
#define DT_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "mem.h"
#include "model.h"
#include "status.h"
#include "train.h"

/* A sharding mode's row: what it divides by the world size and what it adds. */
typedef struct {
    const char *name;            /* --shard NAME */
    int params_sharded;          /* parameters (and their rounded copies): P/W */
    int grads_sharded;           /* gradients: P/W */
    int optim_sharded;           /* optimizer state: P/W */
    int gather_units;            /* whole units of parameters gathered at once */
    int grad_units;              /* whole units of gradient beyond the shard (being summed) */
    int grad_bucket;             /* one gradient bucket of communication buffer */
    const char *help;
} dt_plan_shard;

/* A precision's row: bytes per parameter (or activation) of each kind. */
typedef struct {
    const char *name;            /* --precision NAME */
    int    master_bytes;         /* weights the optimizer updates (fp32) */
    int    copy_bytes;           /* rounded copy the matrix products read (0: none) */
    int    grad_bytes;
    int    state_bytes;          /* per optimizer state array */
    int    gather_bytes;         /* a gathered parameter (shard params) */
    double act_factor;           /* activations relative to fp32 */
    int    lp;                   /* the dtype of gemm_lp (DT_BF16, DT_F16), 0 for fp32 */
    const char *help;
} dt_plan_precision;

/* The rows, in order of memory saved (shards) and of precision. */
const dt_plan_shard     *dt_plan_shards(int *n);
const dt_plan_precision *dt_plan_precisions(int *n);
const dt_plan_shard     *dt_plan_shard_find(const char *name);       /* NULL: none of that name */
const dt_plan_precision *dt_plan_precision_find(const char *name);

/* What is planned: the trainer's options (model, batch, micro_batches, optim and its
 * hyper-parameters, recompute, bucket_mb, eval, sync_bn) on `world` ranks, for samples
 * of shape `input` with `labels` labels each (token windows: T). */
typedef struct {
    const dt_train_opts *train;
    int                  world;
    dt_shape             input;
    int64_t              labels;
    const dt_ops        *ops;    /* the device planned for: where its gemm_lp rounds operands
                                  * itself (dt_ops_gemm_lp_rounds), mixed precision keeps no
                                  * rounded weights; NULL: a device whose gemm_lp does not */
} dt_plan_opts;

/* One rank's estimate. */
typedef struct {
    size_t  bytes[DT_MEM_NCAT];  /* by category, at peak */
    size_t  shared;              /* bytes in two categories' peaks, held once: the CPU pool's
                                  * slots (--shard params), params while free and grads while
                                  * a unit's gradient is written in them */
    size_t  total;               /* the categories less `shared` */
    int64_t nparams;
    int64_t micro_batches, local_micro, micro_size;   /* S, k = S/W, b = B/S */
    dt_model_mem model;          /* the model's part (its activations at micro-batch b) */
    /* a pipeline (stages > 1): this estimate is stage `stage`'s rank */
    int     stages, stage, replicas, chunks;   /* chunks: a stage's (--virtual-stages) */
    int     by_params;           /* the cut balances the parameters (--stages params, or auto
                                  * under --max-memory: dt_plan_stages) */
    char    modules[48];         /* its top-level modules, "A-B", a run a chunk: "0-2,6-8" */
    int64_t stage_params;        /* its parameters */
    double  work, most_work;     /* its share of the model's planned work (its chunks'), and the
                                  * largest stage's (the step's pace; 1/P when balanced) */
    int     in_flight, inputs;   /* micro-batches whose activations it keeps, whose inputs it holds */
    int64_t pipe_sends;          /* floats it sends its neighbouring stages per step: its outputs
                                  * forward, its inputs' gradients back */
    size_t  step_total;          /* the training step's total (total: the most of every moment) */
} dt_plan_estimate;

/* The estimate for one shard mode and precision; DT_ERR_INVALID names the option
 * (micro_batches, batch, optim, model) that cannot be run on world ranks. With a
 * pipeline, the rank that needs the most (the largest stage), or with the trainer's
 * refusal (dt_train_pipe_check, the cut: DT_ERR_INVALID or DT_ERR_UNSUPPORTED). */
dt_status dt_plan_run(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                      dt_plan_estimate *out);
/* The same, and with a pipeline every stage's estimate into stages[0 .. --pipeline) too
 * (stages may be NULL; without a pipeline it is left alone). */
dt_status dt_plan_run_all(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                          dt_plan_estimate *out, dt_plan_estimate *stages);
/* The cut a pipeline's run takes (its --stages; *text points into o's options or at a
 * constant): as given, but under --max-memory, --stages auto (which balances the work)
 * takes the parameters' cut ("params") where the work's needs more than the cap on some
 * stage's rank and the parameters' does not. The trainer cuts by it, and the plan of
 * such a run plans that cut. *work and *params (either may be NULL): the largest stage of
 * each cut where they were planned, else 0. */
dt_status dt_plan_stages(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr,
                         const char **text, size_t *work, size_t *params);
/* A pipeline's stage `stage` (0 .. --pipeline - 1): the estimate of its ranks. */
dt_status dt_plan_run_stage(const dt_plan_opts *o, const dt_plan_shard *sh, const dt_plan_precision *pr, int stage,
                            dt_plan_estimate *out);

/* The memory wall: the fewest ranks (world, 2 world, 4 world, ... up to max_world)
 * and then the least sharding (in row order) at precision pr with which a rank
 * needs at most capacity bytes. 1 and *sh_out, *world_out when found, 0 when none
 * does (activations alone too large, or the batch cannot be split further). */
int dt_plan_fit(const dt_plan_opts *o, const dt_plan_precision *pr, size_t capacity, int max_world,
                const dt_plan_shard **sh_out, int *world_out);

#endif /* DT_PLAN_H */
