/*
 * reduce.h: typed elementwise reductions.
 *
 * The collectives combine received data with local data through dt_reduce_apply; the
 * loops are written so the compiler vectorises them (f32/f64/integers), while f16 and
 * bf16 go through f32 one element at a time and round back to nearest-even (the
 * conversions of dtype.h).
 */
#ifndef DT_REDUCE_H
#define DT_REDUCE_H

#include <stddef.h>
#include <stdint.h>
#include "comm.h"

/* dst[i] = a[i] op b[i] for n elements of type t (avg combines as sum). dst may equal a
 * or b; otherwise the three must not overlap. */
void     dt_reduce_apply(dt_redop op, dt_dtype t, void *dst, const void *a, const void *b, size_t n);
/* buf[i] /= divisor (the last step of avg); integer types truncate toward zero. */
void     dt_reduce_divide(dt_dtype t, void *buf, size_t n, int divisor);

#endif /* DT_REDUCE_H */
