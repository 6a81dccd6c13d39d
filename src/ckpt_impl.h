/*
 * ckpt_impl.h: what ckpt.c (file formats) and ckpt_dir.c (directories) share;
 * not installed.
 */
#ifndef DT_CKPT_IMPL_H
#define DT_CKPT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "status.h"

#define DT_CKPT_PATH_MAX_  4096
#define DT_CKPT_SUM_KEY_   "dtrain.checksum"   /* metadata key of a file's checksum */
#define DT_CKPT_EXTRA_     "extra."            /* prefix of the trainer's own keys */
#define DT_CKPT_STEP_      "step-"             /* a complete checkpoint: step-<12 digits> */
#define DT_CKPT_TMP_       ".tmp-"             /* every temporary directory: .tmp-<what>-<step>-<pid> */
#define DT_CKPT_TMP_STEP_  ".tmp-step-"        /* a checkpoint being written */
#define DT_CKPT_TMP_DEL_   ".tmp-del-"         /* a checkpoint being deleted */
#define DT_CKPT_REUSE_     ".reuse"            /* in a .tmp-step-*: the files of a pruned one, reused */

/* a "/" b into out (n bytes), trailing slashes of a dropped; b NULL: a alone.
 * DT_ERR_INVALID when it does not fit. */
dt_status dt_ckpt_join_(char *out, size_t n, const char *a, const char *b);
/* "shard-<r>-of-<W>.safetensors" (5 digits each) into out (n bytes). */
void dt_ckpt_shard_name_(char *out, size_t n, int rank, int world);
/* mkdir -p, fsyncing the parent of each directory it creates. */
dt_status dt_ckpt_mkdirs_(const char *dir);
/* A step-* directory of a checkpoint directory: its step and name. */
typedef struct {
    int64_t step;
    char    name[256];
} dt_ckpt_entry_;
/* The step-<12 digits> directories of dir (the names dtrain writes), newest first, into a
 * malloc'd array (*n of them); *missing set when dir does not exist. */
dt_status dt_ckpt_list_(const char *dir, dt_ckpt_entry_ **out, size_t *n, int *missing);
/* rm -r of path (a missing path is fine). */
dt_status dt_ckpt_rm_tree_(const char *path);
/* Whether the directory path holds only what dtrain writes into a checkpoint:
 * regular files named model.safetensors, train_state.safetensors or
 * shard-<r>-of-<W>.safetensors (with partial, also such a file's temporary
 * <name>.tmp.XXXXXX, and a .reuse directory of such files), and
 * train_state.safetensors among them when need_state. A directory that cannot be
 * read counts as not a checkpoint's. */
int dt_ckpt_only_(const char *path, int partial, int need_state);

/* Reusing memory (for a directory in memory, tmpfs, where fresh pages cost more than
 * the copy into them). dt_ckpt_begin_ with reuse_keep >= 2: when dir holds at least
 * reuse_keep complete checkpoints older than step, the newest of those that installing
 * step with keep = reuse_keep would prune is moved into tmp as DT_CKPT_REUSE_, so dir
 * holds reuse_keep - 1 complete ones while the new one is written (never fewer than
 * one). reuse_keep 0: dt_ckpt_begin. Every file written into tmp then goes over the file
 * of its name there (dt_ckpt_reuse_from_: the path of that file, for dt_afile_open_over),
 * and what was not rewritten is removed before the install. */
dt_status dt_ckpt_begin_(const char *dir, int64_t step, int reuse_keep, char *tmp, size_t n);
dt_status dt_ckpt_reuse_from_(const char *path, char *from, size_t n);
/* dt_ckpt_save over dt_ckpt_begin_(reuse_keep = keep when reuse). */
dt_status dt_ckpt_save_(const char *dir, int keep, int reuse, dt_model *m, dt_optim *o, const dt_ckpt_info *info,
                        const char *const *extra, int nextra);
/* fsync a directory so the entries created or renamed in it are durable. */
dt_status dt_ckpt_fsync_dir_(const char *path);
/* Rename the complete temporary directory tmp to final inside dir, replacing
 * an existing final atomically where the system allows, and fsync dir. */
dt_status dt_ckpt_install_(const char *dir, const char *tmp, const char *final);
/* After step was saved: keep the keep-1 newest older checkpoints (keep 0: all;
 * newer ones are never touched) and remove stale .tmp-step-* and .tmp-del-* of
 * dead writers; a directory that is not dt_ckpt_only_ is never touched. */
dt_status dt_ckpt_prune_(const char *dir, int keep, int64_t step);

#endif /* DT_CKPT_IMPL_H */
