/*
 * cuda_ops.cu: the CUDA backend's context (device, compute stream, cuBLAS handle),
 * memory with allocation statistics, GEMM over cuBLAS, and the dt_ops table
 * (generated from ops.h's lists).
 *
 * Context: created by the first dt_ops_cuda(index, allow_tf32) (or by dt_cuda_init on
 * device 0). The device is the index the program passes modulo the device count
 * (dt_cuda.h): given the local rank, N ranks on a node with N GPUs take one each.
 * All work goes to one compute stream, a plain (blocking) stream rather than a
 * non-blocking one, so work that other libraries in the process put on the legacy
 * default stream stays ordered with ours.
 *
 * Copies: host-to-device and device-to-host copies wait for completion before they
 * return (the caller may reuse or read its host buffer at once, pageable or pinned),
 * except copy_h2d_async, which only queues (the trainer's batch upload from the
 * loader's pinned buffers); device-to-device copies, memsets and kernels are queued and
 * return at once.
 *
 * GEMM: row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so cuBLAS
 * gets the operands swapped (B first) and the sizes as (N, M, K). TF32 is off unless
 * allowed (dt_cuda.h). cuBLAS returns the same bits run after run on the same GPU
 * model and library version (its documented reproducibility with one stream).
 */
#include "cuda_impl.h"

#include <cuda.h>   /* the driver API's types: virtual memory management */
#include <map>
#include <condition_variable>
#include <mutex>
#include <vector>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unordered_map>

/* ---- errors ---- */

dt_status dt_cu_fail(cudaError_t e, const char *fn, const char *call) {
    dt_status s = DT_ERR_IO;
    if (e == cudaErrorMemoryAllocation) s = DT_ERR_NOMEM;
    else if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorNoKernelImageForDevice)
        s = DT_ERR_UNSUPPORTED;
    else if (e == cudaErrorInvalidValue || e == cudaErrorInvalidDevicePointer)
        s = DT_ERR_INVALID;
    return dt_error(s, "cuda %s: %s failed: %s (%s)", fn, call, cudaGetErrorString(e), cudaGetErrorName(e));
}

dt_status dt_cublas_fail(cublasStatus_t e, const char *fn, const char *call) {
    dt_status s = e == CUBLAS_STATUS_ALLOC_FAILED ? DT_ERR_NOMEM
                : e == CUBLAS_STATUS_INVALID_VALUE ? DT_ERR_INVALID
                : e == CUBLAS_STATUS_NOT_SUPPORTED || e == CUBLAS_STATUS_ARCH_MISMATCH ? DT_ERR_UNSUPPORTED
                : DT_ERR_IO;
    return dt_error(s, "cuda %s: %s failed: %s", fn, call, cublasGetStatusString(e));
}

/* ---- the context ---- */

static struct {
    std::mutex     mu;            /* guards initialisation and the memory map */
    int            ready;
    int            device;
    cudaStream_t   stream;
    cublasHandle_t blas;
    int            tf32;
    int            threads;
    void          *scratch;
    size_t         scratch_bytes;
    int           *err;           /* device flags, DT_CU_ERR_COUNT ints */
    int           *err_host;      /* pinned mirror */
    std::unordered_map<void *, size_t> *sizes;
    size_t         cur, peak;
} g = {};

static thread_local int t_device = -1;
int dt_cu_sync_launches;
unsigned dt_cu_max_blocks = DT_CU_MAX_BLOCKS;

/* The map of cudaMalloc'd buffers (g.mu held: the _locked forms). */
static void mem_track_locked(void *p, size_t bytes) {
    if (!g.sizes) g.sizes = new std::unordered_map<void *, size_t>();
    (*g.sizes)[p] = bytes;
    g.cur += bytes;
    if (g.cur > g.peak) g.peak = g.cur;
}

static void mem_untrack_locked(void *p) {
    if (!g.sizes) return;
    auto it = g.sizes->find(p);
    if (it == g.sizes->end()) return;
    g.cur -= it->second;
    g.sizes->erase(it);
}

static void mem_track(void *p, size_t bytes) {
    std::lock_guard<std::mutex> l(g.mu);
    mem_track_locked(p, bytes);
}

static void mem_untrack(void *p) {
    std::lock_guard<std::mutex> l(g.mu);
    mem_untrack_locked(p);
}

/* ---- collectives in flight (dt_cuda_collective_begin / _end, dt_cuda.h) ----
 * cudaMalloc, cudaFree, cudaHostAlloc, cudaFreeHost and cuMemUnmap may synchronise the
 * device, or hold its context so that no other thread launches: made while another
 * thread's NCCL collective waits for its peers, whose progress may wait for this
 * process, they can deadlock. So this backend makes them only while no other thread has
 * a collective in flight: allocations and frees wait for that (no_collectives_elsewhere),
 * and a discarded granule is unmapped then, at the latest when the last collective ends
 * (vm_settle). gate_n and the condition are guarded by g.mu. */
static std::condition_variable gate_cv;
static int gate_n;                   /* collectives in flight, every thread */
static thread_local int gate_mine;   /* ... of this thread */

static int collectives_elsewhere(void) { return gate_n - gate_mine; }

