/*
 * safetensors_impl.h: helpers shared by the safetensors writer and reader
 * (not installed).
 */
#ifndef DT_SAFETENSORS_IMPL_H
#define DT_SAFETENSORS_IMPL_H

#include "safetensors.h"
#include "sbuf.h"

/* 1 if s[0..n) is well-formed UTF-8. */
int       dt_utf8_valid_(const unsigned char *s, size_t n);
/* Bytes of a tensor of dtype t and shape; DT_ERR_FORMAT on a negative
 * dimension or overflow. */
dt_status dt_st_tensor_bytes_(dt_dtype t, int ndim, const int64_t *shape, uint64_t *bytes);

#endif /* DT_SAFETENSORS_IMPL_H */
