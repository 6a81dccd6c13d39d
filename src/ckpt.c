/*
 * ckpt.c: training checkpoints (see ckpt.h for the layout and the guarantees).
 *
 * Three parts: the checksum (XXH64 over a file's tensor data, then over a
 * description of its tensor table and metadata, so a changed shape or value
 * is caught as surely as a flipped data byte); writing a checkpoint into a
 * temporary directory and renaming it into place; reading one back, verifying
 * all of it before anything is applied.
 *
 * Directory handling (atomic install, pruning, finding the newest valid
 * checkpoint) lives in ckpt_dir.c.
 */
#include "config.h"

#include "ckpt.h"
#include "ckpt_impl.h"
#include "testing.h"
#include "checkpoint.h"
#include "hash.h"
#include "safetensors.h"
#include "sbuf.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- checksums of a file -------------------------------------------------------- */

/* The description hashed after the data: "T" name dtype dims for each tensor
 * in file order, "M" key value for each metadata pair except the checksum,
 * fields NUL-separated, in a dt_sbuf. Writer and reader build it the same way. */
static void desc_tensor(dt_sbuf *d, const char *name, dt_dtype t, int ndim, const int64_t *shape) {
    const char *dn = dt_dtype_st_name(t);
    dt_sbuf_put_(d, "T", 1);
    dt_sbuf_put_(d, name, strlen(name) + 1);
    dt_sbuf_put_(d, dn, strlen(dn) + 1);
    for (int i = 0; i < ndim; i++) dt_sbuf_printf_(d, "%" PRId64 ",", shape[i]);
    dt_sbuf_put_(d, "", 1);
}

static void desc_meta(dt_sbuf *d, const char *k, const char *v) {
    dt_sbuf_put_(d, "M", 1);
    dt_sbuf_put_(d, k, strlen(k) + 1);
    dt_sbuf_put_(d, v, strlen(v) + 1);
}

/* "xxh64:<16 hex>" of the data (data_h: XXH64 of the data region, seed 0) then the
 * description (seeded with it) into out (DT_CKPT_SUM_LEN bytes). */
static dt_status desc_sum(dt_sbuf *d, uint64_t data_h, char out[DT_CKPT_SUM_LEN]) {
    if (d->oom) return dt_error(DT_ERR_NOMEM, "out of memory computing a checkpoint checksum");
    uint64_t h = dt_xxh64(d->p ? d->p : "", d->len, data_h);
    snprintf(out, DT_CKPT_SUM_LEN, "xxh64:%016" PRIx64, h);
    return DT_OK;
}

/* The checksum a file should carry, recomputed from what was read. */
static dt_status file_sum(const dt_st_file *f, char out[DT_CKPT_SUM_LEN]) {
    dt_sbuf d = {0};
    for (size_t i = 0; i < dt_st_count(f); i++) {
        dt_st_tensor t;
        dt_status s = dt_st_tensor_at(f, i, &t);
        if (s != DT_OK) {
            dt_sbuf_free_(&d);
            return s;
        }
        desc_tensor(&d, t.name, t.dtype, t.ndim, t.shape);
    }
    for (size_t i = 0; i < dt_st_meta_count(f); i++) {
        const char *k, *v;
        dt_st_meta_at(f, i, &k, &v);
        if (strcmp(k, DT_CKPT_SUM_KEY_) != 0) desc_meta(&d, k, v);
    }
    const void *data;
    size_t n;
    dt_st_data_region(f, &data, &n);
    dt_status s = desc_sum(&d, dt_xxh64(data, n, 0), out);
    dt_sbuf_free_(&d);
    return s;
}