/* Wait, g.mu held through l, until no other thread has a collective in flight. */
static void no_collectives_elsewhere(std::unique_lock<std::mutex> &l) {
    gate_cv.wait(l, [] { return collectives_elsewhere() == 0; });
}

extern "C" size_t dt_cuda_memory_allocated(void) { std::lock_guard<std::mutex> l(g.mu); return g.cur; }
extern "C" size_t dt_cuda_max_memory_allocated(void) { std::lock_guard<std::mutex> l(g.mu); return g.peak; }
extern "C" void dt_cuda_reset_peak_memory(void) { std::lock_guard<std::mutex> l(g.mu); g.peak = g.cur; }

extern "C" dt_status dt_cuda_device_count(int *n) {
    if (!n) return dt_error(DT_ERR_INVALID, "cuda device_count: NULL result pointer");
    *n = 0;
    DT_CU(cudaGetDeviceCount(n));
    return DT_OK;
}

static dt_status apply_math_mode(void) {
    DT_CUBLAS(cublasSetMathMode(g.blas, g.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    return DT_OK;
}

/* Called with g.mu held. */
static dt_status ctx_create(int index, int allow_tf32) {
    int n = 0;
    DT_TRY(dt_cuda_device_count(&n));
    if (n < 1) return dt_error(DT_ERR_UNSUPPORTED, "cuda: no CUDA device is visible");
    int dev = index % n;
    DT_CU(cudaSetDevice(dev));
    DT_CU(cudaStreamCreate(&g.stream));
    DT_CUBLAS(cublasCreate(&g.blas));
    DT_CUBLAS(cublasSetStream(g.blas, g.stream));
    DT_CUBLAS(cublasSetPointerMode(g.blas, CUBLAS_POINTER_MODE_HOST));
    g.tf32 = allow_tf32 != 0;
    DT_TRY(apply_math_mode());
    DT_CU(cudaMalloc((void **)&g.err, sizeof(int) * DT_CU_ERR_COUNT));
    DT_CU(cudaMemset(g.err, 0, sizeof(int) * DT_CU_ERR_COUNT));
    DT_CU(cudaHostAlloc((void **)&g.err_host, sizeof(int) * DT_CU_ERR_COUNT, cudaHostAllocPortable));
    g.device = dev;
    g.threads = 1;
    t_device = dev;
    g.ready = 1;
    return DT_OK;
}

/* Create the context on device `index` (mod the count) unless it exists; *created
 * says whether this call made it. */
static dt_status ctx_open(int index, int allow_tf32, int *created) {
    *created = 0;
    if (!__atomic_load_n(&g.ready, __ATOMIC_ACQUIRE)) {
        std::lock_guard<std::mutex> l(g.mu);
        if (!g.ready) {
            if (index < 0) return dt_error(DT_ERR_INVALID, "cuda: device index %d must be >= 0", index);
            DT_TRY(ctx_create(index, allow_tf32));
            *created = 1;
        }
    }
    return DT_OK;
}

/* The context on device `index` (mod the count): created here (*created), or checked to
 * be on that device. */
static dt_status ctx_use(int index, int allow_tf32, int *created) {
    DT_TRY(ctx_open(index, allow_tf32, created));
    if (*created) return DT_OK;
    int n = 0;
    DT_TRY(dt_cuda_device_count(&n));
    if (index < 0 || n < 1 || index % n != g.device)
        return dt_error(DT_ERR_INVALID, "cuda: this process already uses device %d; it cannot also open device index %d "
                        "(one device per process)", g.device, index);
    return DT_OK;
}

extern "C" dt_status dt_cuda_init(void) {
    int created;
    return ctx_open(0, 0, &created);
}

extern "C" dt_status dt_cuda_open(int index) {
    int created;
    DT_TRY(ctx_use(index, 0, &created));
    return dt_cu_enter();
}

extern "C" dt_status dt_cuda_pci_bus_id(int index, char *buf, size_t n) {
    if (!buf || n < 2 || index < 0) return dt_error(DT_ERR_INVALID, "cuda pci_bus_id: bad arguments");
    int count = 0;
    DT_TRY(dt_cuda_device_count(&count));
    if (count < 1) return dt_error(DT_ERR_UNSUPPORTED, "cuda: no CUDA device is visible");
    DT_CU(cudaDeviceGetPCIBusId(buf, (int)(n > 64 ? 64 : n), index % count));
    return DT_OK;
}

dt_status dt_cu_enter(void) {
    DT_TRY(dt_cuda_init());
    if (t_device != g.device) {
        DT_CU(cudaSetDevice(g.device));
        t_device = g.device;
    }
    return DT_OK;
}

extern "C" dt_status dt_cuda_bind_thread(void) { return dt_cu_enter(); }
extern "C" int dt_cuda_device(void) { return g.ready ? g.device : -1; }
extern "C" void *dt_cuda_compute_stream(void) { return g.ready ? (void *)g.stream : NULL; }
cudaStream_t dt_cu_stream(void) { return g.stream; }
cublasHandle_t dt_cu_blas(void) { return g.blas; }
int *dt_cu_err_flags(void) { return g.err; }

/* One event per ordering: recorded on `from`, waited for by `to`, then destroyed
 * (destroying an event with a pending wait is allowed: the wait still happens). */
static dt_status order_after(cudaStream_t to, cudaStream_t from) {
    cudaEvent_t ev;
    DT_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, from);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(to, ev, 0);
    cudaEventDestroy(ev);
    if (e != cudaSuccess) return dt_cu_fail(e, __func__, "cudaEventRecord/cudaStreamWaitEvent");
    return DT_OK;
}

extern "C" dt_status dt_cuda_stream_wait_compute(void *stream) {
    DT_TRY(dt_cu_enter());
    return order_after((cudaStream_t)stream, g.stream);
}

extern "C" dt_status dt_cuda_compute_wait_stream(void *stream) {
    DT_TRY(dt_cu_enter());
    return order_after(g.stream, (cudaStream_t)stream);
}

extern "C" dt_status dt_cuda_set_allow_tf32(int allow) {
    DT_TRY(dt_cu_enter());
    g.tf32 = allow != 0;
    return apply_math_mode();
}

extern "C" int dt_cuda_allow_tf32(void) { return g.tf32; }

extern "C" dt_status dt_cuda_set_debug(int sync, unsigned max_blocks) {
    dt_cu_sync_launches = sync != 0;
    dt_cu_max_blocks = max_blocks ? max_blocks : DT_CU_MAX_BLOCKS;
    return DT_OK;
}

dt_status dt_cu_sync_after(const char *fn, const char *what) {
    cudaError_t e = cudaStreamSynchronize(g.stream);
    if (e != cudaSuccess) {
        char call[160];
        snprintf(call, sizeof call, "%s (DT_CUDA_SYNC: synchronised after it)", what);
        return dt_cu_fail(e, fn, call);
    }
    return DT_OK;
}

extern "C" dt_status dt_cuda_describe(char *buf, size_t n) {
    if (!buf || !n) return dt_error(DT_ERR_INVALID, "cuda describe: NULL buffer");
    DT_TRY(dt_cu_enter());
    cudaDeviceProp p;
    DT_CU(cudaGetDeviceProperties(&p, g.device));
    int drv = 0, rt = 0, blas = 0;
    DT_CU(cudaDriverGetVersion(&drv));
    DT_CU(cudaRuntimeGetVersion(&rt));
    DT_CUBLAS(cublasGetVersion(g.blas, &blas));
    char bus[32] = "?";
    cudaDeviceGetPCIBusId(bus, sizeof bus, g.device);
    snprintf(buf, n, "device %d: %s (sm_%d%d, %d SMs, %.0f GiB, PCI bus id %s), driver %d.%d, runtime %d.%d, "
             "cuBLAS %d.%d.%d", g.device, p.name, p.major, p.minor, p.multiProcessorCount, (double)p.totalGlobalMem / (1024.0 * 1024 * 1024), bus,
             drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10, blas / 10000, blas % 10000 / 100, blas % 100);
    return DT_OK;
}

/* Growth is stream-ordered: the old scratch is freed behind the kernels queued before
 * (cudaFreeAsync), the new one taken on the same stream, with no device-wide
 * synchronisation: cudaFree would wait for every stream, NCCL's collectives of the
 * communication thread too (a gradient bucket's all-reduce in flight during backward). */
dt_status dt_cu_scratch(void **p, size_t bytes) {
    if (bytes > g.scratch_bytes) {
        size_t want = bytes + bytes / 4;   /* a little headroom: shapes vary by a few percent */
        if (g.scratch) {
            cudaFreeAsync(g.scratch, g.stream);
            mem_untrack(g.scratch);
            g.scratch = NULL;
            g.scratch_bytes = 0;
        }
        DT_CU(cudaMallocAsync(&g.scratch, want, g.stream));
        mem_track(g.scratch, want);
        g.scratch_bytes = want;
    }
    *p = g.scratch;
    return DT_OK;
}

/* ---- kernel-found errors ---- */

static const char *const err_what[DT_CU_ERR_COUNT] = {
    "xent_forward: a label is out of range for the class count, in row",
    "xent_backward: a label is out of range for the class count, in row",
    "maxpool2d_backward: an argmax index is outside its plane, at output",
    "embedding_forward: a token id is not an integer in [0, V), at position",
    "embedding_backward: a token id is not an integer in [0, V), at position",
};

/* Called after the stream synchronised with the flags copied into g.err_host. */
static dt_status check_flags(void) {
    for (int i = 0; i < DT_CU_ERR_COUNT; i++)
        if (g.err_host[i]) {
            int where = g.err_host[i] - 1;
            DT_CU(cudaMemsetAsync(g.err, 0, sizeof(int) * DT_CU_ERR_COUNT, g.stream));
            memset(g.err_host, 0, sizeof(int) * DT_CU_ERR_COUNT);
            return dt_error(DT_ERR_INVALID, "cuda %s %d (reported at the next synchronisation)", err_what[i], where);
        }
    return DT_OK;
}

static dt_status sync_and_check(void) {
    DT_CU(cudaMemcpyAsync(g.err_host, g.err, sizeof(int) * DT_CU_ERR_COUNT, cudaMemcpyDeviceToHost, g.stream));
    DT_CU(cudaStreamSynchronize(g.stream));
    return check_flags();
}

/* ---- memory and execution ---- */

/* ---- sparse allocations: memory that sharding can give back ----
 * Sharding (shard.h) gives back the parts of the parameter and gradient arrays that a
 * rank does not hold (ops discard) and brings them back before it touches them again
 * (ops populate). cudaMalloc'd memory cannot be given back in part; memory under the
 * driver's virtual memory management can. With it (the driver has the calls, and
 * dt_cuda_set_memory_opts did not turn it off: DT_CUDA_VMM=0 for dtrain), alloc_sparse
 * (sharding's arrays: mem.h, dt_mem_alloc_part) reserves an address range of whole
 * granules (2 MiB on current GPUs) and maps nothing; populate maps it granule by
 * granule, each granule its own physical allocation (cuMemCreate, cuMemMap; contents
 * undefined, as ops.h allows), so the table's page_block is the granule. discard
 * unmaps and releases the whole granules inside a range. Every other allocation is
 * cudaMalloc'd as before.
 *
 * On a GPU an unmapped granule is an illegal address: populate is not a hint here, and
 * whoever discarded a range populates it before touching it again. Work already queued
 * may still use a range being discarded, so its granules are released only once an event
 * recorded on the compute stream at the discard has completed (the caller has made that
 * stream wait for whatever else used them); a populate before then keeps them. The device
 * memory statistics count the granules mapped. */

typedef CUresult (*fn_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*fn_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*fn_addr_free)(CUdeviceptr, size_t);
typedef CUresult (*fn_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*fn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*fn_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*fn_unmap)(CUdeviceptr, size_t);

enum { G_UNMAPPED = 0, G_MAPPED, G_LEAVING };   /* a granule's state; LEAVING: released at its event */
struct sparse {
    size_t n;                              /* the reservation: n granules */
    CUmemGenericAllocationHandle *h;
    unsigned char *state;
    uint64_t *when;                        /* LEAVING: the discard that let it go */
};
struct leaving {                           /* one discard's granules, released at its event */
    cudaEvent_t ev;
    uint64_t seq;
    uintptr_t base;
    size_t i0, i1;                         /* the granules [i0, i1) it let go */
};
static struct {
    int            on;                     /* -1: not probed yet */
    int            want;                   /* dt_cuda_set_memory_opts: new sparse allocations use it */
    size_t         gran;
    CUmemAllocationProp prop;
    fn_reserve reserve; fn_addr_free addr_free; fn_create create; fn_release release;
    fn_map map; fn_access access; fn_unmap unmap;
    std::map<uintptr_t, sparse> *all;      /* by start address */
    std::vector<leaving> *pend;
    uint64_t       seq;
} vm = {-1, 1, 0, {}, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};

static dt_status cu_drv(CUresult r, const char *call) {
    if (r == CUDA_SUCCESS) return DT_OK;
    return dt_error(r == CUDA_ERROR_OUT_OF_MEMORY ? DT_ERR_NOMEM : DT_ERR_IO, "cuda: %s failed (CUresult %d)", call, (int)r);
}
#define DT_DRV(call, name) DT_TRY(cu_drv((call), name))

/* Probe once (g.mu held): the driver's calls through the runtime (no link to libcuda),
 * the granularity of this device. Any failure leaves plain cudaMalloc. */
static void vm_probe(void) {
    if (vm.on >= 0) return;
    vm.on = 0;
#if CUDART_VERSION < 12050   /* cudaGetDriverEntryPointByVersion: CUDA 12.5 on */
    return;
#else
    fn_granularity granularity = NULL;
    struct { const char *name; void **fn; } want[] = {
        {"cuMemGetAllocationGranularity", (void **)&granularity},
        {"cuMemAddressReserve", (void **)&vm.reserve}, {"cuMemAddressFree", (void **)&vm.addr_free},
        {"cuMemCreate", (void **)&vm.create},          {"cuMemRelease", (void **)&vm.release},
        {"cuMemMap", (void **)&vm.map},                {"cuMemSetAccess", (void **)&vm.access},
        {"cuMemUnmap", (void **)&vm.unmap},
    };
    cudaDriverEntryPointQueryResult q;
    for (auto &w : want)
        if (cudaGetDriverEntryPointByVersion(w.name, w.fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !*w.fn) {
            cudaGetLastError();
            return;
        }
    vm.prop = CUmemAllocationProp{};
    vm.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    vm.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    vm.prop.location.id = g.device;
    size_t gr = 0;
    if (granularity(&gr, &vm.prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || gr == 0 || (gr & (gr - 1))) return;
    vm.gran = gr;
    vm.all = new std::map<uintptr_t, sparse>();
    vm.pend = new std::vector<leaving>();
    vm.on = 1;
#endif
}

long long dt_cu_conv_cache_mb = 0;

extern "C" void dt_cuda_set_memory_opts(int vmm, long long conv_cache_mb) {
    {
        std::lock_guard<std::mutex> l(g.mu);
        vm.want = vmm != 0;
    }
    dt_cu_conv_cache_mb = conv_cache_mb;
}

/* Granule i of sp (at base) mapped: a physical allocation of its own. */
static dt_status vm_map_one(uintptr_t base, sparse &sp, size_t i) {
    CUmemGenericAllocationHandle h;
    CUdeviceptr a = (CUdeviceptr)(base + i * vm.gran);
    DT_DRV(vm.create(&h, vm.gran, &vm.prop, 0), "cuMemCreate");
    CUresult r = vm.map(a, vm.gran, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        vm.release(h);
        return cu_drv(r, "cuMemMap");
    }
    CUmemAccessDesc d = {};
    d.location = vm.prop.location;
    d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = vm.access(a, vm.gran, &d, 1);
    if (r != CUDA_SUCCESS) {
        vm.unmap(a, vm.gran);
        vm.release(h);
        return cu_drv(r, "cuMemSetAccess");
    }
    sp.h[i] = h;
    sp.state[i] = G_MAPPED;
    g.cur += vm.gran;
    if (g.cur > g.peak) g.peak = g.cur;
    return DT_OK;
}

static dt_status vm_unmap_one(uintptr_t base, sparse &sp, size_t i) {
    CUdeviceptr a = (CUdeviceptr)(base + i * vm.gran);
    DT_DRV(vm.unmap(a, vm.gran), "cuMemUnmap");
    DT_DRV(vm.release(sp.h[i]), "cuMemRelease");
    sp.h[i] = 0;
    sp.state[i] = G_UNMAPPED;
    g.cur -= vm.gran;
    return DT_OK;
}

/* Release the granules of the discards whose event has completed (all of them, waiting,
 * when wait is set). */
static dt_status vm_settle(int wait) {
    if (!wait && collectives_elsewhere() > 0) return DT_OK;   /* no unmap now: the last collective's end settles */
    size_t k = 0;
    dt_status st = DT_OK;
    for (size_t i = 0; i < vm.pend->size(); i++) {
        leaving &l = (*vm.pend)[i];
        cudaError_t e = wait ? cudaEventSynchronize(l.ev) : cudaEventQuery(l.ev);
        if (e == cudaErrorNotReady) {
            (*vm.pend)[k++] = l;
            continue;
        }
        if (e != cudaSuccess && st == DT_OK) st = dt_cu_fail(e, "discard", "cudaEventQuery");
        cudaEventDestroy(l.ev);
        auto it = vm.all->find(l.base);
        if (it == vm.all->end()) continue;
        sparse &sp = it->second;
        for (size_t j = l.i0; j < l.i1; j++)
            if (sp.state[j] == G_LEAVING && sp.when[j] == l.seq && st == DT_OK) st = vm_unmap_one(l.base, sp, j);
    }
    vm.pend->resize(k);
    return st;
}

extern "C" void dt_cuda_collective_begin(void) {
    std::lock_guard<std::mutex> l(g.mu);
    gate_n++;
    gate_mine++;
}

extern "C" void dt_cuda_collective_end(void) {
    std::lock_guard<std::mutex> l(g.mu);
    gate_n--;
    gate_mine--;
    if (gate_n > 0) return;
    gate_cv.notify_all();
    /* the discards deferred while collectives were in flight; a failure here leaves its
     * granule mapped, and the device's sticky error ends the run at its next call */
    if (vm.on == 1 && !vm.pend->empty() && vm_settle(0) != DT_OK) dt_error_clear();
}

/* The sparse allocation holding [a, a + n), or NULL. */
static std::pair<const uintptr_t, sparse> *vm_find(uintptr_t a, size_t n) {
    if (vm.on != 1 || vm.all->empty()) return NULL;
    auto it = vm.all->upper_bound(a);
    if (it == vm.all->begin()) return NULL;
    --it;
    return a + n <= it->first + it->second.n * vm.gran ? &*it : NULL;
}

static void vm_free_arrays(sparse &sp) {
    free(sp.h);
    free(sp.state);
    free(sp.when);
}

static dt_status vm_free_all(uintptr_t base, sparse &sp) {
    dt_status st = DT_OK;
    for (size_t i = 0; i < sp.n; i++)
        if (sp.state[i] != G_UNMAPPED) {
            dt_status s2 = vm_unmap_one(base, sp, i);
            if (st == DT_OK) st = s2;
        }
    dt_status s2 = cu_drv(vm.addr_free((CUdeviceptr)base, sp.n * vm.gran), "cuMemAddressFree");
    vm_free_arrays(sp);
    return st != DT_OK ? st : s2;
}

/* A sparse allocation of bytes (g.mu held), nothing mapped. */
static dt_status vm_alloc(void **p, size_t bytes) {
    sparse sp = {};
    sp.n = (bytes + vm.gran - 1) / vm.gran;
    sp.h = (CUmemGenericAllocationHandle *)calloc(sp.n, sizeof *sp.h);
    sp.state = (unsigned char *)calloc(sp.n, 1);
    sp.when = (uint64_t *)calloc(sp.n, sizeof *sp.when);
    CUdeviceptr a = 0;
    dt_status st = sp.h && sp.state && sp.when ? DT_OK : dt_error(DT_ERR_NOMEM, "cuda alloc: out of host memory");
    if (st == DT_OK) st = cu_drv(vm.reserve(&a, sp.n * vm.gran, vm.gran, 0, 0), "cuMemAddressReserve");
    if (st != DT_OK) {
        vm_free_arrays(sp);
        return st;
    }
    (*vm.all)[(uintptr_t)a] = sp;
    *p = (void *)(uintptr_t)a;
    return DT_OK;
}

/* Device memory: cudaMalloc'd, or with sparse set (and the driver's calls) a sparse
 * allocation with nothing mapped yet. */
static dt_status alloc_dev(void **p, size_t bytes, int sparse) {
    if (!p) return dt_error(DT_ERR_INVALID, "cuda alloc: NULL result pointer");
    *p = NULL;
    if (bytes == 0) return DT_OK;
    DT_TRY(dt_cu_enter());
    {
        std::lock_guard<std::mutex> l(g.mu);
        vm_probe();
        if (vm.on == 1 && vm.want && sparse) {
            dt_status st = vm_alloc(p, bytes);
            if (st == DT_OK || st != DT_ERR_NOMEM) return st;
            dt_error_clear();   /* fall back: cudaMalloc below says how much is free */
        }
    }
    void *q = NULL;
    std::unique_lock<std::mutex> l(g.mu);
    no_collectives_elsewhere(l);
    cudaError_t e = cudaMalloc(&q, bytes);   /* 256-byte aligned */
    if (e != cudaSuccess) {
        cudaGetLastError();   /* clear the non-sticky error */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return dt_error(e == cudaErrorMemoryAllocation ? DT_ERR_NOMEM : DT_ERR_IO,
                        "cuda alloc: cudaMalloc of %zu bytes failed: %s (device %d: %zu of %zu bytes free, %zu allocated by dtrain)",
                        bytes, cudaGetErrorString(e), g.device, fr, tot, g.cur);
    }
    mem_track_locked(q, bytes);
    *p = q;
    return DT_OK;
}

extern "C" int dt_cuda_owns(const void *p) {
    if (!p) return 0;
    std::lock_guard<std::mutex> l(g.mu);
    if (vm.all && vm_find((uintptr_t)p, 0)) return 1;
    if (g.sizes)
        for (const auto &kv : *g.sizes)
            if ((uintptr_t)p >= (uintptr_t)kv.first && (uintptr_t)p - (uintptr_t)kv.first < kv.second) return 1;
    return 0;
}

void dt_cu_free(void *p) {
    if (!p || dt_cu_enter() != DT_OK) return;
    std::unique_lock<std::mutex> l(g.mu);
    no_collectives_elsewhere(l);
    auto *it = vm_find((uintptr_t)p, 0);
    if (it && it->first == (uintptr_t)p) {
        cudaDeviceSynchronize();   /* as cudaFree: nothing queued uses it after this */
        vm_settle(1);
        vm_free_all(it->first, it->second);
        vm.all->erase(it->first);
        return;
    }
    mem_untrack_locked(p);
    cudaFree(p);
}

static dt_status cu_alloc(void **p, size_t bytes) { return alloc_dev(p, bytes, 0); }
static dt_status cu_alloc_sparse(void **p, size_t bytes) { return alloc_dev(p, bytes, 1); }
dt_status dt_cu_alloc(void **p, size_t bytes) { return alloc_dev(p, bytes, 0); }

/* A freed buffer's address may come back for other data: columns cached for it go. */
static void cu_free(void *p) {
    if (!p) return;
    dt_cu_conv_forget(p);
    dt_cu_free(p);
}

/* Discard (below): the whole granules inside [a, b) of sp go back once the work queued
 * so far is done. */
static dt_status vm_discard(uintptr_t base, sparse &sp, size_t a, size_t b) {
    size_t i0 = (a + vm.gran - 1) / vm.gran, i1 = b / vm.gran;
    int any = 0;
    for (size_t i = i0; i < i1; i++) any |= sp.state[i] == G_MAPPED;
    if (!any) return vm_settle(0);
    leaving lv = {NULL, ++vm.seq, base, i0, i1};
    DT_CU(cudaEventCreateWithFlags(&lv.ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(lv.ev, g.stream);
    if (e != cudaSuccess) {
        cudaEventDestroy(lv.ev);
        return dt_cu_fail(e, "discard", "cudaEventRecord");
    }
    for (size_t i = i0; i < i1; i++)
        if (sp.state[i] == G_MAPPED) {
            sp.state[i] = G_LEAVING;
            sp.when[i] = lv.seq;
        }
    vm.pend->push_back(lv);
    return vm_settle(0);
}

/* Populate (below): every granule that [a, b) touches is mapped (one being given back is
 * kept). */
static dt_status vm_populate(uintptr_t base, sparse &sp, size_t a, size_t b) {
    for (size_t i = a / vm.gran; i < (b + vm.gran - 1) / vm.gran; i++) {
        if (sp.state[i] == G_LEAVING) sp.state[i] = G_MAPPED;
        else if (sp.state[i] == G_UNMAPPED) DT_TRY(vm_map_one(base, sp, i));
    }
    return vm_settle(0);
}

/* discard and populate: on [p, p + bytes) of a sparse allocation; elsewhere (cudaMalloc'd
 * memory) nothing to do: discarding keeps the memory. */
static dt_status sparse_op(void *p, size_t bytes, int discard) {
    if (!p || bytes == 0) return DT_OK;
    DT_TRY(dt_cu_enter());
    std::lock_guard<std::mutex> l(g.mu);
    auto *it = vm_find((uintptr_t)p, bytes);
    if (!it) return DT_OK;
    size_t a = (uintptr_t)p - it->first;
    return discard ? vm_discard(it->first, it->second, a, a + bytes) : vm_populate(it->first, it->second, a, a + bytes);
}
static dt_status cu_discard(void *p, size_t bytes) { return sparse_op(p, bytes, 1); }
static dt_status cu_populate(void *p, size_t bytes) { return sparse_op(p, bytes, 0); }

/* granules are never split: nothing to do */
static dt_status cu_small_pages(void *p, size_t bytes) {
    (void)p;
    (void)bytes;
    return DT_OK;
}

static dt_status cu_zero(void *p, size_t bytes) {
    if (bytes == 0) return DT_OK;
    if (!p) return dt_error(DT_ERR_INVALID, "cuda zero: NULL pointer for %zu bytes", bytes);
    DT_TRY(dt_cu_enter());
    DT_CU(cudaMemsetAsync(p, 0, bytes, g.stream));
    return DT_OK;
}

static dt_status cu_copy_h2d_async(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return DT_OK;
    if (!dst || !src) return dt_error(DT_ERR_INVALID, "cuda copy_h2d: NULL pointer for %zu bytes", bytes);
    DT_TRY(dt_cu_enter());
    DT_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g.stream));
    return DT_OK;
}

static dt_status cu_copy_h2d(void *dst, const void *src, size_t bytes) {
    DT_TRY(cu_copy_h2d_async(dst, src, bytes));
    if (bytes) DT_CU(cudaStreamSynchronize(g.stream));   /* src may be reused as soon as we return */
    return DT_OK;
}

static dt_status cu_copy_d2h(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return DT_OK;
    if (!dst || !src) return dt_error(DT_ERR_INVALID, "cuda copy_d2h: NULL pointer for %zu bytes", bytes);
    DT_TRY(dt_cu_enter());
    DT_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g.stream));
    return sync_and_check();
}

static dt_status cu_copy_d2d(void *dst, const void *src, size_t bytes) {
    if (bytes == 0 || dst == src) return DT_OK;
    if (!dst || !src) return dt_error(DT_ERR_INVALID, "cuda copy_d2d: NULL pointer for %zu bytes", bytes);
    DT_TRY(dt_cu_enter());
    DT_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream));
    return DT_OK;
}

