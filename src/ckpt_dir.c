/*
 * ckpt_dir.c: the checkpoint directory DIR (see ckpt.h): installing a new
 * checkpoint atomically, pruning old ones and dead writers' leftovers, and
 * finding the newest checkpoint that verifies.
 *
 * Only two kinds of names matter, exactly as dtrain writes them:
 * step-<12 digits> (complete checkpoints: they appear by one rename of a fully
 * written and fsynced directory) and .tmp-step-<12 digits>-<pid> or
 * .tmp-del-<12 digits>-<pid> (work in progress of writer <pid>: a checkpoint
 * being written, or one being deleted, which is renamed away first so that a
 * crash in the middle of a deletion never leaves a half checkpoint under a
 * step-* name). Everything else in DIR is left alone, and so is a directory of
 * those names that holds anything dtrain does not write there (a user's file, a
 * subdirectory, a link): DIR may be shared with the user's own files, and a
 * name that merely looks like ours is no licence to delete.
 */
#include "config.h"

#include "ckpt.h"
#include "ckpt_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- paths and files ------------------------------------------------------------ */

dt_status dt_ckpt_join_(char *out, size_t n, const char *a, const char *b) {
    size_t la = strlen(a);
    while (la > 1 && a[la - 1] == '/') la--;
    int k = b ? snprintf(out, n, "%.*s/%s", (int)la, a, b) : snprintf(out, n, "%.*s", (int)la, a);
    if (k < 0 || (size_t)k >= n)
        return dt_error(DT_ERR_INVALID, "checkpoint path %s%s%s is longer than %zu bytes", a, b ? "/" : "", b ? b : "",
                        n - 1);
    return DT_OK;
}

dt_status dt_ckpt_path(const char *dir, int64_t step, char *path, size_t n) {
    char name[32];
    if (!dir || !*dir) return dt_error(DT_ERR_INVALID, "checkpoint: empty directory name");
    if (step < 0) return dt_error(DT_ERR_INVALID, "checkpoint: negative step %" PRId64, step);
    snprintf(name, sizeof name, "%s%012" PRId64, DT_CKPT_STEP_, step);
    return dt_ckpt_join_(path, n, dir, name);
}

dt_status dt_ckpt_fsync_dir_(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return dt_error(DT_ERR_IO, "%s: cannot open the directory to fsync it: %s", path, strerror(errno));
    /* some filesystems cannot fsync a directory (EINVAL); nothing more can be done there */
    dt_status s = DT_OK;
    if (fsync(fd) != 0 && errno != EINVAL) s = dt_error(DT_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    close(fd);
    return s;
}

dt_status dt_ckpt_mkdirs_(const char *dir) {
    char p[DT_CKPT_PATH_MAX_];
    DT_TRY(dt_ckpt_join_(p, sizeof p, dir, NULL));
    size_t n = strlen(p);
    /* every prefix ending before a '/', then the whole path */
    for (size_t i = 1; i <= n; i++) {
        if (i < n && p[i] != '/') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) == 0) {
            /* make the new entry durable: fsync the parent */
            char *slash = strrchr(p, '/');
            dt_status s = DT_OK;
            if (!slash) s = dt_ckpt_fsync_dir_(".");
            else if (slash == p) s = dt_ckpt_fsync_dir_("/");
            else {
                *slash = '\0';
                s = dt_ckpt_fsync_dir_(p);
                *slash = '/';
            }
            if (s != DT_OK) return s;
        } else if (errno != EEXIST) {
            return dt_error(DT_ERR_IO, "%s: cannot create the checkpoint directory: %s", p, strerror(errno));
        }
        p[i] = c;
    }
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
        return dt_error(DT_ERR_IO, "%s: exists and is not a directory", p);
    return DT_OK;
}

