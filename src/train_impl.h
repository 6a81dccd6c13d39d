/*
 * train_impl.h: what the trainer's files share; not installed.
 *
 *   train.c        setup, the step and the loop
 *   train_ckpt.c   the checkpoint and resume protocol (driven by options.h's recorded rows)
 *   train_eval.c   loss targets, the device batch, evaluation
 *   train_pipe.c   --pipeline: stages, the schedule's actions, the norm across stages
 *   train_trace.c  --trace: the steps traced, the ranks' clocks, the file
 *   train_snap.c   --snapshot-every: the state kept in node-local memory, a partner's copy
 */
#ifndef DT_TRAIN_IMPL_H
#define DT_TRAIN_IMPL_H

#include "amp.h"
#include "ckpt.h"
#include "data.h"
#include "ddp.h"
#include "model.h"
#include "optim.h"
#include "sampler.h"
#include "shard.h"
#include "train.h"
#include "tuner.h"

/* One run's state, from setup to the end. */
typedef struct trainer {
    const dt_train_opts *o;
    const dt_ops *ops;
    dt_comm *comm;
    int rank, world;
    /* the data-parallel side: dp replicas of the model (each a pipeline of pp stages); this
     * rank is replica dpr's stage `stage`, and dp_comm is its stage's replicas (comm when
     * pp is 1). Data and gradient sums go by dp and dpr; the rest by world and rank */
    int dp, dpr, pp, stage;
    dt_comm *dp_comm;
    struct train_pipe *pipe;         /* train_pipe.c; NULL without --pipeline */
    int64_t trace_lo, trace_hi;      /* --trace: the steps traced, [lo, hi] (1-based; hi 0: to the end) */
    double trace_base, trace_offset; /* rank 0's clock at the start; this rank's clock + offset is rank 0's */
    double trace_err;                /* the offsets' error bound, seconds */
    dt_dataset *train, *test;
    dt_sampler *sampler;
    dt_loader *loader;
    dt_model *model;
    dt_optim *optim;
    dt_schedule sched;
    dt_ddp *ddp;
    dt_shard_mode mode;              /* --shard */
    dt_shard_prefetch prefetch;      /* --backward-prefetch */
    dt_shard *shard;                 /* which part of the parameters this rank's optimizer updates */
    dt_amp *amp;                     /* mixed precision: loss scaler, gradient dtype (amp.h) */
    int64_t S, k, b, first_micro;   /* micro-batches, local micro-batches, micro size, first local */
    int64_t *idx;                    /* this rank's sample indices of one step (k*b) */
    float *dx;                       /* device batch (k*b, sample) */
    int32_t *dy;                     /* device labels (k*b*lw) */
    int64_t lw;                      /* labels per sample: 1, or T for token windows */
    dt_loss lf;                      /* the training loss */
    int C;                           /* model outputs per sample */
    float *hot, *dhot;               /* MSE: one-hot targets (k*b, C), host and device */
    float *losses, *all_losses;      /* k local / S global micro-batch losses */
    float *dlosses;                  /* device: the k local losses, then the step's 3 checks (train_step) */
    float *bnrec;                    /* S batchnorm records of bnrec_n floats, micro-batch order */
    size_t bnrec_n;
    int64_t spe, total;              /* steps per epoch, total steps */
    int64_t queued;                  /* steps submitted to the loader */
    uint64_t hash_term[4];           /* this rank's fingerprint term of queued step g, at g % 4
                                      * (the loader runs at most 2 steps ahead) */
    uint64_t *hash_all;              /* one fingerprint term per rank */
    /* this rank's time split since the last per-rank report, seconds */
    double t_data, t_compute, t_comm, t_step;
    int64_t steps_since;
    dt_tuner *tuner;                 /* the compute thread count (tuner.h); NULL: fixed */
    double threads_sum;              /* threads per step, summed since the last STEP event */
    int64_t threads_steps;
    double *rank_stats;              /* world x DT_RANK_STATS */
    int64_t g0;                      /* first step of this run (> 0 when resumed) */
    dt_ckpt *resume;                 /* the checkpoint to resume from, until restored */
    struct train_snap *snap;         /* train_snap.c; NULL without snapshots */
    char note[1536];                 /* what resume did, for the START event */
    double epoch_loss;               /* sum of step losses of the current epoch */
    int64_t epoch_steps;             /* steps of the current epoch (resumed ones included) */
} trainer;

/* ---- train_eval.c ---- */

/* The loss fits data of lw labels per sample (token windows: a loss over positions). */
dt_status dt_train_loss_check_(const dt_loss *lf, int64_t lw);

