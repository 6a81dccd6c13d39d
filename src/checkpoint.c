/*
 * checkpoint.c: model weights to and from safetensors files (see checkpoint.h).
 *
 * The three building blocks (gather the state into one host buffer, check a
 * file against the model, copy a checked file in) are shared with the training
 * checkpoints of ckpt.c, so both write and verify a model file the same way.
 */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static size_t state_bytes(const dt_tensor_info *ti) { return (size_t)ti->numel * dt_dtype_size(ti->dtype); }

static int in_part(const dt_tensor_info *ti, dt_state_part part) { return part == DT_STATE_ALL || !ti->in_params; }

/* A tensor the writer can read where it is (no host copy first). */
static int on_host(const dt_ops *ops, const dt_tensor_info *ti) { return ti->on_host || ops->host_memory; }

dt_status dt_model_state_add(dt_model *m, dt_st_writer *w, void **host, size_t *nbytes) {
    return dt_model_state_add_part(m, DT_STATE_ALL, w, host, nbytes);
}

dt_status dt_model_state_add_part(dt_model *m, dt_state_part part, dt_st_writer *w, void **host, size_t *nbytes) {
    const dt_ops *ops = dt_model_ops(m);
    int n = dt_model_nstate(m);
    size_t total = 0, copied = 0;
    *host = NULL;
    *nbytes = 0;
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        DT_TRY(dt_model_state(m, i, &ti));
        if (!in_part(&ti, part)) continue;
        total += state_bytes(&ti);
        if (!on_host(ops, &ti)) copied += state_bytes(&ti);
    }
    /* device memory: one host buffer for all of it */
    unsigned char *h = copied ? malloc(copied) : NULL;
    if (copied && !h) return dt_error(DT_ERR_NOMEM, "out of memory copying %zu bytes of model state to the host", copied);
    dt_status s = DT_OK;
    size_t off = 0;
    for (int i = 0; s == DT_OK && i < n; i++) {
        dt_tensor_info ti;
        s = dt_model_state(m, i, &ti);
        if (s != DT_OK) break;
        if (!in_part(&ti, part)) continue;
        size_t b = state_bytes(&ti);
        const void *data = ti.data;
        if (!on_host(ops, &ti) && b) {
            s = ops->copy_d2h(h + off, ti.data, b);
            data = h + off;
            off += b;
        }
        if (s == DT_OK) s = dt_st_writer_add(w, ti.name, ti.dtype, ti.ndim, ti.shape, data);
    }
    if (s != DT_OK) {
        free(h);
        return s;
    }
    *host = h;
    *nbytes = total;
    return DT_OK;
}

/* "64,32,3,3" */
static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = 0;
    buf[0] = '\0';
    for (int d = 0; d < ndim && k + 24 < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", d ? "," : "", (long long)shape[d]);
}

dt_status dt_model_state_check(dt_model *m, const dt_st_file *f, const char *label) {
    return dt_model_state_check_part(m, DT_STATE_ALL, f, label);
}

dt_status dt_model_state_check_part(dt_model *m, dt_state_part part, const dt_st_file *f, const char *label) {
    int n = dt_model_nstate(m), want = 0;
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        dt_st_tensor st;
        DT_TRY(dt_model_state(m, i, &ti));
        if (!in_part(&ti, part)) continue;
        want++;
        if (dt_st_find(f, ti.name, &st) != DT_OK)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is missing (is this a checkpoint of another model?)",
                            label, ti.name);
        int same = st.dtype == ti.dtype && st.ndim == ti.ndim;
        for (int d = 0; same && d < ti.ndim; d++) same = st.shape[d] == ti.shape[d];
        if (!same) {
            char want[128], got[128];
            shape_str(want, sizeof want, ti.ndim, ti.shape);
            shape_str(got, sizeof got, st.ndim, st.shape);
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is %s [%s] in the file, the model expects %s [%s]", label,
                            ti.name, dt_dtype_st_name(st.dtype), got, dt_dtype_st_name(ti.dtype), want);
        }
    }
    if (dt_st_count(f) != (size_t)want)
        return dt_error(DT_ERR_FORMAT, "%s: holds %zu tensors, the model has %d (is this a checkpoint of another "
                        "model?)", label, dt_st_count(f), want);
    return DT_OK;
}