static dt_status rm_tree(const char *path, int depth) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return DT_OK;
        return dt_error(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        if (depth > 8) return dt_error(DT_ERR_IO, "%s: nested too deep to remove (not a checkpoint?)", path);
        DIR *d = opendir(path);
        if (!d) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        dt_status s = DT_OK;
        struct dirent *e;
        while (s == DT_OK && (errno = 0, e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char sub[DT_CKPT_PATH_MAX_];
            s = dt_ckpt_join_(sub, sizeof sub, path, e->d_name);
            if (s == DT_OK) s = rm_tree(sub, depth + 1);
        }
        if (s == DT_OK && errno != 0) s = dt_error(DT_ERR_IO, "%s: cannot list: %s", path, strerror(errno));
        closedir(d);
        if (s == DT_OK && rmdir(path) != 0) s = dt_error(DT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
        return s;
    }
    if (unlink(path) != 0 && errno != ENOENT)
        return dt_error(DT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return DT_OK;
}

dt_status dt_ckpt_rm_tree_(const char *path) { return rm_tree(path, 0); }

/* ---- listing ---------------------------------------------------------------------- */

/* The value of exactly n decimal digits at p (n <= 15), or -1. */
static int64_t digits(const char *p, size_t n) {
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* The step of a "step-<12 digits>" name (dt_ckpt_path's), or -1. */
static int64_t step_of(const char *name) {
    size_t l = strlen(DT_CKPT_STEP_);
    if (strncmp(name, DT_CKPT_STEP_, l) != 0 || strlen(name + l) != 12) return -1;
    return digits(name + l, 12);
}

/* The writer pid of a ".tmp-step-<12 digits>-<pid>" or ".tmp-del-<12 digits>-<pid>"
 * name (dt_ckpt_begin's, remove_ckpt's), or -1. */
static long tmp_pid(const char *name) {
    const char *p;
    if (strncmp(name, DT_CKPT_TMP_STEP_, strlen(DT_CKPT_TMP_STEP_)) == 0) p = name + strlen(DT_CKPT_TMP_STEP_);
    else if (strncmp(name, DT_CKPT_TMP_DEL_, strlen(DT_CKPT_TMP_DEL_)) == 0) p = name + strlen(DT_CKPT_TMP_DEL_);
    else return -1;
    size_t n = strlen(p);
    if (n < 14 || n > 22 || digits(p, 12) < 0 || p[12] != '-') return -1;
    int64_t pid = digits(p + 13, n - 13);
    return pid > 0 ? (long)pid : -1;
}

/* Whether name is a file dtrain writes into a checkpoint's directory: model.safetensors,
 * train_state.safetensors, shard-<r>-of-<W>.safetensors (ckpt.c's shard_name); with
 * partial, also the temporary file of one being written (<name>.tmp.<6 characters>,
 * fileio.c), which a killed writer leaves behind. */
static int ckpt_file(const char *name, int partial) {
    static const char *const fixed[] = {"model.safetensors", "train_state.safetensors"};
    static const char ext[] = ".safetensors";
    size_t n = strlen(name);
    if (partial && n > 11 && strncmp(name + n - 11, ".tmp.", 5) == 0) {
        for (size_t i = n - 6; i < n; i++)
            if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'z') ||
                  (name[i] >= 'A' && name[i] <= 'Z')))
                return 0;
        n -= 11;
    }
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (n == strlen(fixed[i]) && strncmp(name, fixed[i], n) == 0) return 1;
    /* shard-<r>-of-<W>.safetensors, each number of 5 to 10 digits (%05d); the digits
     * stop at n, where a temporary file's ".tmp." begins */
    const char *p = name + 6, *end = name + n;
    if (n < 6 || strncmp(name, "shard-", 6) != 0) return 0;
    size_t k = strspn(p, "0123456789");
    if (k < 5 || k > 10 || (size_t)(end - p) < k + 4 || strncmp(p + k, "-of-", 4) != 0) return 0;
    p += k + 4;
    k = strspn(p, "0123456789");
    return k >= 5 && k <= 10 && (size_t)(end - p) == k + strlen(ext) && strncmp(p + k, ext, strlen(ext)) == 0;
}

int dt_ckpt_only_(const char *path, int partial, int need_state) {
    DIR *d = opendir(path);
    if (!d) return 0;
    int ours = 1, state = 0;
    struct dirent *e;
    while (ours && (errno = 0, e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char sub[DT_CKPT_PATH_MAX_];
        struct stat st;
        int ok = dt_ckpt_join_(sub, sizeof sub, path, e->d_name) == DT_OK && lstat(sub, &st) == 0;
        if (partial && strcmp(e->d_name, DT_CKPT_REUSE_) == 0)   /* a writer's reused files (one level) */
            ours = ok && S_ISDIR(st.st_mode) && !strstr(path, "/" DT_CKPT_REUSE_) && dt_ckpt_only_(sub, 1, 0);
        else
            ours = ok && ckpt_file(e->d_name, partial) && S_ISREG(st.st_mode);
        state |= strcmp(e->d_name, "train_state.safetensors") == 0;
    }
    if (errno != 0) ours = 0;
    closedir(d);
    return ours && (state || !need_state);
}

typedef dt_ckpt_entry_ entry;

static int by_step_desc(const void *a, const void *b) {
    int64_t x = ((const entry *)a)->step, y = ((const entry *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The names of dir that pass keep(): step-* (kind 0) or stale .tmp-* (kind 1),
 * into a malloc'd array sorted by step, newest first. *missing is set when dir
 * does not exist. */
static dt_status list_dir(const char *dir, int kind, entry **out, size_t *n, int *missing) {
    *out = NULL;
    *n = 0;
    if (missing) *missing = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT && missing) {
            *missing = 1;
            return DT_OK;
        }
        return dt_error(DT_ERR_IO, "%s: cannot open the checkpoint directory: %s", dir, strerror(errno));
    }
    entry *v = NULL;
    size_t cap = 0;
    dt_status s = DT_OK;
    struct dirent *e;
    long self = (long)getpid();
    while (s == DT_OK && (errno = 0, e = readdir(d)) != NULL) {
        int64_t step = -1;
        if (kind == 0) {
            step = step_of(e->d_name);
            if (step < 0) continue;
        } else {
            long pid = tmp_pid(e->d_name);
            if (pid <= 0) continue;
            /* stale: written by this process before (saves are sequential), or its writer is gone */
            int stale = pid == self || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
            if (!stale) continue;
        }
        if (strlen(e->d_name) >= sizeof v[0].name) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            entry *nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                s = dt_error(DT_ERR_NOMEM, "%s: out of memory listing checkpoints", dir);
                break;
            }
            v = nv;
        }
        v[*n].step = step;
        snprintf(v[*n].name, sizeof v[*n].name, "%s", e->d_name);
        (*n)++;
    }
    if (s == DT_OK && errno != 0) s = dt_error(DT_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    closedir(d);
    if (s != DT_OK) {
        free(v);
        *n = 0;
        return s;
    }
    if (*n) qsort(v, *n, sizeof *v, by_step_desc);
    *out = v;
    return DT_OK;
}

/* ---- installing and pruning ---------------------------------------------------------- */

/* Rename a checkpoint out of the step-* namespace, then delete it: a crash
 * mid-way leaves a .tmp-del-* that the next save removes. */
static dt_status remove_ckpt(const char *dir, const char *name, int64_t step) {
    char from[DT_CKPT_PATH_MAX_], to[DT_CKPT_PATH_MAX_], tn[64];
    snprintf(tn, sizeof tn, "%s%012" PRId64 "-%ld", DT_CKPT_TMP_DEL_, step, (long)getpid());
    DT_TRY(dt_ckpt_join_(from, sizeof from, dir, name));
    DT_TRY(dt_ckpt_join_(to, sizeof to, dir, tn));
    DT_TRY(dt_ckpt_rm_tree_(to));
    if (rename(from, to) != 0) return dt_error(DT_ERR_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
    return dt_ckpt_rm_tree_(to);
}

dt_status dt_ckpt_install_(const char *dir, const char *tmp, const char *final) {
    if (rename(tmp, final) == 0) return dt_ckpt_fsync_dir_(dir);
    if (errno != EEXIST && errno != ENOTEMPTY)
        return dt_error(DT_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    /* Replacing deletes what final holds: only ever a checkpoint's files. */
    if (!dt_ckpt_only_(final, 0, 0))
        return dt_error(DT_ERR_IO, "%s exists and holds files that are not a checkpoint's; not replacing it (move "
                        "them elsewhere, or use another checkpoint directory)", final);
    /* A checkpoint of this step exists (a resumed run saving again): swap the
     * two in one atomic step, then delete the old one, now under the tmp name. */
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        DT_TRY(dt_ckpt_fsync_dir_(dir));
        return dt_ckpt_rm_tree_(tmp);
    }
    if (errno != EINVAL && errno != ENOSYS)
        return dt_error(DT_ERR_IO, "cannot exchange %s and %s: %s", tmp, final, strerror(errno));
#endif
    /* No atomic exchange here: move the old one away first. A crash in between
     * leaves no checkpoint of this step, and latest falls back to the one before. */
    const char *base = strrchr(final, '/');
    base = base ? base + 1 : final;
    DT_TRY(remove_ckpt(dir, base, step_of(base)));
    if (rename(tmp, final) != 0) return dt_error(DT_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    return dt_ckpt_fsync_dir_(dir);
}

dt_status dt_ckpt_prune_(const char *dir, int keep, int64_t step) {
    entry *v;
    size_t n;
    dt_status s = list_dir(dir, 1, &v, &n, NULL);
    /* a dead writer's leftovers: any part of a checkpoint, nothing else */
    for (size_t i = 0; s == DT_OK && i < n; i++) {
        char p[DT_CKPT_PATH_MAX_];
        s = dt_ckpt_join_(p, sizeof p, dir, v[i].name);
        if (s == DT_OK && dt_ckpt_only_(p, 1, 0)) s = dt_ckpt_rm_tree_(p);
    }
    free(v);
    if (s == DT_OK && keep > 0) {
        s = list_dir(dir, 0, &v, &n, NULL);
        /* newest first: the new one, then older ones; newer ones belong to a
         * line of the run that was abandoned by resuming earlier, and are kept.
         * A step-* that is not a checkpoint as dtrain writes it (no state file,
         * or anything else inside) is neither counted nor touched. */
        int kept = 1;
        for (size_t i = 0; s == DT_OK && i < n; i++) {
            char p[DT_CKPT_PATH_MAX_];
            if (v[i].step >= step) continue;
            s = dt_ckpt_join_(p, sizeof p, dir, v[i].name);
            if (s != DT_OK || !dt_ckpt_only_(p, 0, 1)) continue;
            if (kept < keep) kept++;
            else s = remove_ckpt(dir, v[i].name, v[i].step);
        }
        free(v);
    }
    if (s == DT_OK) s = dt_ckpt_fsync_dir_(dir);
    if (s != DT_OK)
        return dt_error_wrap(s, "checkpoint of step %" PRId64 " saved, but cleaning %s failed: ", step, dir);
    return DT_OK;
}

/* ---- the checkpoints of a directory ---------------------------------------------------- */

dt_status dt_ckpt_list_(const char *dir, dt_ckpt_entry_ **out, size_t *n, int *missing) {
    return list_dir(dir, 0, out, n, missing);
}

dt_status dt_ckpt_prepare_dir(const char *dir) {
    if (!dir || !*dir) return dt_error(DT_ERR_INVALID, "checkpoint: empty directory name");
    DT_TRY(dt_ckpt_mkdirs_(dir));
    if (access(dir, W_OK | X_OK) != 0)
        return dt_error(DT_ERR_IO, "%s: cannot write checkpoints into it: %s", dir, strerror(errno));
    return DT_OK;
}
