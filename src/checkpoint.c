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

static size_t state_bytes(const dt_tensor_info *ti) { return (size_t)ti->numel * dt_dtype_size(ti->dtype); }

dt_status dt_model_state_add(dt_model *m, dt_st_writer *w, void **host, size_t *nbytes) {
    const dt_ops *ops = dt_model_ops(m);
    int n = dt_model_nstate(m);
    size_t total = 0;
    *host = NULL;
    *nbytes = 0;
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        DT_TRY(dt_model_state(m, i, &ti));
        total += state_bytes(&ti);
    }
    /* One buffer, tensors back to back in state_dict order: exactly the data
     * region of the file, so a checksum over it is the checksum of the file's data. */
    unsigned char *h = malloc(total ? total : 1);
    if (!h) return dt_error(DT_ERR_NOMEM, "out of memory copying %zu bytes of model state to the host", total);
    dt_status s = DT_OK;
    size_t off = 0;
    for (int i = 0; s == DT_OK && i < n; i++) {
        dt_tensor_info ti;
        s = dt_model_state(m, i, &ti);
        if (s != DT_OK) break;
        size_t b = state_bytes(&ti);
        if (ti.on_host) memcpy(h + off, ti.data, b);
        else if (b) s = ops->copy_d2h(h + off, ti.data, b);
        if (s == DT_OK) s = dt_st_writer_add(w, ti.name, ti.dtype, ti.ndim, ti.shape, h + off);
        off += b;
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
    int n = dt_model_nstate(m);
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        dt_st_tensor st;
        DT_TRY(dt_model_state(m, i, &ti));
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
    if (dt_st_count(f) != (size_t)n)
        return dt_error(DT_ERR_FORMAT, "%s: holds %zu tensors, the model has %d (is this a checkpoint of another "
                        "model?)", label, dt_st_count(f), n);
    return DT_OK;
}

dt_status dt_model_state_copy(dt_model *m, const dt_st_file *f) {
    const dt_ops *ops = dt_model_ops(m);
    int n = dt_model_nstate(m);
    for (int i = 0; i < n; i++) {
        dt_tensor_info ti;
        dt_st_tensor st;
        DT_TRY(dt_model_state(m, i, &ti));
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

dt_status dt_model_load(dt_model *m, const char *path) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(path, &f));
    /* Check everything before changing anything: a failed load leaves the model as it was. */
    dt_status s = dt_model_state_check(m, f, path);
    if (s == DT_OK) s = dt_model_state_copy(m, f);
    dt_st_close(f);
    return s;
}