/* What a loss compares the outputs (n, C) with, in device memory: the labels (already
 * in dy) for cross-entropy; for MSE one-hot rows (n, C), the label's column 1 and the
 * others 0, written into host memory hot and copied to dhot (both n x C floats). */
dt_status dt_train_loss_target_(const dt_ops *ops, const dt_loss *lf, const int32_t *labels, size_t n, int C,
                                const int32_t *dy, float *hot, float *dhot, const void **target);
/* The device batch of n samples (x, labels) and, for MSE, its one-hot targets on the
 * host and the device, sized by dt_train_batch_size and counted as other. */
dt_status dt_train_batch_alloc_(const dt_ops *ops, const dt_loss *lf, size_t n, int64_t ss, int64_t lw, int C,
                                float **dx, int32_t **dy, float **hot, float **dhot);
/* Validation during training: test loss and accuracy (see train_eval.c). */
dt_status dt_train_validate_(trainer *t, double *loss, double *acc);

/* ---- train_pipe.c: --pipeline (pipeline.h) ---- */

/* pp, dp, dpr and stage from --pipeline and the world (dp_comm = comm). */
dt_status dt_train_pipe_layout_(trainer *t);
/* The pipeline's checks and groups (dp_comm), after setup_world's split of the batch. */
dt_status dt_train_pipe_world_(trainer *t);
/* A stage of the interleaved schedule runs V chunks of the model, each with a model, DDP,
 * sharding, optimizer and mixed precision of its own: dt_train_pipe_use_ makes chunk j's
 * the trainer's (t->model, t->ddp, t->shard, t->optim, t->amp), keeping those it held;
 * chunk 0's are the trainer's between the phases of setup and step that go chunk by
 * chunk. dt_train_pipe_chunks_: V (1 without a pipeline, where use_ does nothing). */
void      dt_train_pipe_use_(trainer *t, int j);
int       dt_train_pipe_chunks_(const trainer *t);
#define DT_TRAIN_MAX_CHUNKS 64   /* --virtual-stages at most */
/* A phase that goes chunk by chunk: the loop's body runs for j = V - 1 down to 0 with chunk
 * j's objects the trainer's, chunk 0's last (so they are the trainer's after it); once,
 * for the whole model or the stage, without chunks. */
#define DT_TRAIN_EACH_CHUNK(t, j) \
    for (int j = dt_train_pipe_chunks_(t) - 1; j >= 0 && (dt_train_pipe_use_((t), j), 1); j--)
/* fp16: the other chunks' loss scalers take chunk 0's state (after its decision over all
 * of the stage's chunks, or a resume); chunk 0's objects are the trainer's after it. */
void      dt_train_pipe_amp_follow_(trainer *t);
/* The stages' cut of the model's spec (before the model is built): each stage's modules,
 * layers and parameters, by `stages` (--stages as plan.h dt_plan_stages resolves it;
 * where that took the parameters' cut for --max-memory, the layout line says so with
 * both cuts' planned peaks, work and params). */
dt_status dt_train_pipe_cut_(trainer *t, const dt_spec *spec, const char *stages, size_t work, size_t params);
/* The parameters the current chunk's model keeps resident: its range, padded to whole shards
 * with --shard optim|grads (the model is built so: dt_model_layout's kept range). */
void      dt_train_pipe_keep_(const trainer *t, size_t *lo, size_t *hi);
/* After the current chunk's model is built: its other layers' activation buffers go back
 * at once (before the next chunk's model is built or this one's activation sets taken). */
dt_status dt_train_pipe_built_(trainer *t);
/* This rank's stage of the built model: the schedule's list (checked for every stage),
 * the boundary buffers, the tied tensors it reads or relays. */
dt_status dt_train_pipe_setup_(trainer *t);
/* The parameters [*lo, *hi) the current chunk owns. */
void      dt_train_pipe_range_(const trainer *t, size_t *lo, size_t *hi);
/* One step's forwards and backwards as this stage's list says (t->dx holds the local
 * batch, target its targets); the last stage's losses into t->dlosses; *wait: the
 * seconds spent sending and receiving boundary tensors (the bubble, and the transfers). */
dt_status dt_train_pipe_run_(trainer *t, uint64_t epoch, int64_t step, const void *target, double *wait);
/* The S micro-batch losses (the last stages') into t->all_losses on every rank. */
dt_status dt_train_pipe_losses_(trainer *t);
/* Every micro-batch's batchnorm record, each layer's part from the stage that ran it, in
 * t->bnrec (S records) on every rank, for the replay in micro-batch order. */
