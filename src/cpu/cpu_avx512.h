/*
 * cpu_avx512.h: what the AVX-512 GEMM blocks share (cpu_gemm_avx512.c, cpu_gemm_bf16.c).
 * Included only where the compiler targets x86-64 with GCC or Clang.
 */
#ifndef DT_CPU_AVX512_H
#define DT_CPU_AVX512_H

#include <immintrin.h>

/* r[0..16) (16 floats each) transposed in place: lane j of r[c] becomes lane c of r[j]. */
__attribute__((target("avx512f")))
static inline void dt_cpu_transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i += 4) {
        __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 2]);
        __m512d c = _mm512_castps_pd(t[i + 1]), d = _mm512_castps_pd(t[i + 3]);
        u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
#pragma GCC unroll 16
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(u[i], u[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], 0xdd);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* A register tile of 16-lane accumulators c0_<i>, c1_<i> per row i (two vectors: 32
 * columns): T_ZERO(i) declares them zero; T_STORE(i) writes row i of C (row stride ldc)
 * when i < m, as alpha * acc (first) or C + alpha * acc, through the column masks k0, k1,
 * with al = alpha broadcast. Both GEMM blocks sum and store in this one order. */
#define T_ZERO(i) __m512 c0_##i = _mm512_setzero_ps(), c1_##i = _mm512_setzero_ps();
#define T_STORE(i) if (i < m) { \
        float *c = C + (size_t)i * ldc; \
        __m512 v0 = _mm512_mul_ps(al, c0_##i), v1 = _mm512_mul_ps(al, c1_##i); \
        if (!first) { \
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(k0, c), v0); \
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(k1, c + 16), v1); \
        } \
        _mm512_mask_storeu_ps(c, k0, v0); \
        _mm512_mask_storeu_ps(c + 16, k1, v1); \
    }

#endif /* DT_CPU_AVX512_H */
