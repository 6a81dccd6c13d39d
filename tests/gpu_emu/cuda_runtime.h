/*
 * gpu_emu/cuda_runtime.h: a stand-in for the CUDA runtime header, so tests/gpu_emu.sh
 * can compile the backend's .cu files with g++ and run their kernels on the CPU.
 *
 * Kernels become host functions; a launch runs every block in turn and every thread of
 * a block as a cooperative fiber (ucontext), switching at __syncthreads(), so block-level
 * trees and shared memory (__shared__ is static: blocks run one at a time) behave as on
 * a GPU. Device memory is host memory; streams, events and copies are synchronous.
 * This checks the kernels' index arithmetic, reduction trees and the cuBLAS operand
 * order against the CPU backend; it says nothing about speed or memory coherence.
 */
#ifndef DT_GPU_EMU_CUDA_RUNTIME_H
#define DT_GPU_EMU_CUDA_RUNTIME_H

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <math.h>

#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
extern dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
void __syncthreads(void);

static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }

enum cudaError {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidDevicePointer = 17,
    cudaErrorInsufficientDriver = 35, cudaErrorNoDevice = 100, cudaErrorNoKernelImageForDevice = 209,
    cudaErrorNotReady = 600,
};
typedef enum cudaError cudaError_t;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
#define cudaHostAllocPortable 1u
#define cudaEventDisableTiming 2u
#define cudaStreamNonBlocking 1u

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t bytes, cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaGetLastError(void);
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);

/* kernel<<<grid, block, shmem, stream>>>(args) is rewritten by gpu_emu.sh into
 * emu_cfg(grid, block, shmem, stream).run(kernel)(args). */
void emu_exec(dim3 grid, dim3 block, const std::function<void()> &body);
struct emu_cfg {
    dim3 g, b;
    emu_cfg(dim3 grid, dim3 block, size_t shmem = 0, cudaStream_t s = 0) : g(grid), b(block) { (void)shmem; (void)s; }
    template <class... P> auto run(void (*f)(P...)) const {
        dim3 G = g, B = b;
        return [=](P... a) { emu_exec(G, B, [=] { f(a...); }); };
    }
};

#include "emu_warp.h"
#endif
