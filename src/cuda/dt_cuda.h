/*
 * dt_cuda.h: the CUDA compute backend's own API — the dt_ops table, the device, the
 * compute stream, memory statistics and the TF32 switch.
 *
 * Only code inside the compute layer (src/ops.c's dt_ops_get_ex) and the NCCL
 * communication backend include this header; the trainer reaches the backend through
 * dt_ops_get_ex("cuda", &opts) (docs/DESIGN.md rule 1). Built only with ./configure --with-cuda.
 *
 * Device: chosen once per process, by the first dt_ops_cuda(index, ...) or
 * dt_cuda_open(index), as index modulo the number of visible devices. The backend reads
 * no environment: the program passes the index, the local rank of its communicator
 * (dtrain creates the communicator first, so N ranks on a node with N GPUs take one
 * each, and a rank that sees only its own GPU through CUDA_VISIBLE_DEVICES takes that
 * one). The nccl backend opens the device of its local rank itself, after checking by
 * PCI bus id that no two ranks of a host would share one. Code that needs the context
 * before any device was chosen (dt_cuda_init, dt_cuda_bind_thread) gets device 0.
 *
 * Streams: every kernel and copy of the dt_ops table runs in order on one compute
 * stream, so kernels need no synchronisation among themselves. A communication
 * library that runs on its own stream orders itself with the two wait functions
 * below (event record + cudaStreamWaitEvent, so the host never blocks):
 *     dt_cuda_stream_wait_compute(comm_stream);   // comm sees the gradients
 *     ... ncclAllReduce(..., comm_stream) ...
 *     dt_cuda_compute_wait_stream(comm_stream);   // the optimizer sees the sums
 * Streams are passed as void * (a cudaStream_t) so this header needs no CUDA header.
 *
 * The table's functions are not meant to be called from two host threads at once (one
 * compute stream, one scratch arena); the memory statistics and the wait functions are
 * thread-safe.
 *
 * TF32: off unless the program asks for it (dt_device_opts.allow_tf32, which dtrain's
 * --allow-tf32 sets, or dt_cuda_set_allow_tf32(1)). Off, GEMMs and convolutions run in
 * full FP32, so results agree with the CPU to ~1e-6.
 */
#ifndef DT_CUDA_H
#define DT_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {   /* the project's C headers too: a .cu file may include this one first */
#endif
#include "dtype.h"
#include "ops.h"
#include "status.h"

/* The CUDA backend's table on device `index` (>= 0, taken modulo the visible devices)
 * with TF32 allowed or not; NULL with a message for dt_last_error() when no CUDA device
 * can be used (no device, no driver, initialisation failed) or when the process already
 * uses another device. Asking again for the same device sets TF32 as asked. */
DT_API const dt_ops *dt_ops_cuda(int index, int allow_tf32);

/* Number of visible CUDA devices into *n; an error (with CUDA's reason) when the
 * runtime cannot count them, as on a machine without a driver. */
DT_API dt_status dt_cuda_device_count(int *n);
/* Create the context on device `index` (>= 0, modulo the visible devices) and bind this
 * thread to it; if the context exists, an error unless it is on that device. */
DT_API dt_status dt_cuda_open(int index);
/* The PCI bus id ("0000:3b:00.0") of visible device `index` (modulo their number), to
 * tell whether two processes would share a GPU; needs no context. */
DT_API dt_status dt_cuda_pci_bus_id(int index, char *buf, size_t n);
/* Create the context, if no dt_ops_cuda() did yet, on device 0: the compute stream and
 * the cuBLAS handle. Idempotent; every other function calls it when needed. */
DT_API dt_status dt_cuda_init(void);
/* The selected device ordinal, -1 before dt_cuda_init succeeded. */
DT_API int       dt_cuda_device(void);
/* Make the calling thread use the selected device (cudaSetDevice); for threads other
 * than the one that initialised the backend, e.g. a communication worker. */
DT_API dt_status dt_cuda_bind_thread(void);