static dt_status cu_host_alloc(void **p, size_t bytes) {
    if (!p) return dt_error(DT_ERR_INVALID, "cuda host_alloc: NULL result pointer");
    *p = NULL;
    if (bytes == 0) return DT_OK;
    DT_TRY(dt_cu_enter());
    std::unique_lock<std::mutex> l(g.mu);
    no_collectives_elsewhere(l);
    DT_CU(cudaHostAlloc(p, bytes, cudaHostAllocPortable));
    return DT_OK;
}

static void cu_memory(size_t *current, size_t *peak, int reset_peak) {
    if (reset_peak) dt_cuda_reset_peak_memory();
    if (current) *current = dt_cuda_memory_allocated();
    if (peak) *peak = dt_cuda_max_memory_allocated();
}

static void cu_host_free(void *p) {
    if (!p) return;
    std::unique_lock<std::mutex> l(g.mu);
    no_collectives_elsewhere(l);
    cudaFreeHost(p);
}

static dt_status cu_synchronize(void) {
    DT_TRY(dt_cu_enter());
    return sync_and_check();
}

/* The GPU has no host threads to set; the count is kept so threads() answers what
 * set_threads() was given. */
static dt_status cu_set_threads(int n) {
    if (n < 1) return dt_error(DT_ERR_INVALID, "cuda set_threads: thread count must be >= 1, got %d", n);
    g.threads = n;
    return DT_OK;
}