dt_status dt_model_state_copy(dt_model *m, const dt_st_file *f) {
    return dt_model_state_copy_part(m, DT_STATE_ALL, f);
}

dt_status dt_model_state_copy_part(dt_model *m, dt_state_part part, const dt_st_file *f) {
    const dt_ops *ops = dt_model_ops(m);
    int n = dt_model_nstate(m);
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        dt_st_tensor st;
        DT_TRY(dt_model_state(m, i, &ti));
        if (!in_part(&ti, part)) continue;
        DT_TRY(dt_st_find(f, ti.name, &st));
        if (st.nbytes != state_bytes(&ti))
            return dt_error(DT_ERR_INTERNAL, "tensor '%s': %zu bytes in the file, %zu in the model (not checked?)",
                            ti.name, st.nbytes, state_bytes(&ti));
        if (ti.on_host) memcpy(ti.data, st.data, st.nbytes);
        else if (st.nbytes) DT_TRY(ops->copy_h2d(ti.data, st.data, st.nbytes));
    }
    return DT_OK;
}

dt_status dt_model_save(dt_model *m, const char *path, const char *const *meta, int nmeta) {
    dt_st_writer *w = NULL;
    void *host = NULL;
    size_t nbytes;
    DT_TRY(dt_st_writer_init(&w));
    dt_status s = dt_model_state_add(m, w, &host, &nbytes);
    for (int i = 0; s == DT_OK && meta && i < nmeta; i++)
        s = dt_st_writer_set_meta(w, meta[2 * i], meta[2 * i + 1]);
    if (s == DT_OK) s = dt_st_writer_write(w, path);
    dt_st_writer_free(w);
    free(host);
    return s;
}

/* ---- files of other writers: Hugging Face's GPT-2 -------------------------------------
 * A file that does not hold exactly the model's names and shapes is read once more
 * with the rules of transformers' GPT2Model / GPT2LMHeadModel, which hold nanoGPT's
 * tensors under slightly other names and layouts:
 *   - names without the "transformer." prefix (GPT2Model: "h.0.ln_1.weight", "wte.weight");
 *   - the four projections attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj are Conv1D
 *     modules whose weight is stored [in, out], the transpose of nn.Linear's [out, in];
 *     a file is read so when its first c_attn weight is [C, 3C] (the model's is [3C, C];
 *     the square attn.c_proj alone could not tell);
 *   - the causal-mask buffers attn.bias and attn.masked_bias, which dtrain does not keep
 *     (the mask is implied), are skipped;
 *   - a tied weight stored once: lm_head.weight may be absent (it is wte's), or either
 *     name of the pair present (safetensors' save_model keeps one of them).
 * Everything is still checked before anything is copied. */

