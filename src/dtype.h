/*
 * dtype.h: dtrain's one element-type enum, its traits table, and the f16/bf16
 * <-> f32 conversions.
 *
 * Every layer that names an element type uses dt_dtype: the collectives
 * (comm.h), tensors (tensor.h), safetensors files, and the IDX/NPY readers of
 * data.h. Each type is one row of a traits table (dt_dtype_traits_of): its size
 * and the name each outside world knows it by (dtrain "f32", safetensors "F32",
 * NumPy "<f4", the IDX type code 0x0D), so a reader or writer looks the type up
 * instead of keeping its own list.
 *
 * The conversions are static inline here so host code (the reductions of the
 * collectives, tools, tests) and the kernels of both compute backends compile
 * the very same bit manipulations (DT_DTYPE_FN is __host__ __device__ under
 * nvcc, as in rng.h): a cast on the GPU gives the CPU's bits. They round to
 * nearest even, keep NaN a NaN (quieted, sign and top payload bits kept), and an
 * f32 too large for f16 becomes inf.
 */
#ifndef DT_DTYPE_H
#define DT_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "status.h"

#ifdef __CUDACC__
#define DT_DTYPE_FN static inline __host__ __device__
#else
#define DT_DTYPE_FN static inline
#endif

/* ---- the enum ------------------------------------------------------------------ */

/* The first seven are the collectives' types (comm.h, DT_COMM_NDTYPES); their
 * values are part of a collective's fingerprint, so the order is fixed. */
typedef enum {
    DT_F32, DT_F64, DT_F16, DT_BF16, DT_I32, DT_I64, DT_U8,
    DT_I8, DT_I16, DT_U16, DT_U32, DT_U64, DT_BOOL,
    DT_DTYPE_COUNT
} dt_dtype;

/* One row of the traits table. Names that a format lacks are NULL (NumPy has
 * no bf16), idx is 0 where IDX has no code. */
typedef struct {
    const char *name;      /* dtrain's name: "f32", "bf16", "u8" (messages, --dtype flags) */
    size_t      size;      /* bytes per element */
    const char *st_name;   /* safetensors: "F32", "BF16", "U8" */
    const char *npy;       /* NumPy descr, little-endian: "<f4", "|u1" */
    unsigned    idx;       /* IDX element type code: 0x0D for f32 */
    int         is_float;  /* 1 for f16, bf16, f32, f64 */
} dt_dtype_traits;

/* ---- traits and names (dtype.c) --------------------------------------------------- */

DT_API const dt_dtype_traits *dt_dtype_traits_of(dt_dtype t);   /* NULL if t is not a dtype */
DT_API size_t      dt_dtype_size   (dt_dtype t);                 /* bytes per element; 0 if invalid */
DT_API const char *dt_dtype_name   (dt_dtype t);                 /* "f32", "bf16", ...; "?" if invalid */
DT_API const char *dt_dtype_st_name(dt_dtype t);                 /* "F32", "BF16", ...; "?" if invalid */
/* "f32" | "float32" | "float" | "half" | ... (case-insensitive); DT_ERR_INVALID
 * listing the names otherwise. */
DT_API dt_status   dt_dtype_parse  (const char *s, dt_dtype *out);
/* A safetensors dtype name ("F32", exact case); DT_ERR_FORMAT when unknown. */
DT_API dt_status   dt_dtype_from_st(const char *st_name, dt_dtype *out);
/* A NumPy type code without its byte-order character ("f4", "u1"); 0 when unknown. */
DT_API int         dt_dtype_from_npy(const char *code, dt_dtype *out);
/* An IDX element type code (0x08 u8, ..., 0x0E f64); 0 when unknown. */
DT_API int         dt_dtype_from_idx(unsigned code, dt_dtype *out);

/* ---- f16 / bf16 <-> f32 ----------------------------------------------------------- */

/* The bits of an f32 and back; memcpy is what host compilers and nvcc (for which it
 * is a device built-in) turn into a register move. */
DT_DTYPE_FN uint32_t dt_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
DT_DTYPE_FN float    dt_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* f32 -> bf16: the top half, rounded to nearest even; NaN gets the quiet bit. */
DT_DTYPE_FN uint16_t dt_f32_to_bf16(float f) {
    uint32_t u = dt_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* bf16 -> f32: exact. */
DT_DTYPE_FN float dt_bf16_to_f32(uint16_t h) { return dt_bits_f32((uint32_t)h << 16); }

/* f32 -> f16, rounded to nearest even; >= 65520 in magnitude becomes inf; NaN
 * keeps its sign and top 10 payload bits, quieted. */
DT_DTYPE_FN uint16_t dt_f32_to_f16(float f) {
    uint32_t u = dt_f32_bits(f), sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u)                                       /* inf or NaN */
        return (uint16_t)(sign | (u > 0x7f800000u ? 0x7e00u | ((u >> 13) & 0x3ffu) : 0x7c00u));
    if (u >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   /* >= 65520 rounds to inf */
    if (u < 0x38800000u)                                        /* below 2^-14: subnormal or zero */
        /* adding 0.5 puts the f16 subnormal's bits at the bottom of the f32 mantissa
         * and lets the FPU round to nearest even (no libm for users of this header) */
        return (uint16_t)(sign | (dt_f32_bits(dt_bits_f32(u) + 0.5f) - 0x3f000000u));
    u += 0xc8000fffu + ((u >> 13) & 1u);                        /* rebias the exponent by -112, round */
    return (uint16_t)(sign | (u >> 13));                        /* a carry into the exponent is right */
}

/* f16 -> f32: exact (subnormals scaled, inf and NaN kept). */
DT_DTYPE_FN float dt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return dt_bits_f32(dt_f32_bits((float)m * (1.0f / 16777216.0f)) | sign);
    if (e == 31) return dt_bits_f32(sign | 0x7f800000u | (m << 13));
    return dt_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif /* DT_DTYPE_H */