static int cu_threads(void) { return g.threads; }

/* ---- GEMM ---- */

/* C (M, N) with row stride ldc: C = beta * C (beta = 0 writes zeros, NaN or not). */
__global__ void __launch_bounds__(DT_CU_THREADS) k_scale_matrix(float *C, int M, int N, int ldc, float beta) {
    size_t total = (size_t)M * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        float *c = C + (i / N) * (size_t)ldc + i % N;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

static dt_status gemm_check(const char *fn, int transA, int transB, int M, int N, int K,
                            const float *A, int lda, const float *B, int ldb, const float *C, int ldc) {
    if (M < 0 || N < 0 || K < 0)
        return dt_error(DT_ERR_INVALID, "cuda %s: negative size M=%d N=%d K=%d", fn, M, N, K);
    int acols = transA ? M : K, bcols = transB ? K : N;
    if (lda < (acols > 1 ? acols : 1) || ldb < (bcols > 1 ? bcols : 1) || ldc < (N > 1 ? N : 1))
        return dt_error(DT_ERR_INVALID, "cuda %s: leading dimension too small (lda=%d ldb=%d ldc=%d for M=%d N=%d K=%d, transA=%d transB=%d)",
                        fn, lda, ldb, ldc, M, N, K, transA, transB);
    if ((M > 0 && N > 0 && !C) || (M > 0 && N > 0 && K > 0 && (!A || !B)))
        return dt_error(DT_ERR_INVALID, "cuda %s: NULL matrix pointer", fn);
    return DT_OK;
}

dt_status dt_cu_gemm(const char *fn, int transA, int transB, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return DT_OK;
    if (K == 0) {   /* C = beta*C, as the CPU backend */
        k_scale_matrix<<<dt_cu_blocks((size_t)M * N), DT_CU_THREADS, 0, g.stream>>>(C, M, N, ldc, beta);
        DT_CU_LAUNCH("k_scale_matrix");
        return DT_OK;
    }
    cublasStatus_t e = cublasSgemm(g.blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc);
    if (e != CUBLAS_STATUS_SUCCESS) return dt_cublas_fail(e, fn, "cublasSgemm");
    return dt_cu_sync_launches ? dt_cu_sync_after(fn, "cublasSgemm") : DT_OK;
}

dt_status dt_cu_gemm_batched(const char *fn, int dtype, int transA, int transB, int M, int N, int K, float alpha,
                             const float *A, int lda, long long sa, const float *B, int ldb, long long sb, float beta,
                             float *C, int ldc, long long sc, int batch) {
    if (M == 0 || N == 0 || batch == 0) return DT_OK;
    if (dtype == DT_BF16 || dtype == DT_F16) {
        cublasStatus_t e = cublasGemmStridedBatchedEx(
            g.blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N, transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
            CUDA_R_32F, ldb, sb, A, CUDA_R_32F, lda, sa, &beta, C, CUDA_R_32F, ldc, sc, batch,
            dtype == DT_BF16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F_FAST_16F, CUBLAS_GEMM_DEFAULT);
        if (e != CUBLAS_STATUS_SUCCESS) return dt_cublas_fail(e, fn, "cublasGemmStridedBatchedEx");
        return dt_cu_sync_launches ? dt_cu_sync_after(fn, "cublasGemmStridedBatchedEx") : DT_OK;
    }
    cublasStatus_t e = cublasSgemmStridedBatched(g.blas, transB ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                 transA ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, sb, A,
                                                 lda, sa, &beta, C, ldc, sc, batch);
    if (e != CUBLAS_STATUS_SUCCESS) return dt_cublas_fail(e, fn, "cublasSgemmStridedBatched");
    return dt_cu_sync_launches ? dt_cu_sync_after(fn, "cublasSgemmStridedBatched") : DT_OK;
}

dt_status dt_cu_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                      const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    DT_TRY(gemm_check("sgemm", transA, transB, M, N, K, A, lda, B, ldb, C, ldc));
    DT_TRY(dt_cu_enter());
    return dt_cu_gemm("sgemm", transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* ---- pairwise combination (shared by the sums and losses) ---- */

/* One block: the same tree as dt_cpu_pairwise (dt_cu_block_pairwise). */
__global__ void __launch_bounds__(1024) k_pairwise(double *v, double *tmp, size_t n, double divisor, float *out) {
    const double sum = dt_cu_block_pairwise(v, tmp, n);
    if (threadIdx.x == 0) *out = (float)(sum / divisor);
}

dt_status dt_cu_pairwise(double *v, double *tmp, size_t n, double divisor, float *out) {
    k_pairwise<<<1, 1024, 0, g.stream>>>(v, tmp, n, divisor, out);
    DT_CU_LAUNCH("k_pairwise");
    return DT_OK;
}

/* ---- device time for --trace (ops.h mark, marks_read) ---- */

static cudaEvent_t marks[DT_OPS_MARKS];
static int nmarks, marks_made;

static dt_status cu_mark(int *id) {
    *id = -1;
    if (nmarks == DT_OPS_MARKS) return DT_OK;
    DT_TRY(dt_cu_enter());
    if (nmarks == marks_made) {
        DT_CU(cudaEventCreate(&marks[marks_made]));
        marks_made++;
    }
    DT_CU(cudaEventRecord(marks[nmarks], g.stream));
    *id = nmarks++;
    return DT_OK;
}

static dt_status cu_marks_read(double *sec, int n) {
    int have = nmarks;
    nmarks = 0;
    if (!have) return DT_OK;
    DT_TRY(dt_cu_enter());
    DT_CU(cudaEventSynchronize(marks[have - 1]));
    for (int i = 0; i < n && i < have; i++) {
        float ms = 0.0f;
        DT_CU(cudaEventElapsedTime(&ms, marks[0], marks[i]));
        sec[i] = ms * 1e-3;
    }
    return DT_OK;
}

/* ---- the table ---- */

/* Generated from ops.h's lists: the memory functions above are cu_<name>, the kernels
 * dt_cu_<op> (cuda_impl.h); one missing is a compile error here. */
#define DT_OPS_DEVFN(name) cu_##name
#define DT_OPS_KERNEL(name) dt_cu_##name
static dt_ops cuda_table = {
    .name        = "cuda",
    .host_memory = 0,
    .page_block  = 0,      /* the granule of sparse allocations, once probed (dt_ops_cuda) */
    DT_OPS_TABLE_INIT(cu_memory, cu_mark, cu_marks_read)
};

extern "C" const dt_ops *dt_ops_cuda(int index, int allow_tf32) {
    int created = 0;
    if (ctx_use(index, allow_tf32, &created) != DT_OK) return NULL;   /* the message says why */
    if (!created && dt_cuda_set_allow_tf32(allow_tf32) != DT_OK) return NULL;
    if (dt_cu_enter() != DT_OK) return NULL;
    {
        std::lock_guard<std::mutex> l(g.mu);
        vm_probe();
        cuda_table.page_block = vm.on == 1 && vm.want ? vm.gran : 0;
    }
    return &cuda_table;
}
