/*
 * checkpoint.c: model weights to and from safetensors files (see checkpoint.h).
 */
#include "checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

static dt_st_dtype st_dtype(dt_dtype t) { return t == DT_I64 ? DT_ST_I64 : DT_ST_F32; }

/* Copy a state tensor to host memory (malloc'd) for writing or comparing. */
static dt_status state_to_host(const dt_ops *ops, const dt_tensor_info *ti, void **out) {
    size_t bytes = (size_t)ti->numel * (ti->dtype == DT_I64 ? 8 : 4);
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return dt_error(DT_ERR_NOMEM, "out of memory copying %s to the host", ti->name);
    dt_status s = ti->on_host ? (memcpy(h, ti->data, bytes), DT_OK) : ops->copy_d2h(h, ti->data, bytes);
    if (s != DT_OK) { free(h); return s; }
    *out = h;
    return DT_OK;
}

dt_status dt_model_save(dt_model *m, const char *path, const char *const *meta, int nmeta) {
    const dt_ops *ops = dt_model_ops(m);
    int n = dt_model_nstate(m);
    void **host = calloc((size_t)(n > 0 ? n : 1), sizeof *host);
    dt_st_writer *w = NULL;
    if (!host) return dt_error(DT_ERR_NOMEM, "out of memory saving %s", path);
    dt_status s = dt_st_writer_init(&w);
    for (int i = 0; s == DT_OK && i < n; i++) {
        dt_tensor_info ti;
        s = dt_model_state(m, i, &ti);
        if (s == DT_OK) s = state_to_host(ops, &ti, &host[i]);
        if (s == DT_OK) s = dt_st_writer_add(w, ti.name, st_dtype(ti.dtype), ti.ndim, ti.shape, host[i]);
    }
    for (int i = 0; s == DT_OK && meta && i < nmeta; i++)
        s = dt_st_writer_set_meta(w, meta[2 * i], meta[2 * i + 1]);
    if (s == DT_OK) s = dt_st_writer_write(w, path);
    dt_st_writer_free(w);
    for (int i = 0; i < n; i++) free(host[i]);
    free(host);
    return s;
}

dt_status dt_model_load(dt_model *m, const char *path) {
    const dt_ops *ops = dt_model_ops(m);
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(path, &f));
    dt_status s = DT_OK;
    int n = dt_model_nstate(m);
    /* Check everything before changing anything: a failed load leaves the model as it was. */
    for (int pass = 0; pass < 2 && s == DT_OK; pass++) {
        if (pass == 1 && dt_st_count(f) != (size_t)n) {
            s = dt_error(DT_ERR_FORMAT, "%s: holds %zu tensors, the model has %d (is this a checkpoint of another model?)",
                         path, dt_st_count(f), n);
            break;
        }
        for (int i = 0; s == DT_OK && i < n; i++) {
            dt_tensor_info ti;
            dt_st_tensor st;
            s = dt_model_state(m, i, &ti);
            if (s != DT_OK) break;
            if (dt_st_find(f, ti.name, &st) != DT_OK) {
                s = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is missing (is this a checkpoint of another model?)",
                             path, ti.name);
                break;
            }
            int same = st.dtype == st_dtype(ti.dtype) && st.ndim == ti.ndim;
            for (int d = 0; same && d < ti.ndim; d++) same = st.shape[d] == ti.shape[d];
            if (!same) {
                char want[96] = "", got[96] = "";
                for (int d = 0; d < ti.ndim; d++)
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "", (long long)ti.shape[d]);
                for (int d = 0; d < st.ndim && d < DT_ST_MAX_DIMS; d++)
                    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? "," : "", (long long)st.shape[d]);
                s = dt_error(DT_ERR_FORMAT, "%s: tensor '%s' is %s [%s] in the file, the model expects %s [%s]",
                             path, ti.name, dt_st_dtype_name(st.dtype), got, dt_st_dtype_name(st_dtype(ti.dtype)), want);
                break;
            }
            if (pass == 1) {
                if (ti.on_host) memcpy(ti.data, st.data, st.nbytes);
                else s = ops->copy_h2d(ti.data, st.data, st.nbytes);
            }
        }
    }
    dt_st_close(f);
    return s;
}
