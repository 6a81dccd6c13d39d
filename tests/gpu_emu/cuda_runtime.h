/*
 * gpu_emu/cuda_runtime.h: a stand-in for the CUDA runtime header, so tests/gpu_emu.sh
 * can compile the backend's .cu files with g++ (and nccl.c, C, against gpu_emu/nccl.h)
 * and run their kernels on the CPU.
 *
 * Kernels become host functions; a launch runs every block in turn and every thread of
 * a block as a cooperative fiber (ucontext), switching at __syncthreads(), so block-level
 * trees and shared memory (__shared__ is static: blocks run one at a time) behave as on
 * a GPU. DT_GPU_EMU_ORDER=reverse|shuffle runs the blocks, and a block's threads between
 * two barriers, in falling or shuffled index order (natural: rising), as a GPU may: a
 * kernel whose output changes with it reads what another thread writes without a barrier
 * between (or depends on the order of blocks). The stand-in is strict where a GPU would
 * fail and a CPU would not:
 *
 *   - memory: cudaMalloc'd ranges are device memory, cudaHostAlloc'd ranges host-pinned
 *     memory (the GPU can reach both); every other address is host memory. Each pointer
 *     argument of a kernel, each cuBLAS matrix (its whole extent), each copy's and
 *     memset's range and each NCCL buffer (gpu_emu/nccl.h) must be device or pinned
 *     memory of the current device, where the call wants device memory. A host pointer
 *     fails the call with its name on stderr: a kernel or cuBLAS call with a sticky
 *     cudaErrorIllegalAddress (what a GPU reports, later), a copy with
 *     cudaErrorInvalidValue, an NCCL call with ncclInvalidArgument.
 *   - streams run lazily: each call is queued on its stream and runs only when something
 *     waits for it (cudaStreamSynchronize, cudaStreamQuery, cudaDeviceSynchronize,
 *     cudaEventSynchronize, a stream waiting on an event of it, cudaFree, or work on the
 *     legacy default stream 0, which runs the blocking streams first). A missing wait
 *     between two streams, or a host read before a synchronisation, sees stale data.
 *   - launch configuration: more than 1024 threads a block (or a dimension over its
 *     limit), an empty grid or more than 48 KiB of dynamic shared memory is
 *     cudaErrorInvalidConfiguration from cudaGetLastError, and the kernel does not run;
 *     more threads than the kernel's __launch_bounds__ is cudaErrorLaunchOutOfResources
 *     (gpu_emu.sh registers the bounds written as a constant, EMU_BOUNDS below).
 *   - DT_GPU_EMU_RESOURCES=FILE (nvcc's resource usage, tests/gpu_emu/resources.sh):
 *     a launch whose block needs more registers than a GPU grants one (65536, 256 to a
 *     warp) is cudaErrorLaunchOutOfResources, one whose static and dynamic shared memory
 *     pass 48 KiB cudaErrorInvalidConfiguration; a kernel not in the table stops the program.
 *   - DT_GPU_EMU_NOTREADY=K: a query of a stream or an event with work left, and NCCL's
 *     asynchronous error, answer "not ready" (cudaErrorNotReady, ncclInProgress) K times
 *     for each object before the true answer, as a busy GPU would, so each polling loop
 *     must go round and still finish.
 *   - DT_GPU_EMU_FAULT=KERNEL: that kernel faults when it runs (asynchronously, as on a
 *     GPU: a sticky "an illegal memory access was encountered" that names nothing), to
 *     test what a program reports then.
 *   - virtual memory management (gpu_emu/cuda.h): an address range reserved and mapped
 *     granule by granule; an unmapped granule is inaccessible, so a touch faults.
 *   - devices: DT_GPU_EMU_DEVICES (default 1) devices; device i has the PCI bus id
 *     0000:(0x10 + p):00.0 where p is the i-th entry of CUDA_VISIBLE_DEVICES (else i).
 *
 * It says nothing about speed, about races between threads of a block that do not
 * synchronise, or (without DT_GPU_EMU_RESOURCES) about registers and static shared memory.
 */
#ifndef DT_GPU_EMU_CUDA_RUNTIME_H
#define DT_GPU_EMU_CUDA_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CUDART_VERSION 13000

enum cudaError {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2, cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17, cudaErrorInsufficientDriver = 35, cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101, cudaErrorNoKernelImageForDevice = 209, cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600, cudaErrorIllegalAddress = 700, cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
};
typedef enum cudaError cudaError_t;
typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
enum cudaMemoryType { cudaMemoryTypeUnregistered = 0, cudaMemoryTypeHost = 1, cudaMemoryTypeDevice = 2,
                      cudaMemoryTypeManaged = 3 };
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int   device;
    void *devicePointer;
    void *hostPointer;
};
struct cudaDeviceProp {
    char   name[256];
    size_t totalGlobalMem, sharedMemPerBlock;
    int    maxThreadsPerBlock, multiProcessorCount, major, minor;
    int    pciBusID, pciDeviceID, pciDomainID;
};
#define cudaHostAllocDefault 0u
#define cudaHostAllocPortable 1u
#define cudaEventDefault 0u
#define cudaEventDisableTiming 2u
#define cudaStreamDefault 0u
#define cudaStreamNonBlocking 1u
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1,
                                       cudaDriverEntryPointVersionNotSufficent = 2 };
#define cudaEnableDefault 0ull