/* The compute stream (a cudaStream_t); NULL before dt_cuda_init succeeded. */
DT_API void     *dt_cuda_compute_stream(void);
/* `stream` waits (on the device) for the work queued on the compute stream so far. */
DT_API dt_status dt_cuda_stream_wait_compute(void *stream);
/* The compute stream waits (on the device) for the work queued on `stream` so far. */
DT_API dt_status dt_cuda_compute_wait_stream(void *stream);

/* Bytes of device memory currently allocated through the table's alloc, and the
 * highest value since start or the last reset (like torch.cuda.max_memory_allocated).
 * Scratch buffers the kernels keep (im2col, reduction partials) are counted too. */
DT_API size_t    dt_cuda_memory_allocated(void);
DT_API size_t    dt_cuda_max_memory_allocated(void);
DT_API void      dt_cuda_reset_peak_memory(void);
/* 1 when p lies in device memory this backend allocated (a cudaMalloc'd buffer, or a
 * sparse array's reservation, mapped there or not), else 0. The NCCL backend asks this
 * before cudaPointerGetAttributes, which reports an unmapped granule as unregistered
 * (host) memory. */
DT_API int       dt_cuda_owns(const void *p);

/* Debugging (dt_device_opts: DT_CUDA_SYNC, DT_CU_MAX_BLOCKS): sync = 1 synchronises after
 * every kernel launch and cuBLAS call, so an error names the kernel or call that
 * faulted; max_blocks > 0 caps the grid of the grid-stride kernels (0: the default cap),
 * which must not change any result. */
DT_API dt_status dt_cuda_set_debug(int sync, unsigned max_blocks);
/* Memory (dt_device_opts: DT_CUDA_VMM, DT_CUDA_CONV_CACHE_MB): vmm = 0 makes alloc_sparse
 * a plain cudaMalloc and the table's page_block 0 from the next dt_ops_cuda on (1, the
 * default: the driver's virtual memory management where it has the calls); allocations
 * made before keep their kind. conv_cache_mb caps the im2col columns kept from a
 * convolution's forward for its backward: > 0 MiB, < 0 none, 0 the default (the smaller
 * of 1 GiB and a sixteenth of the device). Callable before the context exists. */
DT_API void      dt_cuda_set_memory_opts(int vmm, long long conv_cache_mb);
/* "device D: NAME (sm_XY, N SMs, M GiB, PCI bus id B), driver X.Y, runtime X.Y, cuBLAS
 * X.Y.Z" for the selected device, into buf. */
DT_API dt_status dt_cuda_describe(char *buf, size_t n);

/* Elementwise combination on the device for a communication library that reduces in
 * dtrain's own order (src/comm/nccl.c, deterministic mode): acc[i] = acc[i] op in[i] for
 * n elements of t (a collective type), queued on `stream` (a cudaStream_t), in the
 * arithmetic of src/comm/reduce.c (f16/bf16 through f32, rounded each time), so results
 * are the tcp backend's bit for bit; dt_cuda_divide is avg's last step (buf[i] /=
 * divisor; integers truncate). */
enum { DT_CUDA_SUM, DT_CUDA_PROD, DT_CUDA_MIN, DT_CUDA_MAX };
DT_API dt_status dt_cuda_combine(void *acc, const void *in, size_t n, dt_dtype t, int op, void *stream);
DT_API dt_status dt_cuda_divide(void *buf, size_t n, dt_dtype t, int divisor, void *stream);

/* A communication library's collective in flight on the calling thread, from the moment
 * it queues device work until the call returns (src/comm/nccl.c). While another thread
 * has one, this backend makes none of the calls that may synchronise the device or hold
 * its context (cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost, cuMemUnmap), which
 * could deadlock against a collective waiting for its peers: an allocation or a free
 * waits for the collectives to end, and a discarded granule is unmapped once none is in
 * flight (at the latest when the last one ends). */
DT_API void      dt_cuda_collective_begin(void);
DT_API void      dt_cuda_collective_end(void);

/* Let cuBLAS use TF32 tensor cores for FP32 GEMMs (1) or not (0, the default). */
DT_API dt_status dt_cuda_set_allow_tf32(int allow);
DT_API int       dt_cuda_allow_tf32(void);

#ifdef __cplusplus
}
#endif

#endif /* DT_CUDA_H */