/* Open a file of a checkpoint and check its checksum. */
static dt_status open_verified(const char *path, dt_st_file **out) {
    dt_st_file *f;
    *out = NULL;
    DT_TRY(dt_st_open(path, &f));
    const char *want = dt_st_meta_get(f, DT_CKPT_SUM_KEY_);
    char got[DT_CKPT_SUM_LEN];
    dt_status s = DT_OK;
    if (!want)
        s = dt_error(DT_ERR_FORMAT, "%s: no %s in its metadata (not written by dt_ckpt_save)", path, DT_CKPT_SUM_KEY_);
    if (s == DT_OK) s = file_sum(f, got);
    if (s == DT_OK && strcmp(want, got) != 0 && !dt_testing_unverified())
        s = dt_error(DT_ERR_FORMAT, "%s: checksum mismatch (the file is corrupt): recorded %s, computed %s", path, want,
                     got);
    if (s != DT_OK) {
        dt_st_close(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

/* ---- writing ------------------------------------------------------------------- */

/* A safetensors writer that also builds the description for the checksum. */
typedef struct {
    dt_st_writer *w;
    dt_sbuf       d;
} swriter;

static dt_status sw_meta(swriter *sw, const char *k, const char *v) {
    desc_meta(&sw->d, k, v);
    return dt_st_writer_set_meta(sw->w, k, v);
}

static dt_status sw_metai(swriter *sw, const char *k, int64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%" PRId64, v);
    return sw_meta(sw, k, b);
}

static dt_status sw_metaf(swriter *sw, const char *k, float v) {
    /* the shortest text that gives the float back exactly ("0.1", not
     * "0.100000001"); 9 significant digits always do */
    char b[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, (double)v);
        if (strtof(b, NULL) == v) break;
    }
    return sw_meta(sw, k, b);
}

/* Set the checksum over the tensors' data (the file's data region: the writer's tensors
 * end to end, read where they are) and write. */
static dt_status sw_finish(swriter *sw, const char *path, char sum[DT_CKPT_SUM_LEN]) {
    dt_xxh64_state h;
    dt_xxh64_init(&h, 0);
    for (size_t i = 0; i < dt_st_writer_count(sw->w); i++) {
        size_t n;
        const void *p = dt_st_writer_data(sw->w, i, &n);
        dt_xxh64_update(&h, p, n);
    }
    DT_TRY(desc_sum(&sw->d, dt_xxh64_digest(&h), sum));
    DT_TRY(dt_st_writer_set_meta(sw->w, DT_CKPT_SUM_KEY_, sum));
    char from[DT_CKPT_PATH_MAX_];
    DT_TRY(dt_ckpt_reuse_from_(path, from, sizeof from));
    return dt_st_writer_write_over(sw->w, path, from);
}

static dt_status write_model(const char *path, dt_model *m, dt_state_part part, int64_t step, char sum[DT_CKPT_SUM_LEN]) {
    swriter sw = {0};
    void *host = NULL;
    size_t n = 0;
    DT_TRY(dt_st_writer_init(&sw.w));
    dt_status s = dt_model_state_add_part(m, part, sw.w, &host, &n);
    for (int i = 0; s == DT_OK && i < dt_model_nstate(m); i++) {
        dt_tensor_info ti;
        s = dt_model_state(m, i, &ti);
        if (s == DT_OK && (part == DT_STATE_ALL || !ti.in_params)) desc_tensor(&sw.d, ti.name, ti.dtype, ti.ndim, ti.shape);
    }
    if (s == DT_OK) s = sw_meta(&sw, "format", "pt");
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.step", step);
    if (s == DT_OK) s = sw_finish(&sw, path, sum);
    dt_st_writer_free(sw.w);
    dt_sbuf_free_(&sw.d);
    free(host);
    return s;
}

/* The shards of a sharded checkpoint, as its manifest lists them. */
typedef struct {
    int          world;
    const size_t *lo, *len;
    const char  (*sum)[DT_CKPT_SUM_LEN];
} shard_list;

/* n floats at src as the writer reads them: src itself where the backend's memory is the
 * host's, else copied to the host buffer at dst. */
static dt_status host_view(const dt_ops *ops, float *dst, const float *src, size_t n, const float **out) {
    *out = ops->host_memory ? src : dst;
    return ops->host_memory || !n ? DT_OK : ops->copy_d2h(dst, src, n * sizeof(float));
}

/* train_state.safetensors; with shards (a sharded save) it holds no tensors, and the
 * optimizer's size is the whole array's (total). */
static dt_status write_state(const char *path, const dt_ops *ops, dt_optim *o, const dt_ckpt_info *in,
                             const char *const *extra, int nextra, const char *model_sum, const shard_list *sh,
                             size_t total) {
    swriter sw = {0};
    int ns = o && !sh ? dt_optim_nstate(o) : 0;
    size_t n = o ? (sh ? total : dt_optim_size(o)) : 0, bytes = (size_t)ns * n * sizeof(float);
    float *host = ops->host_memory || !bytes ? NULL : malloc(bytes);   /* device memory: a host copy */
    if (!ops->host_memory && bytes && !host)
        return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes of optimizer state", path, bytes);
    dt_status s = dt_st_writer_init(&sw.w);
    /* optim.<name>: (n) floats each, one after another in the data region */
    for (int i = 0; s == DT_OK && i < ns; i++) {
        char name[96];
        int64_t shape[1] = {(int64_t)n};
        const float *at;
        snprintf(name, sizeof name, "optim.%s", dt_optim_state_name(o, i));
        s = host_view(ops, host ? host + (size_t)i * n : NULL, dt_optim_state(o, i), n, &at);
        if (s == DT_OK) s = dt_st_writer_add(sw.w, name, DT_F32, 1, shape, at);
        desc_tensor(&sw.d, name, DT_F32, 1, shape);
    }
    const dt_optim_config *c = o ? dt_optim_config_of(o) : NULL;
    dt_optim_config none = {0};
    if (!c) c = &none;
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.format", DT_CKPT_FORMAT);
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.step", in->step);
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.epoch", in->epoch);
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.step_in_epoch", in->step_in_epoch);
    if (s == DT_OK) {
        char b[24];
        snprintf(b, sizeof b, "%" PRIu64, in->seed);
        s = sw_meta(&sw, "dtrain.seed", b);
    }
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.batch", in->batch);
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.micro_batches", in->micro_batches);
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.world_size", in->world_size);
    if (s == DT_OK) s = sw_meta(&sw, "dtrain.model", in->model_spec ? in->model_spec : "");
    if (s == DT_OK) s = sw_meta(&sw, "dtrain.schedule", in->schedule ? in->schedule : "");
    /* the optimizer by its row's name, then every hyper-parameter field */
    if (s == DT_OK) s = sw_meta(&sw, "dtrain.optimizer", o ? dt_optim_def_in(o)->name : "none");
    int nhp;
    const dt_optim_hparam *hp = dt_optim_hparams(&nhp);
    for (int i = 0; s == DT_OK && i < nhp; i++) {
        char key[64];
        const char *field = (const char *)c + hp[i].offset;
        snprintf(key, sizeof key, "dtrain.optim.%s", hp[i].name);
        if (hp[i].is_int) s = sw_metai(&sw, key, *(const int *)field);
        else s = sw_metaf(&sw, key, *(const float *)field);
    }
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.optim.steps", o ? dt_optim_steps(o) : 0);
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.optim.size", (int64_t)n);
    if (s == DT_OK) s = sw_meta(&sw, "dtrain.model_checksum", model_sum);
    if (s == DT_OK && sh) s = sw_metai(&sw, "dtrain.shards", sh->world);
    for (int r = 0; s == DT_OK && sh && r < sh->world; r++) {
        char key[48], val[96];
        snprintf(key, sizeof key, "dtrain.shard.%d", r);
        snprintf(val, sizeof val, "%zu,%zu,%s", sh->lo[r], sh->len[r], sh->sum[r]);
        s = sw_meta(&sw, key, val);
    }
    for (int i = 0; s == DT_OK && i < nextra; i++) {
        char key[256];
        snprintf(key, sizeof key, "%s%s", DT_CKPT_EXTRA_, extra[2 * i]);
        s = sw_meta(&sw, key, extra[2 * i + 1]);
    }
    char sum[DT_CKPT_SUM_LEN];
    if (s == DT_OK) s = sw_finish(&sw, path, sum);
    dt_st_writer_free(sw.w);
    dt_sbuf_free_(&sw.d);
    free(host);
    return s;
}

static dt_status check_save_args(const char *dir, int keep, dt_model *m, dt_optim *o, const dt_ckpt_info *in,
                                 const char *const *extra, int nextra) {
    if (!dir || !*dir) return dt_error(DT_ERR_INVALID, "checkpoint: empty directory name");
    if (!m || !in) return dt_error(DT_ERR_INVALID, "checkpoint: no model or no info to save");
    if (o && dt_optim_size(o) != dt_model_nparams(m))
        return dt_error(DT_ERR_INVALID, "checkpoint: the optimizer is over %zu parameters, the model has %zu",
                        dt_optim_size(o), dt_model_nparams(m));
    if (keep < 0) return dt_error(DT_ERR_INVALID, "checkpoint: keep must be >= 0 (0 keeps all), got %d", keep);
    if (in->step < 0 || in->step > 999999999999LL)
        return dt_error(DT_ERR_INVALID, "checkpoint: step %" PRId64 " is out of range [0, 999999999999]", in->step);
    if (in->epoch < 0 || in->step_in_epoch < 0 || in->batch < 0 || in->micro_batches < 0 || in->world_size < 0)
        return dt_error(DT_ERR_INVALID, "checkpoint: negative epoch (%" PRId64 "), step in epoch (%" PRId64 "), "
                        "batch (%" PRId64 "), micro-batch count (%" PRId64 ") or world size (%d)", in->epoch,
                        in->step_in_epoch, in->batch, in->micro_batches, in->world_size);
    if (nextra < 0 || (nextra > 0 && !extra))
        return dt_error(DT_ERR_INVALID, "checkpoint: %d extra key/values but no array", nextra);
    for (int i = 0; i < nextra; i++) {
        const char *k = extra[2 * i];
        if (!k || !*k || !extra[2 * i + 1] || strlen(k) > 200)
            return dt_error(DT_ERR_INVALID, "checkpoint: extra pair %d has an empty or NULL key or value, or a key "
                            "over 200 bytes", i);
        for (int j = 0; j < i; j++)
            if (strcmp(extra[2 * j], k) == 0)
                return dt_error(DT_ERR_INVALID, "checkpoint: extra key \"%s\" given twice", k);
    }
    return DT_OK;
}

/* ---- writing a sharded checkpoint ----------------------------------------------------- */

void dt_ckpt_shard_name_(char *out, size_t n, int rank, int world) {
    snprintf(out, n, "shard-%05d-of-%05d.safetensors", rank, world);
}

dt_status dt_ckpt_reuse_from_(const char *path, char *from, size_t n) {
    const char *base = strrchr(path, '/');
    if (!base) return dt_error(DT_ERR_INVALID, "checkpoint: %s is not in a checkpoint's directory", path);
    int k = snprintf(from, n, "%.*s/%s/%s", (int)(base - path), path, DT_CKPT_REUSE_, base + 1);
    if (k < 0 || (size_t)k >= n)
        return dt_error(DT_ERR_INVALID, "checkpoint path %s: with %s, longer than %zu bytes", path, DT_CKPT_REUSE_, n - 1);
    return DT_OK;
}

/* The checkpoint whose files the one of step reuses (dt_ckpt_begin_), moved into tmp.
 * Nothing to reuse, or a failure: nothing moved (the save goes on with fresh files). */
static void reuse_pruned(const char *dir, int64_t step, int keep, const char *tmp) {
    dt_ckpt_entry_ *v = NULL;
    size_t cnt = 0;
    int missing = 0, older = 0;
    if (keep < 2 || dt_ckpt_list_(dir, &v, &cnt, &missing) != DT_OK) return;
    for (size_t i = 0; i < cnt; i++) {   /* newest first; newer than step: not ours to count */
        char p[DT_CKPT_PATH_MAX_], to[DT_CKPT_PATH_MAX_];
        if (v[i].step >= step || dt_ckpt_join_(p, sizeof p, dir, v[i].name) != DT_OK || !dt_ckpt_only_(p, 0, 1))
            continue;
        if (++older < keep) continue;   /* one of the keep - 1 that stay */
        if (dt_ckpt_join_(to, sizeof to, tmp, DT_CKPT_REUSE_) == DT_OK) rename(p, to);
        break;
    }
    free(v);
}

dt_status dt_ckpt_begin(const char *dir, int64_t step, char *tmp, size_t n) { return dt_ckpt_begin_(dir, step, 0, tmp, n); }

dt_status dt_ckpt_begin_(const char *dir, int64_t step, int reuse_keep, char *tmp, size_t n) {
    if (!dir || !*dir) return dt_error(DT_ERR_INVALID, "checkpoint: empty directory name");
    if (step < 0 || step > 999999999999LL)
        return dt_error(DT_ERR_INVALID, "checkpoint: step %" PRId64 " is out of range [0, 999999999999]", step);
    char tname[64];
    snprintf(tname, sizeof tname, "%s%012" PRId64 "-%ld", DT_CKPT_TMP_STEP_, step, (long)getpid());
    DT_TRY(dt_ckpt_join_(tmp, n, dir, tname));
    DT_TRY(dt_ckpt_mkdirs_(dir));
    /* a leftover of an earlier process with this pid is removed, a user's directory not */
    struct stat st;
    if (lstat(tmp, &st) == 0 && (!S_ISDIR(st.st_mode) || !dt_ckpt_only_(tmp, 1, 0)))
        return dt_error(DT_ERR_IO, "%s exists and holds files that are not a checkpoint's; not removing it", tmp);
    DT_TRY(dt_ckpt_rm_tree_(tmp));
    if (mkdir(tmp, 0755) != 0) return dt_error(DT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (reuse_keep >= 2) reuse_pruned(dir, step, reuse_keep, tmp);
    return DT_OK;
}

/* Into tmp: the model file (the buffers only when sharded) and train_state, then the
 * atomic install as step-<step> and the pruning; tmp is removed on a failure. */
static dt_status finish_save(const char *dir, int keep, const char *tmp, dt_model *m, dt_optim *o,
                             const dt_ckpt_info *info, const char *const *extra, int nextra, const shard_list *sh,
                             size_t total) {
    char final[DT_CKPT_PATH_MAX_], file[DT_CKPT_PATH_MAX_], msum[DT_CKPT_SUM_LEN];
    dt_status s = dt_ckpt_path(dir, info->step, final, sizeof final);
    if (s == DT_OK) s = dt_ckpt_join_(file, sizeof file, tmp, "model.safetensors");
    if (s == DT_OK) s = write_model(file, m, sh ? DT_STATE_BUFFERS : DT_STATE_ALL, info->step, msum);
    if (s == DT_OK) s = dt_ckpt_join_(file, sizeof file, tmp, "train_state.safetensors");
    if (s == DT_OK) s = write_state(file, dt_model_ops(m), o, info, extra, nextra, msum, sh, total);
    if (s == DT_OK) s = dt_ckpt_join_(file, sizeof file, tmp, DT_CKPT_REUSE_);
    if (s == DT_OK) s = dt_ckpt_rm_tree_(file);   /* what this checkpoint did not write over */
    if (s == DT_OK) s = dt_ckpt_fsync_dir_(tmp);
    if (s == DT_OK) s = dt_ckpt_install_(dir, tmp, final);
    if (s != DT_OK) {
        /* best effort; the first error is the one reported */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        dt_ckpt_rm_tree_(tmp);
        return dt_error(s, "%s", msg);
    }
    return dt_ckpt_prune_(dir, keep, info->step);
}

dt_status dt_ckpt_save(const char *dir, int keep, dt_model *m, dt_optim *o, const dt_ckpt_info *info,
                       const char *const *extra, int nextra) {
    return dt_ckpt_save_(dir, keep, 0, m, o, info, extra, nextra);
}

dt_status dt_ckpt_save_(const char *dir, int keep, int reuse, dt_model *m, dt_optim *o, const dt_ckpt_info *info,
                        const char *const *extra, int nextra) {
    DT_TRY(check_save_args(dir, keep, m, o, info, extra, nextra));
    char tmp[DT_CKPT_PATH_MAX_];
    DT_TRY(dt_ckpt_begin_(dir, info->step, reuse ? keep : 0, tmp, sizeof tmp));
    return finish_save(dir, keep, tmp, m, o, info, extra, nextra, NULL, 0);
}

dt_status dt_ckpt_write_shard(const char *tmp, int rank, int world, dt_model *m, dt_optim *o, size_t lo,
                              size_t len, char sum[DT_CKPT_SUM_LEN]) {
    if (!tmp || !m || rank < 0 || rank >= world || lo + len > dt_model_nparams(m) || (o && dt_optim_size(o) != len))
        return dt_error(DT_ERR_INVALID, "checkpoint shard %d of %d: bad arguments (range %zu + %zu of %zu)", rank,
                        world, lo, len, dt_model_nparams(m));
    char name[64], path[DT_CKPT_PATH_MAX_];
    dt_ckpt_shard_name_(name, sizeof name, rank, world);
    DT_TRY(dt_ckpt_join_(path, sizeof path, tmp, name));
    const dt_ops *ops = dt_model_ops(m);
    int ns = o ? dt_optim_nstate(o) : 0;
    size_t bytes = (size_t)(ns + 1) * len * sizeof(float);
    float *host = ops->host_memory || !bytes ? NULL : malloc(bytes);   /* device memory: a host copy */
    if (!ops->host_memory && bytes && !host) return dt_error(DT_ERR_NOMEM, "%s: out of memory for %zu bytes", path, bytes);
    swriter sw = {0};
    int64_t shape[1] = {(int64_t)len};
    const float *at = NULL;
    dt_status s = dt_st_writer_init(&sw.w);
    /* params, then optim.<name> of the same range, one after another in the data region */
    if (s == DT_OK) s = host_view(ops, host, dt_model_params(m) + lo, len, &at);
    if (s == DT_OK) s = dt_st_writer_add(sw.w, "params", DT_F32, 1, shape, at);
    desc_tensor(&sw.d, "params", DT_F32, 1, shape);
    for (int i = 0; s == DT_OK && i < ns; i++) {
        char tn[96];
        snprintf(tn, sizeof tn, "optim.%s", dt_optim_state_name(o, i));
        s = host_view(ops, host ? host + (size_t)(i + 1) * len : NULL, dt_optim_state(o, i), len, &at);
        if (s == DT_OK) s = dt_st_writer_add(sw.w, tn, DT_F32, 1, shape, at);
        desc_tensor(&sw.d, tn, DT_F32, 1, shape);
    }
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.shard.lo", (int64_t)lo);
    if (s == DT_OK) s = sw_metai(&sw, "dtrain.shard.len", (int64_t)len);
    if (s == DT_OK) s = sw_finish(&sw, path, sum);
    dt_st_writer_free(sw.w);
    dt_sbuf_free_(&sw.d);
    free(host);
    return s;
}

dt_status dt_ckpt_commit(const char *dir, int keep, const char *tmp, dt_model *m, dt_optim *o,
                         const dt_ckpt_info *info, const char *const *extra, int nextra, int world,
                         const size_t *lo, const size_t *len, const char (*sums)[DT_CKPT_SUM_LEN]) {
    DT_TRY(check_save_args(dir, keep, m, NULL, info, extra, nextra));
    size_t at = 0;
    for (int r = 0; r < world; r++) {   /* the shards must tile the parameter array */
        if (lo[r] != at) return dt_error(DT_ERR_INVALID, "checkpoint: shard %d starts at %zu, expected %zu", r, lo[r], at);
        at += len[r];
    }
    if (at != dt_model_nparams(m))
        return dt_error(DT_ERR_INVALID, "checkpoint: the shards hold %zu parameters, the model %zu", at,
                        dt_model_nparams(m));
    shard_list sh = {.world = world, .lo = lo, .len = len, .sum = sums};
    return finish_save(dir, keep, tmp, m, o, info, extra, nextra, &sh, at);
}

void dt_ckpt_abort(const char *tmp) {
    if (tmp && *tmp) dt_ckpt_rm_tree_(tmp);
}

/* ---- reading ------------------------------------------------------------------- */

struct dt_ckpt {
    char          path[DT_CKPT_PATH_MAX_];
    char          state_path[DT_CKPT_PATH_MAX_];
    dt_st_file   *model, *state;
    dt_ckpt_info  info;
    int64_t       optim_size;   /* elements of each optimizer state array (the whole array's) */
    /* a sharded checkpoint: its shard files, their ranges and checksums */
    size_t       *slo, *slen;
    char        (*ssum)[DT_CKPT_SUM_LEN];
    uint64_t      stotal;       /* the parameters the shards hold together */
};

void dt_ckpt_close(dt_ckpt *c) {
    if (!c) return;
    free(c->slo);
    free(c->slen);
    free(c->ssum);
    dt_st_close(c->model);
    dt_st_close(c->state);
    free(c);
}

const dt_ckpt_info *dt_ckpt_info_of(const dt_ckpt *c) { return &c->info; }

const char *dt_ckpt_extra(const dt_ckpt *c, const char *key) {
    char k[256];
    if (!key || strlen(key) > 200) return NULL;
    snprintf(k, sizeof k, "%s%s", DT_CKPT_EXTRA_, key);
    return dt_st_meta_get(c->state, k);
}

/* Metadata value of key; DT_ERR_FORMAT naming the file when absent. */
static dt_status meta_str(dt_ckpt *c, const char *key, const char **out) {
    *out = dt_st_meta_get(c->state, key);
    if (!*out) return dt_error(DT_ERR_FORMAT, "%s: metadata \"%s\" is missing", c->state_path, key);
    return DT_OK;
}

static dt_status meta_int(dt_ckpt *c, const char *key, int64_t lo, int64_t *out) {
    const char *v, *e;
    DT_TRY(meta_str(c, key, &v));
    errno = 0;
    long long x = strtoll(v, (char **)&e, 10);
    if (!*v || *e || errno || x < lo)
        return dt_error(DT_ERR_FORMAT, "%s: metadata \"%s\" = \"%s\" is not an integer >= %" PRId64, c->state_path, key,
                        v, lo);
    *out = (int64_t)x;
    return DT_OK;
}

static dt_status meta_float(dt_ckpt *c, const char *key, float *out) {
    const char *v;
    char *e;
    DT_TRY(meta_str(c, key, &v));
    errno = 0;
    *out = strtof(v, &e);
    if (!*v || *e || errno)
        return dt_error(DT_ERR_FORMAT, "%s: metadata \"%s\" = \"%s\" is not a number", c->state_path, key, v);
    return DT_OK;
}

/* Fill c->info from train_state's metadata. */
/* A sharded checkpoint's list: "dtrain.shard.<r>" = "lo,len,checksum", tiling the
 * parameter array (optim.size elements) in order. */
static dt_status read_shards(dt_ckpt *c) {
    if (!dt_st_meta_get(c->state, "dtrain.shards")) return DT_OK;   /* not sharded */
    int64_t w;
    DT_TRY(meta_int(c, "dtrain.shards", 1, &w));
    if (w > (1 << 20)) return dt_error(DT_ERR_FORMAT, "%s: %" PRId64 " shards is more than dtrain writes", c->state_path, w);
    c->slo = calloc((size_t)w, sizeof *c->slo);
    c->slen = calloc((size_t)w, sizeof *c->slen);
    c->ssum = calloc((size_t)w, sizeof *c->ssum);
    if (!c->slo || !c->slen || !c->ssum) return dt_error(DT_ERR_NOMEM, "%s: out of memory", c->state_path);
    uint64_t at = 0;
    for (int r = 0; r < (int)w; r++) {
        char key[48];
        const char *v;
        unsigned long long a, n;
        int used = 0;
        snprintf(key, sizeof key, "dtrain.shard.%d", r);
        DT_TRY(meta_str(c, key, &v));
        if (sscanf(v, "%llu,%llu,%n", &a, &n, &used) != 2 || used == 0 || strlen(v + used) == 0 ||
            strlen(v + used) >= sizeof c->ssum[r] || a != at || n > UINT64_MAX - at)
            return dt_error(DT_ERR_FORMAT, "%s: metadata \"%s\" = \"%s\" is not the next shard's \"lo,len,checksum\" "
                            "(lo %" PRIu64 ")", c->state_path, key, v, at);
        c->slo[r] = (size_t)a;
        c->slen[r] = (size_t)n;
        snprintf(c->ssum[r], sizeof c->ssum[r], "%s", v + used);
        at += n;
    }
    if (at != (uint64_t)c->optim_size)
        return dt_error(DT_ERR_FORMAT, "%s: the shards hold %" PRIu64 " parameters, the optimizer state %" PRId64,
                        c->state_path, at, c->optim_size);
    c->info.shards = (int)w;
    c->stotal = at;
    return DT_OK;
}

static dt_status read_info(dt_ckpt *c) {
    dt_ckpt_info *in = &c->info;
    int64_t v;
    const char *kind, *seed;
    DT_TRY(meta_int(c, "dtrain.format", 1, &v));
    if (v > DT_CKPT_FORMAT)
        return dt_error(DT_ERR_FORMAT, "%s: checkpoint format %" PRId64 " is newer than this dtrain reads (%d)",
                        c->state_path, v, DT_CKPT_FORMAT);
    in->format = (int)v;
    DT_TRY(meta_int(c, "dtrain.step", 0, &in->step));
    DT_TRY(meta_int(c, "dtrain.epoch", 0, &in->epoch));
    DT_TRY(meta_int(c, "dtrain.step_in_epoch", 0, &in->step_in_epoch));
    DT_TRY(meta_str(c, "dtrain.seed", &seed));
    char *e;
    errno = 0;
    in->seed = strtoull(seed, &e, 10);
    if (!*seed || *e || errno || *seed == '-')
        return dt_error(DT_ERR_FORMAT, "%s: metadata \"dtrain.seed\" = \"%s\" is not an unsigned integer",
                        c->state_path, seed);
    DT_TRY(meta_int(c, "dtrain.batch", 1, &in->batch));
    DT_TRY(meta_int(c, "dtrain.micro_batches", 1, &in->micro_batches));
    DT_TRY(meta_int(c, "dtrain.world_size", 1, &v));
    if (v > INT32_MAX)
        return dt_error(DT_ERR_FORMAT, "%s: metadata \"dtrain.world_size\" = %" PRId64 " is out of range", c->state_path, v);
    in->world_size = (int)v;
    /* the numbers must describe a run that could have written them */
    if (in->batch % in->micro_batches != 0 || in->micro_batches % in->world_size != 0 || in->step_in_epoch > in->step)
        return dt_error(DT_ERR_FORMAT, "%s: inconsistent metadata: batch %" PRId64 ", %" PRId64 " micro-batches, "
                        "world size %d, step %" PRId64 " (%" PRId64 " in its epoch)", c->state_path, in->batch,
                        in->micro_batches, in->world_size, in->step, in->step_in_epoch);
    /* a step-<N> directory holds step N */
    const char *base = strrchr(c->path, '/');
    base = base ? base + 1 : c->path;
    if (!strncmp(base, "step-", 5)) {
        char *end;
        errno = 0;
        long long named = strtoll(base + 5, &end, 10);
        if (!errno && *end == '\0' && end != base + 5 && named != in->step)
            return dt_error(DT_ERR_FORMAT, "%s: the directory is named for step %lld but holds step %" PRId64,
                            c->state_path, named, in->step);
    }
    DT_TRY(meta_str(c, "dtrain.model", &in->model_spec));
    DT_TRY(meta_str(c, "dtrain.schedule", &in->schedule));
    DT_TRY(meta_str(c, "dtrain.optimizer", &kind));
    in->has_optim = strcmp(kind, "none") != 0;
    if (in->has_optim) {
        const dt_optim_def *d = dt_optim_find(kind);
        char names[128];
        if (!d)
            return dt_error(DT_ERR_FORMAT, "%s: unknown optimizer \"%s\" (this dtrain knows %s)", c->state_path, kind,
                            dt_optim_names(names, sizeof names));
        in->optim.kind = d->defaults.kind;
    }
    int nhp;
    const dt_optim_hparam *hp = dt_optim_hparams(&nhp);
    for (int i = 0; i < nhp; i++) {
        char key[64];
        char *field = (char *)&in->optim + hp[i].offset;
        snprintf(key, sizeof key, "dtrain.optim.%s", hp[i].name);
        if (hp[i].is_int) {
            DT_TRY(meta_int(c, key, 0, &v));
            *(int *)field = v != 0;
        } else {
            DT_TRY(meta_float(c, key, (float *)field));
        }
    }
    DT_TRY(meta_int(c, "dtrain.optim.steps", 0, &in->optim_steps));
    DT_TRY(meta_int(c, "dtrain.optim.size", 0, &c->optim_size));
    return read_shards(c);
}

static dt_status open_shard(dt_ckpt *c, int r, dt_st_file **out);

dt_status dt_ckpt_open(const char *path, dt_ckpt **out) {
    *out = NULL;
    if (!path || !*path) return dt_error(DT_ERR_INVALID, "checkpoint: empty path");
    struct stat st;
    if (stat(path, &st) != 0)
        return dt_error(DT_ERR_IO, "%s: no such checkpoint: %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_error(DT_ERR_INVALID, "%s: not a checkpoint directory (expected DIR/step-<step>/)", path);
    dt_ckpt *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    char model_path[DT_CKPT_PATH_MAX_];
    dt_status s = dt_ckpt_join_(c->path, sizeof c->path, path, NULL);
    if (s == DT_OK) s = dt_ckpt_join_(c->state_path, sizeof c->state_path, path, "train_state.safetensors");
    if (s == DT_OK) s = dt_ckpt_join_(model_path, sizeof model_path, path, "model.safetensors");
    if (s == DT_OK) s = open_verified(c->state_path, &c->state);
    if (s == DT_OK) s = read_info(c);
    if (s == DT_OK) s = open_verified(model_path, &c->model);
    if (s == DT_OK) {
        /* both files must come from the same save */
        const char *want = dt_st_meta_get(c->state, "dtrain.model_checksum");
        const char *got = dt_st_meta_get(c->model, DT_CKPT_SUM_KEY_);
        if (!want || (strcmp(want, got) != 0 && !dt_testing_unverified()))
            s = dt_error(DT_ERR_FORMAT, "%s: model.safetensors (%s) is not the one train_state.safetensors was saved "
                         "with (%s)", path, got, want ? want : "none recorded");
    }
    /* every shard of a sharded one, one at a time (a rank later reads the ones it needs) */
    for (int r = 0; s == DT_OK && r < c->info.shards; r++) {
        dt_st_file *f = NULL;
        s = open_shard(c, r, &f);
        dt_st_close(f);
    }
    if (s != DT_OK) {
        dt_ckpt_close(c);
        return s;
    }
    *out = c;
    return DT_OK;
}

/* f's "optim.*" tensors against o's state names: each F32 [n], none missing or extra. */
static dt_status check_state_tensors(const dt_st_file *f, const char *label, dt_optim *o, size_t n) {
    const char *want = dt_optim_def_in(o)->name;
    int ns = dt_optim_nstate(o), nfile = 0;
    for (size_t i = 0; i < dt_st_count(f); i++) {
        dt_st_tensor t;
        DT_TRY(dt_st_tensor_at(f, i, &t));
        if (strncmp(t.name, "optim.", 6) != 0) continue;
        int found = 0;
        for (int j = 0; j < ns && !found; j++) found = strcmp(t.name + 6, dt_optim_state_name(o, j)) == 0;
        if (!found)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' has no counterpart in this %s optimizer (momentum %g)",
                            label, t.name, want, (double)dt_optim_config_of(o)->momentum);
        if (t.dtype != DT_F32 || t.ndim != 1 || (uint64_t)t.shape[0] != (uint64_t)n)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is %s of %d dimensions in the file, the optimizer "
                            "expects F32 [%zu]", label, t.name, dt_dtype_st_name(t.dtype), t.ndim, n);
        nfile++;
    }
    for (int j = 0; nfile != ns && j < ns; j++) {
        char name[96];
        dt_st_tensor t;
        snprintf(name, sizeof name, "optim.%s", dt_optim_state_name(o, j));
        if (dt_st_find(f, name, &t) != DT_OK)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is missing (the optimizer keeps it)", label, name);
    }
    return DT_OK;
}

/* The optimizer's kind and the whole state's size (total elements). */
static dt_status check_optim(dt_ckpt *c, dt_optim *o, size_t total) {
    const dt_ckpt_info *in = &c->info;
    const char *want = dt_optim_def_in(o)->name;
    if (!in->has_optim)
        return dt_error(DT_ERR_FORMAT, "checkpoint %s holds no optimizer state; this run uses '%s'", c->path, want);
    const char *got = dt_optim_def_of(in->optim.kind)->name;
    if (strcmp(got, want) != 0)
        return dt_error(DT_ERR_FORMAT, "checkpoint %s was written by optimizer '%s'; this run uses '%s' (a run "
                        "cannot resume with another optimizer)", c->path, got, want);
    if ((uint64_t)c->optim_size != (uint64_t)total)
        return dt_error(DT_ERR_FORMAT, "%s: optimizer state is for %" PRId64 " parameters, the optimizer has %zu",
                        c->state_path, c->optim_size, total);
    return in->shards ? DT_OK : check_state_tensors(c->state, c->state_path, o, total);
}

/* Open shard r of a sharded checkpoint, verified: its checksum the manifest's, its
 * range and its "params" tensor [len]. */
static dt_status open_shard(dt_ckpt *c, int r, dt_st_file **out) {
    char name[64], path[DT_CKPT_PATH_MAX_];
    dt_ckpt_shard_name_(name, sizeof name, r, c->info.shards);
    DT_TRY(dt_ckpt_join_(path, sizeof path, c->path, name));
    dt_st_file *f;
    DT_TRY(open_verified(path, &f));
    const char *sum = dt_st_meta_get(f, DT_CKPT_SUM_KEY_), *lo = dt_st_meta_get(f, "dtrain.shard.lo");
    const char *len = dt_st_meta_get(f, "dtrain.shard.len");
    char want_lo[24], want_len[24];
    snprintf(want_lo, sizeof want_lo, "%zu", c->slo[r]);
    snprintf(want_len, sizeof want_len, "%zu", c->slen[r]);
    dt_st_tensor t;
    dt_status s = DT_OK;
    if ((strcmp(sum, c->ssum[r]) != 0 && !dt_testing_unverified()) || !lo || !len || strcmp(lo, want_lo) != 0 ||
        strcmp(len, want_len) != 0)
        s = dt_error(DT_ERR_FORMAT, "%s: not the shard train_state.safetensors was saved with (checksum %s, range "
                     "%s + %s; recorded %s, %zu + %zu)", path, sum, lo ? lo : "?", len ? len : "?", c->ssum[r],
                     c->slo[r], c->slen[r]);
    else if (dt_st_find(f, "params", &t) != DT_OK || t.dtype != DT_F32 || t.ndim != 1 ||
             (uint64_t)t.shape[0] != (uint64_t)c->slen[r])
        s = dt_error(DT_ERR_FORMAT, "%s: no F32 tensor 'params' of %zu elements", path, c->slen[r]);
    if (s != DT_OK) {
        dt_st_close(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

/* [a, a + n) meets [b, b + m) in [*x, *y); 0 when it does not. */
static int meet(size_t a, size_t n, size_t b, size_t m, size_t *x, size_t *y) {
    *x = a > b ? a : b;
    *y = a + n < b + m ? a + n : b + m;
    return *x < *y;
}

/* The parameters [plo, phi) and the optimizer state [olo, olo + olen) out of f, whose
 * tensors cover [flo, flo + flen): params (one flat tensor, sharded) or the model's
 * named tensors (pnames, unsharded), and "optim.<name>". */
static dt_status copy_ranges(dt_model *m, const dt_st_file *f, size_t flo, size_t flen, int sharded, size_t plo,
                             size_t phi, dt_optim *o, size_t olo) {
    const dt_ops *ops = dt_model_ops(m);
    size_t x, y;
    dt_st_tensor t;
    if (sharded && meet(flo, flen, plo, phi - plo, &x, &y)) {
        DT_TRY(dt_st_find(f, "params", &t));
        DT_TRY(ops->copy_h2d(dt_model_params(m) + x, (const float *)t.data + (x - flo), (y - x) * sizeof(float)));
    }
    for (int i = 0; !sharded && i < dt_model_nparam_tensors(m); i++) {
        dt_tensor_info ti;
        DT_TRY(dt_model_param(m, i, &ti));
        if (!meet(ti.offset, (size_t)ti.numel, plo, phi - plo, &x, &y)) continue;
        DT_TRY(dt_st_find(f, ti.name, &t));
        DT_TRY(ops->copy_h2d(dt_model_params(m) + x, (const float *)t.data + (x - ti.offset), (y - x) * sizeof(float)));
    }
    for (int j = 0; o && j < dt_optim_nstate(o); j++) {
        char name[96];
        if (!meet(flo, flen, olo, dt_optim_size(o), &x, &y)) break;
        snprintf(name, sizeof name, "optim.%s", dt_optim_state_name(o, j));
        DT_TRY(dt_st_find(f, name, &t));
        DT_TRY(ops->copy_h2d(dt_optim_state(o, j) + (x - olo), (const float *)t.data + (x - flo), (y - x) * sizeof(float)));
    }
    return DT_OK;
}

dt_status dt_ckpt_restore(dt_ckpt *c, dt_model *m, dt_optim *o) {
    return dt_ckpt_restore_range(c, m, 0, dt_model_nparams(m), o, 0);
}

dt_status dt_ckpt_restore_range(dt_ckpt *c, dt_model *m, size_t plo, size_t phi, dt_optim *o, size_t olo) {
    size_t n = dt_model_nparams(m);
    if (plo > phi || phi > n || (o && (olo > n || dt_optim_size(o) > n - olo)))
        return dt_error(DT_ERR_INVALID, "checkpoint restore: ranges [%zu, %zu) and %zu + %zu outside the model's %zu "
                        "parameters", plo, phi, olo, o ? dt_optim_size(o) : 0, n);
    char label[DT_CKPT_PATH_MAX_ + 32];
    snprintf(label, sizeof label, "%s/model.safetensors", c->path);
    int sharded = c->info.shards > 0;
    /* Check everything first: a mismatch leaves the model and optimizer as they were.
     * The shards must hold every parameter of the model, whichever range this rank
     * reads and with or without an optimizer: a parameter they lack would keep the
     * model's fresh initialisation. (Unsharded, model.safetensors is checked tensor
     * by tensor against the model.) */
    if (sharded && c->stotal != (uint64_t)n)
        return dt_error(DT_ERR_FORMAT, "%s: its %d shards hold %" PRIu64 " parameters, the model has %zu (the "
                        "shards are not of this model)", c->state_path, c->info.shards, c->stotal, n);
    DT_TRY(dt_model_state_check_part(m, sharded ? DT_STATE_BUFFERS : DT_STATE_ALL, c->model, label));
    if (o) DT_TRY(check_optim(c, o, n));
    if (!sharded) {
        DT_TRY(dt_model_state_copy_part(m, DT_STATE_BUFFERS, c->model));
        DT_TRY(copy_ranges(m, c->model, 0, 0, 0, plo, phi, NULL, 0));
        DT_TRY(copy_ranges(m, c->state, 0, n, 0, 0, 0, o, olo));
    } else {
        /* the shards this rank needs, all opened and checked before the first copy */
        int w = c->info.shards;
        dt_st_file **f = calloc((size_t)w, sizeof *f);
        if (!f) return dt_error(DT_ERR_NOMEM, "%s: out of memory", c->path);
        dt_status s = DT_OK;
        for (int r = 0; s == DT_OK && r < w; r++) {
            size_t x, y;
            if (!meet(c->slo[r], c->slen[r], plo, phi - plo, &x, &y) &&
                !(o && meet(c->slo[r], c->slen[r], olo, dt_optim_size(o), &x, &y)))
                continue;
            s = open_shard(c, r, &f[r]);
            if (s == DT_OK && o) s = check_state_tensors(f[r], c->path, o, c->slen[r]);
        }
        if (s == DT_OK) s = dt_model_state_copy_part(m, DT_STATE_BUFFERS, c->model);
        for (int r = 0; s == DT_OK && r < w; r++)
            if (f[r]) s = copy_ranges(m, f[r], c->slo[r], c->slen[r], 1, plo, phi, o, olo);
        for (int r = 0; r < w; r++) dt_st_close(f[r]);
        free(f);
        DT_TRY(s);
    }
    if (o) dt_optim_set_steps(o, c->info.optim_steps);
    return DT_OK;
}

/* ---- finding the newest valid checkpoint ---------------------------------------------- */

/* The step-* directories of dir, newest first (ckpt_dir.c lists them), opened one by one:
 * the first that opens (format, checksums, metadata) is the newest valid one. */

dt_status dt_ckpt_latest(const char *dir, char *path, size_t n, char *skipped, size_t skipped_n) {
    if (skipped && skipped_n) skipped[0] = '\0';
    if (path && n) path[0] = '\0';
    if (!dir || !*dir) return dt_error(DT_ERR_INVALID, "checkpoint: empty directory name");
    if (!path || !n) return dt_error(DT_ERR_INVALID, "checkpoint: no buffer for the path");
    dt_ckpt_entry_ *v;
    size_t cnt;
    int missing;
    DT_TRY(dt_ckpt_list_(dir, &v, &cnt, &missing));
    if (missing) return dt_error(DT_ERR_IO, "no checkpoint in %s (the directory does not exist)", dir);
    if (cnt == 0) {
        free(v);
        return dt_error(DT_ERR_IO, "no checkpoint in %s", dir);
    }
    char first[512] = "";
    dt_status s = DT_ERR_FORMAT;
    for (size_t i = 0; i < cnt; i++) {
        char p[DT_CKPT_PATH_MAX_];
        dt_ckpt *c = NULL;
        dt_status si = dt_ckpt_join_(p, sizeof p, dir, v[i].name);
        if (si == DT_OK) si = dt_ckpt_open(p, &c);
        if (si == DT_OK) {
            dt_ckpt_close(c);
            s = dt_ckpt_join_(path, n, p, NULL);
            break;
        }
        if (si == DT_ERR_NOMEM) {
            s = si;
            break;
        }
        if (!first[0]) snprintf(first, sizeof first, "%s", dt_last_error());
        if (skipped && skipped_n) {
            size_t k = strlen(skipped);
            if (k + 1 < skipped_n) snprintf(skipped + k, skipped_n - k, "%s\n", dt_last_error());
        }
    }
    free(v);
    if (s == DT_ERR_FORMAT)
        return dt_error(DT_ERR_FORMAT, "no valid checkpoint in %s: all %zu are damaged; the newest: %s", dir, cnt,
                        first);
    return s;
}

dt_status dt_ckpt_load(const char *path, dt_model *m, dt_optim *o, dt_ckpt **out) {
    dt_ckpt *c;
    if (out) *out = NULL;
    DT_TRY(dt_ckpt_open(path, &c));
    dt_status s = dt_ckpt_restore(c, m, o);
    if (s != DT_OK || !out) dt_ckpt_close(c);
    else *out = c;
    return s;
}
