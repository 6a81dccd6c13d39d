/*
 * cuda_lowp.cu: the mixed-precision kernels on the GPU — rounding to bf16/f16, the
 * 16-bit GEMM, the non-finite check of the loss scaler (see src/cpu/cpu_lowp.c).
 *
 * round_to is dtype.h's conversion there and back, the CPU's very code, so it matches
 * the CPU bit for bit. gemm_lp's operands already hold bf16 (f16) values in f32 arrays:
 * cublasGemmEx takes them as they are with the compute type CUBLAS_COMPUTE_32F_FAST_16BF
 * (_16F), whose kernels narrow their f32 inputs to 16 bits (exact for such values) and
 * multiply on tensor cores with f32 accumulation in cuBLAS's order (to rounding of the
 * CPU's sgemm on the same values). Before, each call narrowed both operands into
 * scratch with two kernels of its own: an H200 ran the 8 x 4096 MLP's bf16 step slower
 * than its TF32 one (4.4 against 3.8 ms). nonfinite sets its flag without atomics: every
 * thread that sees an inf or NaN writes the same 1 (a benign race, as GradScaler's
 * found_inf kernel does), after the flag was zeroed on the same stream.
 */
#include "cuda_impl.h"

__global__ void k_round_to(float *y, const float *x, size_t n, int bf16) {
    DT_CU_FOR(i, n) y[i] = bf16 ? dt_bf16_to_f32(dt_f32_to_bf16(x[i])) : dt_f16_to_f32(dt_f32_to_f16(x[i]));
}

static dt_status lp_dtype(const char *fn, int dtype) {
    if (dtype == DT_BF16 || dtype == DT_F16) return DT_OK;
    return dt_error(DT_ERR_INVALID, "cuda %s: dtype must be bf16 or f16, got %s", fn, dt_dtype_name((dt_dtype)dtype));
}

dt_status dt_cu_round_to(float *y, const float *x, size_t n, int dtype) {
    DT_TRY(lp_dtype("round_to", dtype));
    if (n == 0) return DT_OK;
    DT_CU_ARG(y && x);
    DT_TRY(dt_cu_enter());
    k_round_to<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(y, x, n, dtype == DT_BF16);
    DT_CU_LAUNCH("k_round_to");
    return DT_OK;
}

dt_status dt_cu_gemm_lp(int dtype, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
    DT_TRY(lp_dtype("gemm_lp", dtype));
    DT_CU_ARG(M >= 0 && N >= 0 && K >= 0);
    DT_CU_ARG(lda >= ((transA ? M : K) > 1 ? (transA ? M : K) : 1) && ldb >= ((transB ? K : N) > 1 ? (transB ? K : N) : 1) &&
              ldc >= (N > 1 ? N : 1));
    DT_CU_ARG(M == 0 || N == 0 || (C && (K == 0 || (A && B))));
    DT_TRY(dt_cu_enter());
    if (M == 0 || N == 0) return DT_OK;
    if (K == 0) return dt_cu_gemm("gemm_lp", transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    /* row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, as dt_cu_gemm */
    DT_CUBLAS(cublasGemmEx(dt_cu_blas(), transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                           K, &alpha, B, CUDA_R_32F, ldb, A, CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc,
                           dtype == DT_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F,
                           CUBLAS_GEMM_DEFAULT));
    return DT_OK;
}

/* B widened into the scratch arena, rows and the gaps between them, for gemm_lp (the
 * trainer widens a 16-bit input itself here: dt_ops_gemm_lp_reads16 is 0 on cuda). */
dt_status dt_cu_gemm_lp_b16(int dtype, int transA, int M, int N, int K, float alpha, const float *A, int lda,
                            const uint16_t *B, int ldb, float beta, float *C, int ldc) {
    DT_TRY(lp_dtype("gemm_lp_b16", dtype));
    DT_CU_ARG(M >= 0 && N >= 0 && K >= 0 && ldb >= (N > 1 ? N : 1));
    size_t n = M && N && K ? (size_t)(K - 1) * (size_t)ldb + (size_t)N : 0;
    DT_CU_ARG(n == 0 || B);
    float *w = NULL;
    if (n) {
        DT_TRY(dt_cu_scratch((void **)&w, n * sizeof *w));
        DT_TRY(dtype == DT_BF16 ? dt_cu_bf16_to_f32(w, B, n) : dt_cu_f16_to_f32(w, B, n));
    }
    return dt_cu_gemm_lp(dtype, transA, 0, M, N, K, alpha, A, lda, w, ldb, beta, C, ldc);
}

__global__ void k_nonfinite(int32_t *flag, const float *x, size_t n) {
    DT_CU_FOR(i, n) if ((__float_as_uint(x[i]) & 0x7f800000u) == 0x7f800000u) *flag = 1;
}

dt_status dt_cu_nonfinite(int32_t *flag, const float *x, size_t n) {
    DT_CU_ARG(flag && (n == 0 || x));
    DT_TRY(dt_cu_enter());
    DT_CU(cudaMemsetAsync(flag, 0, sizeof *flag, dt_cu_stream()));
    if (n == 0) return DT_OK;
    k_nonfinite<<<dt_cu_blocks(n), DT_CU_THREADS, 0, dt_cu_stream()>>>(flag, x, n);
    DT_CU_LAUNCH("k_nonfinite");
    return DT_OK;
}