dt_status dt_train_pipe_bn_(trainer *t);
/* After the sharding is set up (its parts decide the norm's): the norm's scratch. */
dt_status dt_train_pipe_norm_setup_(trainer *t);
/* The global gradient norm over the stages (the bits of one process's) and clipping. */
dt_status dt_train_pipe_clip_(trainer *t, float max_norm, float unscale, float *norm);
/* After the optimizer step: parameters a later stage reads (a tied head) from their owner. */
dt_status dt_train_pipe_after_step_(trainer *t);
/* Every stage's parameters to every rank of its pipeline (evaluation, the end), counted. */
dt_status dt_train_pipe_gather_(trainer *t);
/* Back to the kept range (after an evaluation, or a load of the whole array). */
dt_status dt_train_pipe_drop_(trainer *t);
void      dt_train_pipe_free_(trainer *t);
/* The layout (and with --schedule-dump the lists), for the start; NULL without a pipeline. */
const char *dt_train_pipe_text_(const trainer *t);

/* ---- train_ckpt.c ---- */

/* The checkpoint directory can be written (rank 0 prepares it; every rank learns). */
dt_status dt_train_check_ckpt_dir_(trainer *t);
/* Open the checkpoint to resume from (rank 0 chooses; t->resume, or a note that there
 * is none yet), and check its seed, batch and micro-batches. */
dt_status dt_train_resume_open_(trainer *t);
/* Restore model, optimizer and loop position from t->resume, holding the run to the
 * recorded settings; closes it. */
dt_status dt_train_resume_restore_(trainer *t);
/* A checkpoint after step `done` when one is due (or force). */
dt_status dt_train_checkpoint_(trainer *t, int64_t done, int force);
/* What a checkpoint records beside the state (the loop's values, every recorded row);
 * extra points into the struct itself. */
#define DT_TRAIN_META_MAX_ 64
typedef struct {
    dt_ckpt_info info;
    const char  *extra[2 * DT_TRAIN_META_MAX_];
    int          nextra;
    char         text[DT_TRAIN_META_MAX_][48];
    char         loss[64], total[32], shape[128], scaler[96];
} dt_train_meta;
dt_status dt_train_meta_(trainer *t, int64_t done, dt_train_meta *me);
/* Where a state is saved: dir (keeping `keep`), begun and committed by the first rank of
 * group (the ranks sharing dir; NULL: this process alone); copy (NULL: none) runs on every
 * rank once its shard is written into tmp (st: how that went), to put copies elsewhere.
 * reuse: the files of the checkpoint the save prunes are written over (ckpt_impl.h). */
typedef struct {
    const char *dir;
    int         keep, reuse;
    dt_comm    *group;
    dt_status (*copy)(trainer *t, const char *tmp, dt_status st);
} dt_train_place_;
/* The state after step done into pl (sharded where the state is, or pipelined). */
dt_status dt_train_save_(trainer *t, int64_t done, const dt_train_place_ *pl);
/* Rank r's piece (shard file) of its chunk j (0 but for a pipeline's interleaved chunks)
 * in a sharded checkpoint, and the pieces in all (the world's, V a rank with V chunks). */
int       dt_train_piece_(const trainer *t, int r, int j);
int       dt_train_pieces_(const trainer *t);
/* Every rank's status gathered: the first failing rank's into *st and *who (-1: none). */
dt_status dt_train_agree_(trainer *t, int64_t *st, int *who);

/* ---- train_snap.c: --snapshot-every (in-memory snapshots for elastic jobs) ---- */

/* The node groups and the partner of each rank, when snapshots are on (o->snapshot_dir). */
dt_status dt_train_snap_setup_(trainer *t);
/* A snapshot after step done when one is due (or force). */
dt_status dt_train_snapshot_(trainer *t, int64_t done, int force);
/* The newest state the nodes' snapshots hold together, if at least as new as the disk's
 * newest step disk_step (-1: none): assembled on every node and opened as t->resume, its
 * path into path (n bytes), *used 1. */
dt_status dt_train_snap_resume_(trainer *t, int64_t disk_step, char *path, size_t n, int *used);
void      dt_train_snap_free_(trainer *t);

/* ---- train_trace.c ---- */

/* --trace: the steps (--trace-steps) and each rank's clock against rank 0's (collective
 * when distributed: every rank calls it after the communicator is up). */
dt_status dt_train_trace_setup_(trainer *t);
/* Recording on for global step g (0-based) when it is traced, off otherwise. */
void      dt_train_trace_step_(const trainer *t, int64_t g);
/* The end of a run: every rank's records to rank 0, which writes the file (collective). */
dt_status dt_train_trace_write_(trainer *t);

#endif /* DT_TRAIN_IMPL_H */
