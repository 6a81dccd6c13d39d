/*
 * tensor.c: allocation, views and host transfers of dt_tensor through its dt_ops.
 */
#include "tensor.h"

#include <stdio.h>
#include <string.h>

/* Fill the shape fields of t; checks ndim, dtype and that the element count fits. */
static dt_status tensor_shape(dt_tensor *t, dt_dtype dtype, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > DT_TENSOR_MAX_DIMS)
        return dt_error(DT_ERR_INVALID, "tensor: %d dimensions (at most %d)", ndim, DT_TENSOR_MAX_DIMS);
    if (ndim > 0 && !shape) return dt_error(DT_ERR_INVALID, "tensor: NULL shape for %d dimensions", ndim);
    size_t es = dt_dtype_size(dtype);
    if (es == 0) return dt_error(DT_ERR_INVALID, "tensor: unknown dtype %d", (int)dtype);
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return dt_error(DT_ERR_INVALID, "tensor: dimension %d has negative size %lld", i, (long long)shape[i]);
        if (shape[i] > 0 && n > SIZE_MAX / es / (size_t)shape[i])
            return dt_error(DT_ERR_INVALID, "tensor: shape too large");
        n *= (size_t)shape[i];
    }
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    t->numel = n;
    return DT_OK;
}

dt_status dt_tensor_alloc(dt_tensor *t, const dt_ops *ops, dt_dtype dtype, int ndim, const int64_t *shape) {
    if (!t || !ops) return dt_error(DT_ERR_INVALID, "tensor alloc: NULL tensor or ops");
    DT_TRY(tensor_shape(t, dtype, ndim, shape));
    t->ops = ops;
    t->owns = 1;
    dt_status s = ops->alloc(&t->data, dt_tensor_bytes(t));
    if (s != DT_OK) {
        t->owns = 0;
        return s;
    }
    return DT_OK;
}

dt_status dt_tensor_zeros(dt_tensor *t, const dt_ops *ops, dt_dtype dtype, int ndim, const int64_t *shape) {
    DT_TRY(dt_tensor_alloc(t, ops, dtype, ndim, shape));
    dt_status s = ops->zero(t->data, dt_tensor_bytes(t));
    if (s != DT_OK) dt_tensor_free(t);
    return s;
}

void dt_tensor_free(dt_tensor *t) {
    if (!t) return;
    if (t->owns && t->ops && t->data) t->ops->free(t->data);
    memset(t, 0, sizeof *t);
}

dt_status dt_tensor_view(dt_tensor *view, const dt_tensor *src, size_t offset, int ndim, const int64_t *shape) {
    if (!view || !src) return dt_error(DT_ERR_INVALID, "tensor view: NULL tensor");
    dt_tensor v;
    DT_TRY(tensor_shape(&v, src->dtype, ndim, shape));
    if (offset > src->numel || v.numel > src->numel - offset)
        return dt_error(DT_ERR_INVALID, "tensor view: %zu elements at offset %zu do not fit in %zu", v.numel, offset, src->numel);
    v.ops = src->ops;
    v.data = src->data ? (char *)src->data + offset * dt_dtype_size(src->dtype) : NULL;
    v.owns = 0;
    *view = v;
    return DT_OK;
}

dt_status dt_tensor_wrap(dt_tensor *t, const dt_ops *ops, void *data, dt_dtype dtype, int ndim, const int64_t *shape) {
    if (!t || !ops) return dt_error(DT_ERR_INVALID, "tensor wrap: NULL tensor or ops");
    dt_tensor v;
    DT_TRY(tensor_shape(&v, dtype, ndim, shape));
    if (v.numel > 0 && !data) return dt_error(DT_ERR_INVALID, "tensor wrap: NULL data for %zu elements", v.numel);
    v.ops = ops;
    v.data = data;
    *t = v;
    return DT_OK;
}

size_t dt_tensor_bytes(const dt_tensor *t) { return t ? t->numel * dt_dtype_size(t->dtype) : 0; }

int dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b) {
    if (!a || !b || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *dt_tensor_str(const dt_tensor *t, char *buf, size_t size) {
    if (!buf || size == 0) return buf;
    if (!t) {
        snprintf(buf, size, "(null)");
        return buf;
    }
    size_t at = 0;
    int n = snprintf(buf, size, "%s[", dt_dtype_name(t->dtype));
    at = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < t->ndim && at < size; i++) {
        n = snprintf(buf + at, size - at, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        if (n > 0) at += (size_t)n;
    }
    if (at < size) snprintf(buf + at, size - at, "]");
    return buf;
}

dt_status dt_tensor_from_host(dt_tensor *t, const void *src, size_t bytes) {
    if (!t || !t->ops) return dt_error(DT_ERR_INVALID, "tensor from_host: empty tensor");
    if (bytes != dt_tensor_bytes(t))
        return dt_error(DT_ERR_INVALID, "tensor from_host: %zu bytes given for a tensor of %zu", bytes, dt_tensor_bytes(t));
    return t->ops->copy_h2d(t->data, src, bytes);
}

dt_status dt_tensor_to_host(const dt_tensor *t, void *dst, size_t bytes) {
    if (!t || !t->ops) return dt_error(DT_ERR_INVALID, "tensor to_host: empty tensor");
    if (bytes != dt_tensor_bytes(t))
        return dt_error(DT_ERR_INVALID, "tensor to_host: buffer of %zu bytes for a tensor of %zu", bytes, dt_tensor_bytes(t));
    return t->ops->copy_d2h(dst, t->data, bytes);
}

dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src) {
    if (!dst || !src || !dst->ops) return dt_error(DT_ERR_INVALID, "tensor copy: empty tensor");
    if (dst->dtype != src->dtype || dst->numel != src->numel)
        return dt_error(DT_ERR_INVALID, "tensor copy: %s[%zu] into %s[%zu]", dt_dtype_name(src->dtype), src->numel,
                        dt_dtype_name(dst->dtype), dst->numel);
    if (dst->ops != src->ops) return dt_error(DT_ERR_INVALID, "tensor copy: tensors are on different devices (%s, %s)",
                                              src->ops ? src->ops->name : "?", dst->ops->name);
    return dst->ops->copy_d2d(dst->data, src->data, dt_tensor_bytes(dst));
}
