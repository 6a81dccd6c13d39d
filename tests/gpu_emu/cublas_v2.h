/* gpu_emu/cublas_v2.h: a stand-in for cuBLAS (see cuda_runtime.h here): GEMMs go to
 * OpenBLAS's column-major cblas_sgemm, so the backend's operand order is what is tested. */
#ifndef DT_GPU_EMU_CUBLAS_H
#define DT_GPU_EMU_CUBLAS_H
#include "cuda_runtime.h"

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_ALLOC_FAILED = 3, CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8, CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH } cublasMath_t;
typedef enum { CUBLAS_POINTER_MODE_HOST } cublasPointerMode_t;
typedef struct emu_blas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb,
                           const float *beta, float *C, int ldc);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, long long sa,
                                         const float *B, int ldb, long long sb, const float *beta, float *C, int ldc,
                                         long long sc, int batch);
const char *cublasGetStatusString(cublasStatus_t s);

/* cublasGemmEx for 16-bit inputs and f32 output and compute (the backend's gemm_lp):
 * the operands widened to f32 (exact) and handed to cublasSgemm. */
#include <vector>
static inline float emu_widen(uint16_t h, bool bf16) {   /* bf16/f16 -> f32, exact */
    uint32_t u;
    if (bf16) {
        u = (uint32_t)h << 16;
    } else {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
        if (e == 0) return (sign ? -1.0f : 1.0f) * (float)m * (1.0f / 16777216.0f);
        u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
static inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C,
                                          cudaDataType_t ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    (void)algo;
    if (at != bt || (at != CUDA_R_16BF && at != CUDA_R_16F) || ct != CUDA_R_32F || comp != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    /* column-major spans: op N is rows x cols = m x k (A) or k x n (B), op T the transpose */
    size_t na = ta == CUBLAS_OP_N ? (size_t)(k - 1) * lda + m : (size_t)(m - 1) * lda + k;
    size_t nb = tb == CUBLAS_OP_N ? (size_t)(n - 1) * ldb + k : (size_t)(k - 1) * ldb + n;
    std::vector<float> a(na), b(nb);
    const uint16_t *ha = (const uint16_t *)A, *hb = (const uint16_t *)B;
    for (size_t i = 0; i < na; i++) a[i] = emu_widen(ha[i], at == CUDA_R_16BF);
    for (size_t i = 0; i < nb; i++) b[i] = emu_widen(hb[i], at == CUDA_R_16BF);
    return cublasSgemm(h, ta, tb, m, n, k, (const float *)alpha, a.data(), lda, b.data(), ldb, (const float *)beta,
                       (float *)C, ldc);
}
#endif
