/*
 * cuda_reduce.cu: the elementwise combination of two device buffers, in the arithmetic
 * of src/comm/reduce.c, for a communication library that reduces on the device in
 * dtrain's own order (the nccl backend's deterministic all-reduce: recursive halving
 * with ncclSend/ncclRecv, this kernel adding what arrives).
 *
 * Same semantics as dt_reduce_apply and dt_reduce_divide, formula for formula: acc[i] =
 * acc[i] op in[i] (the local value first, as the tcp transport combines), f16 and bf16
 * through f32 and back with dtype.h's conversions (round to nearest even), integers
 * wrapping, avg divided at the end (integers truncate). So the device sums are the tcp
 * backend's bit for bit (compiled with --fmad=false).
 */
#include "cuda_impl.h"

extern "C" {
#include "dtype.h"
}

template <class T> __device__ static inline T combine_one(int op, T x, T y) {
    switch (op) {
    case DT_CUDA_PROD: return (T)(x * y);
    case DT_CUDA_MIN:  return x < y ? x : y;
    case DT_CUDA_MAX:  return x > y ? x : y;
    default:           return (T)(x + y);
    }
}

#define COMBINE_KERNEL_(tn, T) \
__global__ void __launch_bounds__(DT_CU_THREADS) k_combine_##tn(T *acc, const T *in, size_t n, int op) { \
    DT_CU_FOR(i, n) acc[i] = combine_one<T>(op, acc[i], in[i]); \
} \
__global__ void __launch_bounds__(DT_CU_THREADS) k_divide_##tn(T *p, size_t n, int d) { \
    DT_CU_FOR(i, n) p[i] = (T)(p[i] / (T)d); \
}
COMBINE_KERNEL_(f32, float)
COMBINE_KERNEL_(f64, double)
COMBINE_KERNEL_(i32, int32_t)
COMBINE_KERNEL_(i64, int64_t)
COMBINE_KERNEL_(u8, uint8_t)

__device__ static inline float half_in(uint16_t h, int bf) { return bf ? dt_bf16_to_f32(h) : dt_f16_to_f32(h); }
__device__ static inline uint16_t half_out(float f, int bf) { return bf ? dt_f32_to_bf16(f) : dt_f32_to_f16(f); }

__global__ void __launch_bounds__(DT_CU_THREADS) k_combine_half(uint16_t *acc, const uint16_t *in, size_t n, int op,
                                                                int bf) {
    DT_CU_FOR(i, n) acc[i] = half_out(combine_one<float>(op, half_in(acc[i], bf), half_in(in[i], bf)), bf);
}

__global__ void __launch_bounds__(DT_CU_THREADS) k_divide_half(uint16_t *p, size_t n, int d, int bf) {
    DT_CU_FOR(i, n) p[i] = half_out(half_in(p[i], bf) / (float)d, bf);
}

/* Launch a kernel on `stream` (st) and check the launch. */
#define LAUNCH_ON(kernel, n, ...) do { \
    kernel<<<dt_cu_blocks(n), DT_CU_THREADS, 0, st>>>(__VA_ARGS__); \
    DT_CU_LAUNCH(#kernel); \
} while (0)

extern "C" dt_status dt_cuda_combine(void *acc, const void *in, size_t n, dt_dtype t, int op, void *stream) {
    if (n == 0) return DT_OK;
    DT_CU_ARG(acc && in && op >= DT_CUDA_SUM && op <= DT_CUDA_MAX);
    DT_TRY(dt_cu_enter());
    cudaStream_t st = (cudaStream_t)stream;
    switch (t) {
    case DT_F32:  LAUNCH_ON(k_combine_f32, n, (float *)acc, (const float *)in, n, op); break;
    case DT_F64:  LAUNCH_ON(k_combine_f64, n, (double *)acc, (const double *)in, n, op); break;
    case DT_I32:  LAUNCH_ON(k_combine_i32, n, (int32_t *)acc, (const int32_t *)in, n, op); break;
    case DT_I64:  LAUNCH_ON(k_combine_i64, n, (int64_t *)acc, (const int64_t *)in, n, op); break;
    case DT_U8:   LAUNCH_ON(k_combine_u8, n, (uint8_t *)acc, (const uint8_t *)in, n, op); break;
    case DT_F16:  LAUNCH_ON(k_combine_half, n, (uint16_t *)acc, (const uint16_t *)in, n, op, 0); break;
    case DT_BF16: LAUNCH_ON(k_combine_half, n, (uint16_t *)acc, (const uint16_t *)in, n, op, 1); break;
    default:      return dt_error(DT_ERR_INVALID, "cuda combine: type %d is not a collective type", (int)t);
    }
    return DT_OK;
}

extern "C" dt_status dt_cuda_divide(void *buf, size_t n, dt_dtype t, int divisor, void *stream) {
    if (n == 0 || divisor <= 1) return DT_OK;
    DT_CU_ARG(buf);
    DT_TRY(dt_cu_enter());
    cudaStream_t st = (cudaStream_t)stream;
    switch (t) {
    case DT_F32:  LAUNCH_ON(k_divide_f32, n, (float *)buf, n, divisor); break;
    case DT_F64:  LAUNCH_ON(k_divide_f64, n, (double *)buf, n, divisor); break;
    case DT_I32:  LAUNCH_ON(k_divide_i32, n, (int32_t *)buf, n, divisor); break;
    case DT_I64:  LAUNCH_ON(k_divide_i64, n, (int64_t *)buf, n, divisor); break;
    case DT_U8:   LAUNCH_ON(k_divide_u8, n, (uint8_t *)buf, n, divisor); break;
    case DT_F16:  LAUNCH_ON(k_divide_half, n, (uint16_t *)buf, n, divisor, 0); break;
    case DT_BF16: LAUNCH_ON(k_divide_half, n, (uint16_t *)buf, n, divisor, 1); break;
    default:      return dt_error(DT_ERR_INVALID, "cuda divide: type %d is not a collective type", (int)t);
    }
    return DT_OK;
}