static int has_suffix(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

static int is_conv1d_weight(const char *name) {
    return has_suffix(name, ".attn.c_attn.weight") || has_suffix(name, ".attn.c_proj.weight") ||
           has_suffix(name, ".mlp.c_fc.weight") || has_suffix(name, ".mlp.c_proj.weight");
}

static int is_mask_buffer(const char *name) {
    return has_suffix(name, ".attn.bias") || has_suffix(name, ".attn.masked_bias") || !strcmp(name, "attn.bias") ||
           !strcmp(name, "attn.masked_bias");
}

/* The file's tensor for a model name: the name itself, or without "transformer."
 * (*renamed = 1 then). 0 when the file has neither. */
static int hf_find(const dt_st_file *f, const char *name, dt_st_tensor *st, int *renamed) {
    *renamed = 0;
    for (size_t i = 0; i < dt_st_count(f); i++) {   /* dt_st_find would leave an error message */
        if (dt_st_tensor_at(f, i, st) != DT_OK) continue;
        if (!strcmp(st->name, name)) return 1;
        if (!strncmp(name, "transformer.", 12) && !strcmp(st->name, name + 12)) return (*renamed = 1);
    }
    return 0;
}

typedef struct {
    dt_st_tensor st;     /* where the model's tensor comes from */
    int          transpose;
} hf_source;

/* Resolve every model tensor in f under the rules above into src (nstate entries).
 * *hf_like: the file used one of the rules (another name, layout, a skipped buffer or
 * a tied name absent), so its errors are those to report. */
static dt_status hf_resolve(dt_model *m, const dt_st_file *f, const char *label, hf_source *src, int *hf_like) {
    int n = dt_model_nstate(m), conv1d = 0, renamed;
    *hf_like = 0;
    for (int i = 0; i < n; i++) {   /* the layout, from the first c_attn weight */
        dt_tensor_info ti;
        dt_st_tensor st;
        DT_TRY(dt_model_state(m, i, &ti));
        if (!has_suffix(ti.name, ".attn.c_attn.weight") || ti.ndim != 2) continue;
        if (hf_find(f, ti.name, &st, &renamed) && st.ndim == 2 && st.shape[0] == ti.shape[1] &&
            st.shape[1] == ti.shape[0])
            *hf_like = conv1d = 1;
        break;
    }
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        DT_TRY(dt_model_state(m, i, &ti));
        src[i].transpose = conv1d && ti.ndim == 2 && is_conv1d_weight(ti.name);
        if (hf_find(f, ti.name, &src[i].st, &renamed)) {
            if (renamed) *hf_like = 1;
        } else {
            src[i].st.name = NULL;
        }
    }
    /* a tensor absent under its names takes its tied partner's (the same memory) */
    for (int i = 0; i < n; i++) {
        if (src[i].st.name) continue;
        dt_tensor_info ti, tj;
        DT_TRY(dt_model_state(m, i, &ti));
        for (int j = 0; j < n && !src[i].st.name; j++) {
            if (j == i || !src[j].st.name) continue;
            DT_TRY(dt_model_state(m, j, &tj));
            if (tj.data == ti.data && tj.is_param != ti.is_param) {
                src[i] = src[j];
                *hf_like = 1;
            }
        }
        if (!src[i].st.name)
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is missing%s (is this a checkpoint of another model?)",
                            label, ti.name, strncmp(ti.name, "transformer.", 12) ? "" : ", also without 'transformer.'");
    }
    for (int i = 0; i < n; i++) {   /* dtypes and shapes, in the file's layout */
        dt_tensor_info ti;
        DT_TRY(dt_model_state(m, i, &ti));
        const dt_st_tensor *st = &src[i].st;
        int64_t want[4];
        memcpy(want, ti.shape, sizeof want);
        if (src[i].transpose) { want[0] = ti.shape[1]; want[1] = ti.shape[0]; }
        int same = st->dtype == ti.dtype && st->ndim == ti.ndim;
        for (int d = 0; same && d < ti.ndim; d++) same = st->shape[d] == want[d];
        if (!same) {
            char w[128], got[128];
            shape_str(w, sizeof w, ti.ndim, want);
            shape_str(got, sizeof got, st->ndim, st->shape);
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is %s [%s] in the file, the model expects %s [%s]%s", label,
                            st->name, dt_dtype_st_name(st->dtype), got, dt_dtype_st_name(ti.dtype), w,
                            src[i].transpose ? " (Conv1D's [in, out], as the file's c_attn weight is stored)" : "");
        }
    }
    /* every tensor of the file is the model's, or a mask buffer */
    for (size_t k = 0; k < dt_st_count(f); k++) {
        dt_st_tensor st;
        DT_TRY(dt_st_tensor_at(f, k, &st));
        int used = 0;
        for (int i = 0; i < n && !used; i++) used = src[i].st.name && !strcmp(src[i].st.name, st.name);
        if (used) continue;
        if (!is_mask_buffer(st.name))
            return dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is not one of the model's (is this a checkpoint of another "
                            "model?)", label, st.name);
        *hf_like = 1;
    }
    return DT_OK;
}