#ifdef __cplusplus
extern "C" {
#endif
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int d);
cudaError_t cudaGetDevice(int *d);
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d);
cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int d);
cudaError_t cudaDriverGetVersion(int *v);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaMemset(void *p, int v, size_t bytes);
cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s);
cudaError_t cudaMemcpy(void *d, const void *s, size_t bytes, enum cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t bytes, enum cudaMemcpyKind k, cudaStream_t st);
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
const char *cudaGetErrorString(cudaError_t e);
/* the driver's virtual memory management calls (gpu_emu/cuda.h); any other symbol is
 * not found */
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags, enum cudaDriverEntryPointQueryResult *status);
const char *cudaGetErrorName(cudaError_t e);

/* ---- for the other stand-ins (cublas, nccl) and the emulator's own test ---- */
/* The memory kind of [p, p + bytes) when it lies inside one tracked range: 2 device,
 * 1 pinned host; 0 otherwise (host memory, or a range that crosses an allocation's end). */
int         emu_mem_kind(const void *p, size_t bytes);
/* Fail `call` on a pointer that the GPU cannot reach: print "gpu_emu: CALL: WHAT" and
 * make cudaErrorIllegalAddress sticky, with that text as its error string. */
void        emu_fault(const char *call, const char *what);
/* Check [p, p + bytes) is device or pinned memory for `call`'s argument `arg`; 0 and a
 * message in buf when not. */
int         emu_check_range(const char *call, const char *arg, const void *p, size_t bytes, char *buf, size_t n);
/* The current device of this thread. */
int         emu_device(void);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
#include <cmath>
#include <cstring>
#include <functional>
#include <type_traits>
#include <map>
#include <mutex>
#include <string>

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

/* Queue `work` on stream s (0: the legacy default stream); `owner` tags it (an NCCL
 * communicator, so an abort can drop its work), may be NULL. */
void emu_enqueue(cudaStream_t s, const char *name, const void *owner, std::function<bool()> work);
/* Drop the queued work of `owner` (an aborted NCCL communicator); its streams run again. */
void emu_drop_owner(const void *owner);
/* DT_GPU_EMU_NOTREADY=K (0: off): K; emu_not_ready_of(what): 1 for K polls of `what` (a
 * stream, an event, a communicator) before each true answer (cudaStreamQuery and
 * cudaEventQuery then say cudaErrorNotReady while work is left, ncclCommGetAsyncError
 * ncclInProgress), so every loop that polls is made to go round; else 0. */
long emu_not_ready_count(void);
int  emu_not_ready_of(const void *what);
/* Run the blocks and threads of one launch of kernel `name`. */
void emu_exec(const char *name, dim3 grid, dim3 block, const std::function<void()> &body);
/* Launch checks: the configuration (sets the last error, 0 when bad), and one pointer
 * argument of a kernel (index from 1; a host pointer is a fault, 0). */
int  emu_launch_ok(const char *kernel, dim3 grid, dim3 block, size_t shmem);
int  emu_kernel_ptr_ok(const char *kernel, int index, const void *p);

template <class T> static inline int emu_arg_ok(const char *kernel, int index, const T &v) {
    if constexpr (std::is_pointer<T>::value) return emu_kernel_ptr_ok(kernel, index, (const void *)v);
    else { (void)kernel; (void)index; (void)v; return 1; }
}

/* A kernel's __launch_bounds__(N): gpu_emu.sh puts EMU_BOUNDS(kernel, N) before the
 * definition of each kernel whose bound is a constant. */
void emu_register_bounds(const char *kernel, unsigned threads);
struct emu_bounds {
    emu_bounds(const char *kernel, unsigned threads) { emu_register_bounds(kernel, threads); }
};
#define EMU_BOUNDS(k, n) static emu_bounds emu_bounds_##k(#k, n);

/* kernel<<<grid, block, shmem, stream>>>(args) is rewritten by gpu_emu.sh into
 * emu_cfg(grid, block, shmem, stream).run(EMU_NAMED(kernel))(args). */
#define EMU_NAMED(k) k, #k
/* kernel<A, B><<<...>>>(args) (integer template arguments) becomes
 * emu_cfg(...).run(kernel<A, B>, emu_tname<A, B>("kernel"))(args): the instance's name as
 * nvcc's resource table spells it, "kernel<64, 32>" (one per kernel: two kernels may take
 * the same arguments; a map's strings stay where they are). */
template <int... V> const char *emu_tname(const char *base) {
    static std::mutex mu;
    static std::map<std::string, std::string> names;
    std::lock_guard<std::mutex> hold(mu);
    std::string &s = names[base];
    if (s.empty()) {
        s = std::string(base) + "<";
        int i = 0;
        ((s += (i++ ? ", " : "") + std::to_string(V)), ...);
        s += ">";
    }
    return s.c_str();
}
struct emu_cfg {
    dim3 g, b;
    size_t shmem;
    cudaStream_t s;
    emu_cfg(dim3 grid, dim3 block, size_t sh = 0, cudaStream_t st = 0) : g(grid), b(block), shmem(sh), s(st) {}
    template <class... P> auto run(void (*f)(P...), const char *name) const {
        emu_cfg c = *this;
        return [=](P... a) {
            if (!emu_launch_ok(name, c.g, c.b, c.shmem)) return;
            int i = 0, good = 1;
            ((good &= emu_arg_ok(name, ++i, a)), ...);
            if (!good) return;
            dim3 G = c.g, B = c.b;
            emu_enqueue(c.s, name, nullptr, [=] { emu_exec(name, G, B, [=] { f(a...); }); return true; });
        };
    }
};
#include "emu_warp.h"   /* warp shuffles: kernels are C++ */
#endif /* __cplusplus */
#endif
