/*
 * ckpt.h: training checkpoints that lose nothing, for resuming a run.
 *
 * A checkpoint is a directory DIR/step-<12-digit step>/ holding
 *   model.safetensors        the model's state_dict exactly as dt_model_save
 *                            writes it (loads in PyTorch, no wrapper prefix);
 *   train_state.safetensors  the optimizer state arrays ("optim.momentum_buffer",
 *                            "optim.exp_avg", "optim.exp_avg_sq": F32, flat, of
 *                            dt_optim_size elements) and, as metadata strings,
 *                            everything else a resumed run needs: step, epoch,
 *                            step in epoch, seed, global batch, micro-batch count
 *                            S, the writer's world size, the model spec, the
 *                            optimizer (by its row's name, optim.h: "sgd"),
 *                            every hyper-parameter field and the step count,
 *                            the schedule, and the trainer's own key/values.
 * Each file carries "dtrain.checksum" in its metadata: an XXH64 of its tensor
 * data, tensor table and other metadata, verified on load, so a truncated,
 * bit-flipped or edited file is never loaded. train_state also records the
 * model file's checksum, so the two files of a checkpoint belong together.
 *
 * The state is global (nothing per rank): a checkpoint written by W ranks
 * resumes on any other world size.
 *
 * A sharded run (shard.h) writes a sharded checkpoint instead, every rank its part in
 * parallel, so no rank ever holds the whole state:
 *   shard-<r>-of-<W>.safetensors   rank r's range [lo, lo + len) of the flat
 *                            parameters ("params") and of each optimizer state array
 *                            ("optim.<name>"), with its own checksum;
 *   model.safetensors        the buffers only (running statistics, counters);
 *   train_state.safetensors  the manifest: the same metadata, no tensors, and each
 *                            shard's range and checksum ("dtrain.shard.<r>").
 * It resumes on any world size and in any shard mode (dt_ckpt_restore_range reads the
 * pieces a rank needs); `dtrain export` writes the whole model as one file.
 *
 * Writing is atomic (docs/DESIGN.md rule 4): both files go into
 * DIR/.tmp-step-<step>-<pid>/ (each fsynced), that directory is fsynced and
 * renamed to DIR/step-<step>, and DIR is fsynced. A crash at any point leaves
 * the old set of checkpoints or the new complete one, never a half one under a
 * step-* name. Leftover .tmp-step-* and .tmp-del-* directories of dead writers
 * are removed by the next save (a writer is known dead when its pid is not a live
 * process on the saving host). Pruning and replacing delete only directories of
 * exactly those names that hold nothing but a checkpoint's files (ckpt_dir.c).
 */
#ifndef DT_CKPT_H
#define DT_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "optim.h"
#include "status.h"

#define DT_CKPT_FORMAT 1   /* format version written in "dtrain.format" */

/* What a checkpoint says about the run. dt_ckpt_save reads the fields marked
 * "in"; dt_ckpt_open fills all of them (strings then belong to the dt_ckpt). */
typedef struct {
    int64_t     step;           /* in: optimizer steps done (global); names the directory */
    int64_t     epoch;          /* in: 0-based epoch the next step belongs to */
    int64_t     step_in_epoch;  /* in: steps of that epoch already done */
    uint64_t    seed;           /* in */
    int64_t     batch;          /* in: global batch B */
    int64_t     micro_batches;  /* in: S */
    int         world_size;     /* in: W of the writer (resuming on another W is fine) */
    const char *model_spec;     /* in: the spec text given to dt_model_build (NULL: "") */
    const char *schedule;       /* in: learning-rate schedule description (NULL: "") */
    /* filled by dt_ckpt_open (dt_ckpt_save takes them from the optimizer): */
    int             format;       /* DT_CKPT_FORMAT of the writer */
    int             has_optim;    /* 0 when saved without an optimizer */
    dt_optim_config optim;        /* kind and hyper-parameters */
    int64_t         optim_steps;  /* dt_optim_steps at save time */
    int             shards;       /* a sharded checkpoint: the number of shard files; 0: none */
} dt_ckpt_info;

typedef struct dt_ckpt dt_ckpt;  /* an opened, verified checkpoint */

/* ---- writing --------------------------------------------------------------- */

/* Write DIR/step-<info->step> atomically (DIR is created if missing; an
 * existing checkpoint of the same step is replaced, unless it holds files that
 * are not a checkpoint's: DT_ERR_IO), then keep the `keep` newest (0: all) and
 * remove stale .tmp-* directories. o may be NULL (no
 * optimizer state). extra holds nextra pairs {k0, v0, k1, v1, ...} the trainer
 * wants back on resume (e.g. running loss sums). The optimizer's state must
 * live on the model's device (its arrays are copied with the model's ops).
 * Call it on one rank (rank 0): the state is global. */