/* Copy the resolved tensors in, transposing the Conv1D weights [in, out] -> [out, in]. */
static dt_status hf_copy(dt_model *m, const hf_source *src) {
    const dt_ops *ops = dt_model_ops(m);
    int n = dt_model_nstate(m);
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        DT_TRY(dt_model_state(m, i, &ti));
        const void *from = src[i].st.data;
        float *tmp = NULL;
        if (src[i].transpose) {
            int64_t out = ti.shape[0], in = ti.shape[1];
            const float *w = from;   /* (in, out) */
            if (!(tmp = malloc(src[i].st.nbytes ? src[i].st.nbytes : 1)))
                return dt_error(DT_ERR_NOMEM, "out of memory transposing '%s'", src[i].st.name);
            for (int64_t o = 0; o < out; o++)
                for (int64_t k = 0; k < in; k++) tmp[o * in + k] = w[k * out + o];
            from = tmp;
        }
        dt_status s = DT_OK;
        if (ti.on_host) memcpy(ti.data, from, src[i].st.nbytes);
        else if (src[i].st.nbytes) s = ops->copy_h2d(ti.data, from, src[i].st.nbytes);
        free(tmp);
        DT_TRY(s);
    }
    return DT_OK;
}

/* The direct check failed with status `direct` (its message in dt_last_error()): read
 * f under Hugging Face's rules. When the file uses none of them, the direct message
 * stands. */
static dt_status load_hf(dt_model *m, const dt_st_file *f, const char *label, dt_status direct) {
    char first[1024];
    snprintf(first, sizeof first, "%s", dt_last_error());
    int n = dt_model_nstate(m), hf_like = 0;
    hf_source *src = calloc((size_t)n + 1, sizeof *src);
    if (!src) return dt_error(DT_ERR_NOMEM, "out of memory reading %s", label);
    dt_status s = hf_resolve(m, f, label, src, &hf_like);
    if (s == DT_OK) s = hf_copy(m, src);
    else if (!hf_like) s = dt_error(direct, "%s", first);
    free(src);
    return s;
}

/* ---- which file: one safetensors file, or a sharded checkpoint's index ---------------
 * A directory is read as Hugging Face's save_pretrained leaves it: its model.safetensors,
 * else its model.safetensors.index.json; a path ending in .json is an index. */

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* "<dir>/<name>" (one '/' between them) into a new buffer, or NULL. */
static char *path_in(const char *dir, const char *name) {
    size_t dl = strlen(dir), n = dl + strlen(name) + 2;
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%.*s/%s", (int)dl, dir, name);
    return p;
}

/* The file dt_model_load reads for path (a new string: path itself unless a directory). */
static dt_status weights_file(const char *path, char **out) {
    static const char *const names[] = {"model.safetensors", "model.safetensors.index.json"};
    struct stat st;
    *out = NULL;
    if (!is_dir(path)) {
        if (!(*out = strdup(path))) return dt_error(DT_ERR_NOMEM, "out of memory reading %s", path);
        return DT_OK;
    }
    for (int i = 0; i < 2; i++) {
        if (!(*out = path_in(path, names[i]))) return dt_error(DT_ERR_NOMEM, "out of memory reading %s", path);
        if (stat(*out, &st) == 0) return DT_OK;
        free(*out);
        *out = NULL;
    }
    return dt_error(DT_ERR_IO, "%s: a directory without model.safetensors or model.safetensors.index.json", path);
}

dt_status dt_model_load(dt_model *m, const char *path) {
    dt_st_file *f = NULL;
    char *file = NULL;
    DT_TRY(weights_file(path, &file));
    dt_status s = has_suffix(file, ".json") ? dt_st_open_index(file, &f) : dt_st_open(file, &f);
    /* Check everything before changing anything: a failed load leaves the model as it was. */
    if (s == DT_OK && (s = dt_model_state_check(m, f, file)) == DT_OK) s = dt_model_state_copy(m, f);
    else if (s == DT_ERR_FORMAT && f) s = load_hf(m, f, file, s);
    dt_st_close(f);
    free(file);
    return s;
}
