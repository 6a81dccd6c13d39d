/*
 * cpu_lowp.c: the mixed-precision kernels on the CPU — rounding to bf16/f16, the GEMM
 * on rounded inputs, the non-finite check of the loss scaler.
 *
 * A bf16 product runs on the CPU's 16-bit dot-product units where it has them
 * (AVX512-BF16: cpu_gemm_bf16.c, chosen once per process by DT_CPU_GEMM). Elsewhere, and
 * for f16 (no f16 dot product on these CPUs), a low-precision GEMM is the f32 GEMM on
 * inputs already rounded to bf16 or f16: a product of two such values has at most 22
 * significant bits and is exact in f32, so the result is that of a 16-bit GEMM with f32
 * accumulation, up to the order of the sums. Both sum in fixed blocks in an order set
 * by K, so the bits are independent of the thread count (docs/DESIGN.md rule 2).
 */
#include "cpu.h"

#include <stdlib.h>
#include "dtype.h"

#define PAR_MIN 32768

/* The bits of dt_bf16_to_f32(dt_f32_to_bf16(x)) and dt_f16_to_f32(dt_f32_to_f16(x)),
 * written without branches (every case computed, one selected) so the loops vectorise;
 * tests/test_amp.c holds them to the casts bit for bit. */
static inline float round_bf16_1(float x) {
    uint32_t u = dt_f32_bits(x);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;   /* nearest even; a carry is right */
    uint32_t q = (u | 0x00400000u) & 0xffff0000u;                    /* NaN: quieted */
    return dt_bits_f32((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static inline float round_f16_1(float x) {
    uint32_t u = dt_f32_bits(x), a = u & 0x7fffffffu;
    uint32_t normal = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;           /* 10 mantissa bits, nearest even */
    uint32_t sub = dt_f32_bits((dt_bits_f32(a) + 0.5f) - 0.5f);                /* below 2^-14: multiples of 2^-24 */
    uint32_t nan = 0x7fc00000u | (a & 0x007fe000u);                            /* quieted, top 10 payload bits */
    uint32_t r = a > 0x7f800000u ? nan : a >= 0x477ff000u ? 0x7f800000u : a < 0x38800000u ? sub : normal;
    return dt_bits_f32((u & 0x80000000u) | r);
}

/* out of place (restrict: the vector loop needs no overlap check) and in place */
#define ROUND_LOOPS(name, fn) \
    DT_CPU_CLONES static void name(float *restrict y, const float *restrict x, size_t n) { \
        for (size_t i = 0; i < n; i++) y[i] = fn(x[i]); } \
    DT_CPU_CLONES static void name##_inplace(float *y, size_t n) { \
        for (size_t i = 0; i < n; i++) y[i] = fn(y[i]); }
ROUND_LOOPS(round_bf16, round_bf16_1)
ROUND_LOOPS(round_f16, round_f16_1)

dt_status dt_cpu_round_to(float *y, const float *x, size_t n, int dtype) {
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_error(DT_ERR_INVALID, "cpu round_to: dtype must be bf16 or f16, got %s", dt_dtype_name((dt_dtype)dtype));
    if (n == 0) return DT_OK;
    DT_CPU_ARG(y && x && (y == x || y + n <= x || x + n <= y));   /* in place, or apart */
    /* fixed pieces: each element's result depends on that element only */
    const size_t piece = 16384, np = (n + piece - 1) / piece;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) if (n >= PAR_MIN)
    for (size_t p = 0; p < np; p++) {
        size_t i0 = p * piece, len = n - i0 < piece ? n - i0 : piece;
        if (y == x && dtype == DT_BF16) round_bf16_inplace(y + i0, len);
        else if (y == x) round_f16_inplace(y + i0, len);
        else if (dtype == DT_BF16) round_bf16(y + i0, x + i0, len);
        else round_f16(y + i0, x + i0, len);
    }
    return DT_OK;
}

dt_status dt_cpu_gemm_lp(int dtype, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                         const float *B, int ldb, float beta, float *C, int ldc) {
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_error(DT_ERR_INVALID, "cpu gemm_lp: dtype must be bf16 or f16, got %s", dt_dtype_name((dt_dtype)dtype));
    if (dtype == DT_BF16 && dt_cpu_gemm_bf16_on())
        return dt_cpu_gemm_blocks("gemm_lp", dt_cpu_gemm1_bf16, 0, transA, transB, M, N, K, alpha, A, lda, B, ldb,
                                  beta, C, ldc);
    return dt_cpu_sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

dt_status dt_cpu_gemm_lp_b16(int dtype, int transA, int M, int N, int K, float alpha, const float *A, int lda,
                             const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    if (dtype != DT_BF16 && dtype != DT_F16)
        return dt_error(DT_ERR_INVALID, "cpu gemm_lp_b16: dtype must be bf16 or f16, got %s",
                        dt_dtype_name((dt_dtype)dtype));
    if (dtype == DT_BF16 && dt_cpu_gemm_bf16_on())   /* the kernel packs B's words as they are */
        return dt_cpu_gemm_blocks("gemm_lp_b16", dt_cpu_gemm1_bf16_b16, 1, transA, 0, M, N, K, alpha, A, lda, B, ldb,
                                  beta, C, ldc);
    /* elsewhere B widened, rows and the gaps between them, for gemm_lp */
    DT_CPU_ARG(M >= 0 && N >= 0 && K >= 0 && ldb >= (N > 1 ? N : 1));
    size_t n = M && N && K ? (size_t)(K - 1) * (size_t)ldb + (size_t)N : 0;
    DT_CPU_ARG(n == 0 || B);
    float *w = malloc(n ? n * sizeof *w : 1);
    if (!w) return dt_error(DT_ERR_NOMEM, "cpu gemm_lp_b16: out of memory widening a %d x %d operand", K, N);
    dt_status s = dtype == DT_BF16 ? dt_cpu_bf16_to_f32(w, B, n) : dt_cpu_f16_to_f32(w, B, n);
    if (s == DT_OK) s = dt_cpu_gemm_lp(dtype, transA, 0, M, N, K, alpha, A, lda, w, ldb, beta, C, ldc);
    free(w);
    return s;
}

dt_status dt_cpu_nonfinite(int32_t *flag, const float *x, size_t n) {
    DT_CPU_ARG(flag && (n == 0 || x));
    int32_t any = 0;
    int nt = dt_cpu_threads();
    #pragma omp parallel for schedule(static) num_threads(nt) reduction(| : any) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) any |= (dt_f32_bits(x[i]) & 0x7f800000u) == 0x7f800000u;
    *flag = any;
    return DT_OK;
}