DT_API dt_status dt_ckpt_save(const char *dir, int keep, dt_model *m, dt_optim *o, const dt_ckpt_info *info,
                              const char *const *extra, int nextra);
/* "DIR/step-000000000100" into path (n bytes); DT_ERR_INVALID if it does not fit. */
DT_API dt_status dt_ckpt_path(const char *dir, int64_t step, char *path, size_t n);

/* A file's checksum as text: "xxh64:" and 16 hex digits, and the terminating zero. */
#define DT_CKPT_SUM_LEN 24

/* A sharded save, in three steps (the trainer runs them across ranks):
 *   begin   one rank: create the temporary directory of dir's checkpoint of step and
 *           put its path in tmp (n bytes), for every rank;
 *   write_shard  every rank r of W: its parameters [lo, lo + len) of m and o's state (o
 *           holds len elements; NULL: none) into tmp; sum receives the file's checksum;
 *   commit  that one rank, once every shard is written: the buffers, the manifest with
 *           the W ranges and checksums (lo, len, sums: W each), the atomic install and
 *           the pruning of dt_ckpt_save; o gives the optimizer's kind and step count.
 * On a failure anywhere, abort removes tmp. */
DT_API dt_status dt_ckpt_begin(const char *dir, int64_t step, char *tmp, size_t n);
DT_API dt_status dt_ckpt_write_shard(const char *tmp, int rank, int world, dt_model *m, dt_optim *o, size_t lo,
                                     size_t len, char sum[DT_CKPT_SUM_LEN]);
DT_API dt_status dt_ckpt_commit(const char *dir, int keep, const char *tmp, dt_model *m, dt_optim *o,
                                const dt_ckpt_info *info, const char *const *extra, int nextra, int world,
                                const size_t *lo, const size_t *len, const char (*sums)[DT_CKPT_SUM_LEN]);
DT_API void      dt_ckpt_abort(const char *tmp);

/* ---- finding ---------------------------------------------------------------- */

/* The newest complete and valid checkpoint of DIR into path (n bytes). Newer
 * ones that fail verification are skipped, one line each ("DIR/step-X: why")
 * into skipped (optional, skipped_n bytes, "" when none). DT_ERR_IO "no
 * checkpoint in DIR" when DIR is missing or holds none; DT_ERR_FORMAT when
 * every one is invalid. */
DT_API dt_status dt_ckpt_latest(const char *dir, char *path, size_t n, char *skipped, size_t skipped_n);
/* Create DIR (and its parents) if needed and check that checkpoints can be
 * written into it, so a bad directory is found before training, not at the
 * first checkpoint. DT_ERR_IO naming the directory otherwise. */
DT_API dt_status dt_ckpt_prepare_dir(const char *dir);

/* ---- reading ---------------------------------------------------------------- */

/* Read both files of the checkpoint directory path into memory and verify them
 * (format, checksums, metadata); nothing is applied yet. */
DT_API dt_status           dt_ckpt_open(const char *path, dt_ckpt **out);
DT_API void                dt_ckpt_close(dt_ckpt *c);                         /* NULL is fine */
DT_API const dt_ckpt_info *dt_ckpt_info_of(const dt_ckpt *c);                  /* valid until close */
DT_API const char         *dt_ckpt_extra(const dt_ckpt *c, const char *key);   /* a trainer value, or NULL */
/* Check the model's tensors (names, shapes, dtypes) and the optimizer (kind,
 * state names and sizes) against the checkpoint, then, only if all of it
 * matches, copy the state in and set the optimizer's step count. o may be
 * NULL (weights only). On a check failure m and o are unchanged; another
 * optimizer is refused naming both ("checkpoint DIR was written by optimizer
 * 'adamw'; this run uses 'sgd'"). */
DT_API dt_status           dt_ckpt_restore(dt_ckpt *c, dt_model *m, dt_optim *o);
/* The same for a part, from a sharded checkpoint or not: the model's buffers, its
 * parameters [plo, phi) (the others are left alone), and o's state as the range
 * [olo, olo + dt_optim_size(o)) of the whole optimizer state (o may be NULL). */
DT_API dt_status           dt_ckpt_restore_range(dt_ckpt *c, dt_model *m, size_t plo, size_t phi, dt_optim *o,
                                                 size_t olo);
/* Open + restore in one call; *out (optional) receives the open checkpoint
 * for its info and extras (close it), else it is closed. */
DT_API dt_status           dt_ckpt_load(const char *path, dt_model *m, dt_optim *o, dt_ckpt **out);

#endif /* DT_CKPT_H */
