/*
 * tensor.h: a dense, row-major block of device memory with a shape.
 *
 * A dt_tensor is deliberately thin: a data pointer on some device (the dt_ops table
 * that allocated it), an element type and up to DT_TENSOR_MAX_DIMS sizes. It carries
 * no autograd and no strides; layers pass t.data to the kernels of ops.h. A view
 * shares another tensor's memory (a slice of a flat parameter buffer, a micro-batch
 * of a batch) and never frees it.
 *
 * The element type is dt_dtype from dtype.h (shared with the collectives and the
 * file formats, so a tensor's dtype is what an all-reduce or a safetensors file is
 * told).
 */
#ifndef DT_TENSOR_H
#define DT_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "dtype.h"
#include "ops.h"

#define DT_TENSOR_MAX_DIMS 6

typedef struct {
    const dt_ops *ops;                    /* the device holding data */
    void         *data;                   /* device memory (NULL when numel == 0) */
    dt_dtype      dtype;
    int           ndim;                   /* 0 .. DT_TENSOR_MAX_DIMS (0 = scalar) */
    int64_t       shape[DT_TENSOR_MAX_DIMS];
    size_t        numel;                  /* product of shape */
    int           owns;                   /* 1: data is freed by dt_tensor_free */
} dt_tensor;

/* Allocate an uninitialised tensor of shape[0..ndim) on ops' device. */
DT_API dt_status dt_tensor_alloc(dt_tensor *t, const dt_ops *ops, dt_dtype dtype, int ndim, const int64_t *shape);
/* The same, zero-filled. */
DT_API dt_status dt_tensor_zeros(dt_tensor *t, const dt_ops *ops, dt_dtype dtype, int ndim, const int64_t *shape);
/* Free an owning tensor's memory (a view's memory is left alone); t becomes empty. */
DT_API void      dt_tensor_free(dt_tensor *t);

/* A view of numel(shape) elements of src starting at element `offset` (must fit). */
DT_API dt_status dt_tensor_view(dt_tensor *view, const dt_tensor *src, size_t offset, int ndim, const int64_t *shape);
/* Wrap existing device memory as a non-owning tensor. */
DT_API dt_status dt_tensor_wrap(dt_tensor *t, const dt_ops *ops, void *data, dt_dtype dtype, int ndim, const int64_t *shape);

/* Total bytes of the data. */
DT_API size_t    dt_tensor_bytes(const dt_tensor *t);
/* 1 if a and b have the same dtype and shape. */
DT_API int       dt_tensor_same_shape(const dt_tensor *a, const dt_tensor *b);
/* "f32[256, 1, 28, 28]" into buf (always terminated). */
DT_API const char *dt_tensor_str(const dt_tensor *t, char *buf, size_t size);

/* Copy all bytes from host memory into t / from t to host memory (bytes must equal dt_tensor_bytes). */
DT_API dt_status dt_tensor_from_host(dt_tensor *t, const void *src, size_t bytes);
DT_API dt_status dt_tensor_to_host(const dt_tensor *t, void *dst, size_t bytes);
/* dst = src (same dtype and numel; shapes may differ), on the same device. */
DT_API dt_status dt_tensor_copy(dt_tensor *dst, const dt_tensor *src);

#endif /* DT_TENSOR_H */
