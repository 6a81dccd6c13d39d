/* gpu_emu/cublas_v2.h: a stand-in for cuBLAS (see cuda_runtime.h here): GEMMs are queued
 * on the handle's stream and run OpenBLAS's column-major cblas_sgemm, so the backend's
 * operand order is what is tested. Each matrix's whole extent (from its sizes and leading
 * dimension) must lie in device or pinned memory; a host pointer fails the call with
 * CUBLAS_STATUS_EXECUTION_FAILED and a sticky cudaErrorIllegalAddress naming it. */
#ifndef DT_GPU_EMU_CUBLAS_H
#define DT_GPU_EMU_CUBLAS_H
#include "cuda_runtime.h"

#define CUBLAS_VERSION 130000
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_NOT_INITIALIZED = 1, CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7, CUBLAS_STATUS_ARCH_MISMATCH = 8, CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N, CUBLAS_OP_T } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH } cublasMath_t;
typedef enum { CUBLAS_POINTER_MODE_HOST } cublasPointerMode_t;
typedef struct emu_blas *cublasHandle_t;

#ifdef __cplusplus
extern "C" {
#endif
cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasGetVersion(cublasHandle_t h, int *v);
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
 * the operands widened to f32 (exact), then cblas_sgemm; the same checks and queueing as
 * cublasSgemm. */
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum {
    CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_16F = 74, CUBLAS_COMPUTE_32F_FAST_16BF = 75
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t comp, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          long long sa, const void *B, cudaDataType_t bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType_t ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t comp, cublasGemmAlgo_t algo);
#ifdef __cplusplus
}
#endif
#endif
