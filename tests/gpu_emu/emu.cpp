/* gpu_emu/emu.cpp: the CPU side of the CUDA stand-in (see cuda_runtime.h here): the
 * fiber scheduler that runs a launch, the tracked memory, the lazy streams and events,
 * and the runtime and cuBLAS calls the backend uses.
 *
 * One recursive lock guards everything: queued work runs on whichever host thread waits
 * for it (a communication worker may run the compute stream up to an event), never on
 * two at once. */
#include "cublas_v2.h"
#include "cuda.h"
extern "C" {
#include "dtype.h"   /* the bf16 and f16 conversions of FAST_16BF and FAST_16F */
}

#include <atomic>
#include <cblas.h>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <vector>

dim3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;

static std::recursive_mutex mu;
#define LOCK std::lock_guard<std::recursive_mutex> lock_(mu)

/* ---- errors: the last error of each thread, one sticky error, their texts ---- */

static thread_local cudaError_t last_err = cudaSuccess;
static cudaError_t sticky = cudaSuccess;
static std::map<int, std::string> detail;   /* error code -> the text of its latest occurrence */

/* ---- the fibers of one launch ----
 * The threads of a block run as fibers that switch at __syncthreads and meet at warp
 * shuffles (emu_warp.h). A kernel whose thread 0 (of block 0) never reaches either runs
 * its threads as plain calls instead (far fewer context switches); a later thread that
 * does reach one then is a barrier in divergent code, and the emulation stops there,
 * naming the kernel. */

static std::vector<ucontext_t> fibers;
static std::vector<char> stacks;
static std::vector<int> finished;
/* Where a thread waits: running, at __syncthreads, or at a warp rendezvous of the lanes
 * in wait_mask. */
enum { RUN, AT_BLOCK, AT_WARP };
static std::vector<int> waiting;
static std::vector<unsigned> wait_mask;
static std::vector<uint64_t> shfl_slots;
static ucontext_t scheduler;
static std::vector<int> thread_order, block_order;   /* the run order (run_order below) */
static int current, synced, direct;
static const char *kernel_name;
static const std::function<void()> *body;
static const size_t STACK = 256 * 1024;

static void trampoline(void) {
    (*body)();
    finished[current] = 1;   /* uc_link returns to the scheduler */
}

static void divergent(const char *what) {
    fprintf(stderr, "gpu_emu: kernel %s: thread (%u, %u, %u) of block (%u, %u, %u) reached %s, which thread 0 of "
            "block %d never did: a barrier in divergent code\n", kernel_name, emu_threadIdx.x, emu_threadIdx.y,
            emu_threadIdx.z, emu_blockIdx.x, emu_blockIdx.y, emu_blockIdx.z, what, block_order[0]);
    abort();
}

void __syncthreads(void) {
    if (direct) divergent("__syncthreads");
    synced = 1;
    waiting[current] = AT_BLOCK;
    swapcontext(&fibers[current], &scheduler);
}

void emu_warp_sync(unsigned mask) {
    if (direct) divergent("a warp shuffle");
    synced = 1;
    waiting[current] = AT_WARP;
    wait_mask[current] = mask;
    swapcontext(&fibers[current], &scheduler);
}

uint64_t *emu_shfl_slots(void) { return shfl_slots.data(); }

[[noreturn]] static void emu_die(const char *what, int thread) {
    fprintf(stderr, "gpu_emu: kernel %s: block (%u,%u,%u) thread %d: %s\n", kernel_name, emu_blockIdx.x,
            emu_blockIdx.y, emu_blockIdx.z, thread, what);
    abort();
}

/* After a round: release the warps whose named lanes all wait at a warp rendezvous,
 * else the block when every live thread waits at __syncthreads. 0 when all finished. */
static int release(int nt) {
    int live = 0, released = 0, at_block = 0;
    for (int w0 = 0; w0 < nt; w0 += 32) {
        const int w1 = w0 + 32 < nt ? w0 + 32 : nt;
        int lead = -1;
        for (int i = w0; i < w1; i++)
            if (!finished[i] && waiting[i] == AT_WARP) { lead = i; break; }
        if (lead < 0) continue;
        const unsigned mask = wait_mask[lead];
        int all = 1;
        for (int i = w0; i < w1; i++) {
            if (!(mask >> (i - w0) & 1u)) continue;
            if (finished[i]) emu_die("a lane named in a warp shuffle or __syncwarp mask has exited", i);
            if (waiting[i] == AT_BLOCK) emu_die("lanes of one warp wait at __syncthreads and at a warp shuffle", i);
            if (waiting[i] != AT_WARP) all = 0;
        }
        if (!all) continue;
        for (int i = w0; i < w1; i++)
            if (mask >> (i - w0) & 1u) waiting[i] = RUN;
        released = 1;
    }
    for (int i = 0; i < nt; i++)
        if (!finished[i]) { live++; at_block += waiting[i] == AT_BLOCK; }
    if (released || live == 0) return live;
    if (at_block != live) emu_die("deadlock: threads wait at warp shuffles that can never complete", 0);
    for (int i = 0; i < nt; i++) waiting[i] = RUN;
    return live;
}

static dim3 thread_of(int i, dim3 b) { return dim3(i % b.x, (i / b.x) % b.y, i / (b.x * b.y)); }

static void fiber_make(int i) {
    getcontext(&fibers[i]);
    fibers[i].uc_stack.ss_sp = &stacks[(size_t)i * STACK];
    fibers[i].uc_stack.ss_size = STACK;
    fibers[i].uc_link = &scheduler;
    makecontext(&fibers[i], trampoline, 0);
    finished[i] = 0;
    waiting[i] = RUN;
}

static void fiber_step(int i, dim3 b) {
    current = i;
    emu_threadIdx = thread_of(i, b);
    swapcontext(&scheduler, &fibers[i]);
}

/* DT_GPU_EMU_ORDER: the order the blocks of a launch, and the threads of a block between
 * two barriers, run in. A GPU promises none, so a kernel's output must not depend on it:
 *   natural  (the default) blocks and threads by rising index;
 *   reverse  both by falling index;
 *   shuffle  a permutation of each, drawn anew for every launch (a fixed sequence of
 *            seeds: a run repeats itself).
 * Thread 0 of the first block run still runs first (it tells whether the kernel
 * synchronises at all). */
enum { ORDER_NATURAL, ORDER_REVERSE, ORDER_SHUFFLE };
static int run_order(void) {
    static int order = -1;
    if (order < 0) {
        const char *v = getenv("DT_GPU_EMU_ORDER");
        if (!v || !*v || !strcmp(v, "natural")) order = ORDER_NATURAL;
        else if (!strcmp(v, "reverse")) order = ORDER_REVERSE;
        else if (!strcmp(v, "shuffle")) order = ORDER_SHUFFLE;
        else {
            fprintf(stderr, "gpu_emu: DT_GPU_EMU_ORDER='%s': expected natural, reverse or shuffle\n", v);
            exit(2);
        }
    }
    return order;
}

/* 0 .. n - 1 in the run order into v (a shuffle from *seed, which moves on) */
static void permutation(std::vector<int> &v, int n, int order, uint64_t *seed) {
    v.resize((size_t)n);
    for (int i = 0; i < n; i++) v[(size_t)i] = order == ORDER_REVERSE ? n - 1 - i : i;
    if (order != ORDER_SHUFFLE) return;
    for (int i = n - 1; i > 0; i--) {   /* Fisher-Yates over xorshift64 */
        *seed ^= *seed << 13, *seed ^= *seed >> 7, *seed ^= *seed << 17;
        int j = (int)(*seed % (uint64_t)(i + 1));
        int t = v[(size_t)i];
        v[(size_t)i] = v[(size_t)j];
        v[(size_t)j] = t;
    }
}

static void run_direct(int nt, dim3 b) {
    direct = 1;
    for (int k = 0; k < nt; k++) {
        int i = thread_order[(size_t)k];
        if (i == 0) continue;   /* thread 0 has run */
        emu_threadIdx = thread_of(i, b);
        (*body)();
    }
    direct = 0;
}

void emu_exec(const char *name, dim3 g, dim3 b, const std::function<void()> &f) {
    LOCK;
    const char *inject = getenv("DT_GPU_EMU_FAULT");
    if (inject && !strcmp(inject, name)) {   /* an asynchronous fault that names nothing */
        detail[cudaErrorIllegalAddress] = "an illegal memory access was encountered";
        sticky = cudaErrorIllegalAddress;
        return;
    }
    const int nt = (int)(b.x * b.y * b.z);
    if ((int)fibers.size() < nt) {
        fibers.resize(nt);
        stacks.resize((size_t)nt * STACK);
        finished.resize(nt);
        waiting.resize(nt);
        wait_mask.resize(nt);
        shfl_slots.resize(nt);
    }
    body = &f;
    kernel_name = name;
    emu_blockDim = b;
    emu_gridDim = g;
    static uint64_t seed = 0x9e3779b97f4a7c15ull;
    const int order = run_order(), nb = (int)(g.x * g.y * g.z);
    permutation(thread_order, nt, order, &seed);
    permutation(block_order, nb, order, &seed);
    int plain = 0;
    for (int k = 0; k < nb; k++) {
        const int q = block_order[(size_t)k];
        emu_blockIdx = dim3((unsigned)q % g.x, (unsigned)q / g.x % g.y, (unsigned)q / (g.x * g.y));
        /* thread 0 alone first: does this kernel synchronise at all? (first block only) */
        if (!plain) {
            synced = 0;
            fiber_make(0);
            fiber_step(0, b);
            if (finished[0] && !synced && k == 0) plain = 1;
        } else {
            emu_threadIdx = thread_of(0, b);
            direct = 1;
            (*body)();
            direct = 0;
        }
        if (plain) {
            run_direct(nt, b);
            continue;
        }
        for (int i = 1; i < nt; i++) fiber_make(i);
        /* rounds: every running thread runs to its next barrier or its end (thread 0 has
         * run its first stretch already, and waits or has finished) */
        do {
            for (int j = 0; j < nt; j++) {
                const int i = thread_order[(size_t)j];
                if (finished[i] || waiting[i] != RUN) continue;
                fiber_step(i, b);
            }
        } while (release(nt));
    }
}

static cudaError_t fail(cudaError_t e, const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    detail[e] = buf;
    last_err = e;
    return e;
}

extern "C" void emu_fault(const char *call, const char *what) {
    LOCK;
    fprintf(stderr, "gpu_emu: %s: %s\n", call, what);
    fail(cudaErrorIllegalAddress, "%s: %s (an illegal address on a GPU; gpu_emu)", call, what);
    sticky = cudaErrorIllegalAddress;
}

#define STICKY do { if (sticky != cudaSuccess) return last_err = sticky; } while (0)

/* ---- devices ---- */

static int ndev = -1;
static thread_local int cur_dev = 0;

static int device_count(void) {
    if (ndev < 0) {
        const char *v = getenv("DT_GPU_EMU_DEVICES");
        ndev = v && *v ? atoi(v) : 1;
        if (ndev < 0 || ndev > 64) ndev = 1;
    }
    return ndev;
}

extern "C" int emu_device(void) { return cur_dev; }

/* The physical index of visible device d: the d-th entry of CUDA_VISIBLE_DEVICES, else d. */
static int physical(int d) {
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v || !*v) return d;
    for (int i = 0; *v; i++) {
        if (i == d) return atoi(v);
        const char *comma = strchr(v, ',');
        if (!comma) break;
        v = comma + 1;
    }
    return d;
}

static int driver_version(void) {
    const char *v = getenv("DT_GPU_EMU_DRIVER");
    return v && *v ? atoi(v) : CUDART_VERSION;
}

/* DT_GPU_EMU_MARK=FILE: create FILE, so a test can tell the stand-in was used. */
extern "C" cudaError_t cudaGetDeviceCount(int *n) {
    LOCK;
    const char *mark = getenv("DT_GPU_EMU_MARK");
    FILE *f = mark ? fopen(mark, "w") : NULL;
    if (f) fclose(f);
    *n = 0;
    if (driver_version() < CUDART_VERSION)
        return fail(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version");
    *n = device_count();
    if (*n == 0) return fail(cudaErrorNoDevice, "no CUDA-capable device is detected");
    return cudaSuccess;
}

extern "C" cudaError_t cudaSetDevice(int d) {
    LOCK;
    STICKY;
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice, "invalid device ordinal %d", d);
    cur_dev = d;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDevice(int *d) { *d = cur_dev; return cudaSuccess; }

extern "C" cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int d) {
    LOCK;
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice, "invalid device ordinal %d", d);
    snprintf(buf, (size_t)len, "0000:%02X:00.0", 0x10 + physical(d));
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    LOCK;
    if (d < 0 || d >= device_count()) return fail(cudaErrorInvalidDevice, "invalid device ordinal %d", d);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "gpu_emu (CPU emulation)");
    p->totalGlobalMem = (size_t)16 << 30;
    p->sharedMemPerBlock = 48 << 10;
    p->maxThreadsPerBlock = 1024;
    p->multiProcessorCount = 4;
    p->major = 9;
    p->pciBusID = 0x10 + physical(d);
    return cudaSuccess;
}

extern "C" cudaError_t cudaDriverGetVersion(int *v) { *v = driver_version(); return cudaSuccess; }
extern "C" cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }

/* ---- memory: the tracked ranges ---- */

enum { MEM_HOST = 0, MEM_PINNED = 1, MEM_DEVICE = 2 };
struct region {
    size_t size;
    int    kind, device;
};
static std::map<uintptr_t, region> regions;
static size_t device_bytes;

/* The range holding p (p may be its end when at_end); NULL if none. */
static const std::pair<const uintptr_t, region> *find(const void *p, int at_end) {
    uintptr_t a = (uintptr_t)p;
    auto it = regions.upper_bound(a);
    if (it == regions.begin()) return NULL;
    --it;
    if (a < it->first + it->second.size || (at_end && a == it->first + it->second.size)) return &*it;
    return NULL;
}

extern "C" int emu_mem_kind(const void *p, size_t bytes) {
    LOCK;
    auto r = find(p, 0);
    if (!r || (uintptr_t)p + bytes > r->first + r->second.size) return MEM_HOST;
    return r->second.kind;
}

/* Where [p, p + bytes) is, in words, for messages: 0 when device (or pinned, if allowed)
 * memory of the current device. */
static int describe(const void *p, size_t bytes, int pinned_ok, char *buf, size_t n) {
    auto r = find(p, bytes == 0);
    if (!r) {
        snprintf(buf, n, "%p is host memory, not device memory", p);
        return 1;
    }
    if ((uintptr_t)p + bytes > r->first + r->second.size) {
        snprintf(buf, n, "%p + %zu bytes runs past the end of its allocation (%#lx, %zu bytes)", p, bytes,
                 (unsigned long)r->first, r->second.size);
        return 1;
    }
    if (r->second.kind == MEM_PINNED && !pinned_ok) {
        snprintf(buf, n, "%p is pinned host memory, not device memory", p);
        return 1;
    }
    if (r->second.kind == MEM_DEVICE && r->second.device != cur_dev) {
        snprintf(buf, n, "%p is memory of device %d; the current device is %d", p, r->second.device, cur_dev);
        return 1;
    }
    return 0;
}

extern "C" int emu_check_range(const char *call, const char *arg, const void *p, size_t bytes, char *buf, size_t n) {
    LOCK;
    char what[300];
    if (bytes == 0 || !describe(p, bytes, 1, what, sizeof what)) return 1;
    snprintf(buf, n, "%s: %s %s", call, arg, what);
    return 0;
}

static cudaError_t track(void *p, size_t bytes, int kind) {
    regions[(uintptr_t)p] = region{bytes, kind, cur_dev};
    if (kind == MEM_DEVICE) device_bytes += bytes;
    return cudaSuccess;
}

/* ---- host synchronisations: DT_GPU_EMU_SYNCS=FILE counts the calls that block the
 * host until the device is done (stream, event and device synchronisations, cudaMemcpy,
 * cudaFree and cudaFreeHost) and writes "syncs N" there at exit ---- */

static unsigned long host_syncs;
static struct sync_report {
    ~sync_report() {
        const char *f = getenv("DT_GPU_EMU_SYNCS");
        FILE *o = f && *f ? fopen(f, "w") : NULL;
        if (o) {
            fprintf(o, "syncs %lu\n", host_syncs);
            fclose(o);
        }
    }
} sync_report_at_exit;

/* ---- streams: queued work, run when waited for ---- */

struct item {
    uint64_t              seq;
    const char           *name;
    const void           *owner;     /* an NCCL communicator's work: its communicator */
    std::function<bool()> fn;
    int                   thread;    /* the host thread that queued it (thread_no) */
};
struct emu_stream {
    std::deque<item> q;
    uint64_t         next = 1;     /* seq of the next item */
    unsigned         flags = 0;
    int              device = 0, running = 0, stalled = 0;
};
struct emu_event {
    emu_stream             *s = NULL;
    uint64_t                seq = 0;
    std::shared_ptr<double> t = std::make_shared<double>(0.0);   /* queued work may outlive the event */
};
static emu_stream legacy;                 /* stream 0: runs at once, after the blocking streams */
static std::set<emu_stream *> streams;    /* every stream created (never freed: waits may name them) */

static emu_stream *S(cudaStream_t s) { return s ? (emu_stream *)s : &legacy; }

/* The host threads, numbered as they first queue work or call in (1, 2, ...). */
static int thread_no(void) {
    static std::atomic<int> next{1};
    static thread_local int mine = next++;
    return mine;
}

/* Run s's work up to and including seq; 0 when an item cannot finish (stalled). */
static int run_to(emu_stream *s, uint64_t seq) {
    if (s->running) return 1;   /* a wait reached back into the item being run: already ordered */
    s->running = 1;
    while (!s->stalled && !s->q.empty() && s->q.front().seq <= seq) {
        if (!s->q.front().fn()) s->stalled = 1;   /* stays at the front */
        else s->q.pop_front();
    }
    s->running = 0;
    return !s->stalled;
}
static int run_all(emu_stream *s) { return run_to(s, s->next - 1); }

/* Every stream of the current device (blocking ones only, when only_blocking). */
static int run_device(int only_blocking) {
    int good = 1;
    for (emu_stream *s : streams)
        if (s->device == cur_dev && !(only_blocking && (s->flags & cudaStreamNonBlocking))) good &= run_all(s);
    return good;
}

/* DT_GPU_EMU_EAGER=1: work runs as it is queued, where its stream has nothing before it
 * (a GPU that is never behind the host), instead of when something waits for it (one
 * that is always behind): a host write after the launch that was meant to be seen, or a
 * read before the wait that happened to see the result, shows in one of the two. NCCL's
 * work stays lazy: run at once, a collective would hold the queuing thread until its
 * peers' hosts queue theirs. */
static int eager(void) {
    static const int on = [] {
        const char *v = getenv("DT_GPU_EMU_EAGER");
        if (v && *v && strcmp(v, "0") && strcmp(v, "1")) {
            fprintf(stderr, "gpu_emu: DT_GPU_EMU_EAGER='%s': expected 0 or 1\n", v);
            exit(2);
        }
        return v && !strcmp(v, "1");
    }();
    return on;
}
static struct eager_check { eager_check() { eager(); } } eager_at_start;   /* bad: exit 2 at once */

/* Put it on s, or run it now (eager, s idle); an item that cannot finish stays first,
 * stalling s, as when run later. */
static void push(emu_stream *s, item it) {
    if (eager() && !it.owner && s->q.empty() && !s->running) {
        s->running = 1;
        int done = it.fn();
        s->running = 0;
        if (done) {
            s->next++;
            return;
        }
        s->stalled = 1;
    }
    s->next++;
    s->q.push_back(std::move(it));
}

void emu_enqueue(cudaStream_t st, const char *name, const void *owner, std::function<bool()> work) {
    LOCK;
    emu_stream *s = S(st);
    if (s == &legacy) {   /* the legacy stream waits for the blocking streams, and they for it */
        run_device(1);
        work();
        return;
    }
    push(s, item{s->next, name, owner, std::move(work), thread_no()});
}

/* A call that synchronises the device (cudaFree, cudaFreeHost, cudaMalloc, cuMemUnmap:
 * on a GPU each may wait for every kernel, or hold the context so that no other thread
 * can launch) while another host thread has NCCL work in flight can deadlock: the
 * collective's kernel waits for its peers, whose progress may wait for this process's
 * next launch. Queued NCCL work of another thread on a stream that is not stalled (a
 * failed collective is torn down, not waited for) stops the program, naming both. */
static void nccl_hazard(const char *call) {
    const int me = thread_no();
    for (emu_stream *s : streams) {
        if (s->stalled) continue;
        for (const item &it : s->q)
            if (it.owner && it.thread != me) {
                fprintf(stderr, "gpu_emu: %s on host thread %d while host thread %d has NCCL work in flight (%s, "
                        "stream %p): a call that synchronises the device can deadlock against a collective that "
                        "waits for its peers; make it where no collective is in flight\n", call, me, it.thread,
                        it.name, (void *)s);
                abort();
            }
    }
}

/* Drop the queued work of `owner` (an aborted NCCL communicator), un-stalling its streams. */
void emu_drop_owner(const void *owner) {
    LOCK;
    for (emu_stream *s : streams) {
        std::deque<item> keep;
        for (auto &it : s->q)
            if (it.owner != owner) keep.push_back(std::move(it));
        s->q.swap(keep);
        s->stalled = 0;
    }
}

static cudaError_t new_stream(cudaStream_t *out, unsigned flags) {
    emu_stream *s = new emu_stream;
    s->flags = flags;
    s->device = cur_dev;
    streams.insert(s);
    *out = (cudaStream_t)s;
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { LOCK; STICKY; return new_stream(s, 0); }
extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) { LOCK; STICKY; return new_stream(s, f); }

static const char *STALLED = "the stream holds work that cannot finish (a failed NCCL call: see ncclCommGetAsyncError)";

extern "C" cudaError_t cudaStreamDestroy(cudaStream_t st) {
    LOCK;
    if (!st || !streams.count(S(st))) return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: not a stream");
    run_all(S(st));   /* its work still completes */
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    LOCK;
    STICKY;
    host_syncs++;
    if (!run_all(S(s))) return fail(cudaErrorLaunchFailure, "%s", STALLED);
    return sticky ? last_err = sticky : cudaSuccess;
}

int emu_not_ready_of(const void *what) {
    static std::mutex m;
    static std::map<const void *, long> told;   /* "not ready"s told about each object */
    const long k = emu_not_ready_count();
    if (k <= 0) return 0;
    std::lock_guard<std::mutex> g(m);
    long &n = told[what];
    if (n < k) {
        n++;
        return 1;
    }
    n = 0;   /* the true answer; the next poll of it is told "not ready" again */
    return 0;
}

long emu_not_ready_count(void) {
    static const long k = [] {   /* read once, by whichever thread polls first */
        const char *v = getenv("DT_GPU_EMU_NOTREADY");
        char *end = NULL;
        long n = v && *v ? strtol(v, &end, 10) : 0;
        if (v && *v && (*end || n < 0 || n > 1000000)) {
            fprintf(stderr, "gpu_emu: DT_GPU_EMU_NOTREADY='%s': expected a count of polls from 0 to 1000000\n", v);
            exit(2);
        }
        return n;
    }();
    return k;
}
static struct not_ready_check { not_ready_check() { emu_not_ready_count(); } } not_ready_at_start;   /* bad: exit 2 at once */

extern "C" cudaError_t cudaStreamQuery(cudaStream_t s) {
    LOCK;
    STICKY;
    if (!S(s)->q.empty() && emu_not_ready_of(S(s))) return cudaErrorNotReady;   /* work left: maybe busy */
    if (!run_all(S(s))) return cudaErrorNotReady;
    return sticky ? last_err = sticky : cudaSuccess;
}

extern "C" cudaError_t cudaDeviceSynchronize(void) {
    LOCK;
    STICKY;
    host_syncs++;
    if (!run_device(0)) return fail(cudaErrorLaunchFailure, "%s", STALLED);
    return sticky ? last_err = sticky : cudaSuccess;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { LOCK; STICKY; *e = new emu_event; return cudaSuccess; }
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) { LOCK; delete e; return cudaSuccess; }

extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
    LOCK;
    STICKY;
    emu_stream *s = S(st);
    if (s == &legacy) {
        run_device(1);
        e->s = NULL;
        *e->t = now();
        return cudaSuccess;
    }
    e->s = s;
    e->seq = s->next;
    std::shared_ptr<double> t = e->t;
    push(s, item{s->next, "event", NULL, [t] { *t = now(); return true; }, thread_no()});
    return cudaSuccess;
}

extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned) {
    LOCK;
    STICKY;
    if (!e->s) return cudaSuccess;   /* never recorded, or on the legacy stream: nothing to wait for */
    emu_stream *from = e->s;
    uint64_t seq = e->seq;
    emu_enqueue(st, "cudaStreamWaitEvent", NULL, [from, seq] { return run_to(from, seq) != 0; });
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    LOCK;
    STICKY;
    host_syncs++;
    if (e->s && !run_to(e->s, e->seq)) return fail(cudaErrorLaunchFailure, "%s", STALLED);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) {
    LOCK;
    STICKY;
    if (e->s && !e->s->q.empty() && e->s->q.front().seq <= e->seq && emu_not_ready_of(e))   /* its work is left */
        return cudaErrorNotReady;
    if (e->s && !run_to(e->s, e->seq)) return cudaErrorNotReady;
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    LOCK;
    STICKY;
    *ms = (float)((*b->t - *a->t) * 1e3);
    return cudaSuccess;
}

/* ---- memory calls ---- */

static cudaError_t device_alloc(void **p, size_t bytes) {
    LOCK;
    *p = NULL;
    STICKY;
    if (bytes == 0) return cudaSuccess;
    /* 256-byte aligned as cudaMalloc's, and exactly `bytes` long, so that under
     * AddressSanitizer a kernel that runs past the end is caught at its first byte */
    if (posix_memalign(p, 256, bytes)) *p = NULL;
    if (!*p) return fail(cudaErrorMemoryAllocation, "out of memory");
    memset(*p, 0xff, bytes);   /* fresh device memory is not zero: NaN floats, -1 integers */
    return track(*p, bytes, MEM_DEVICE);
}

extern "C" cudaError_t cudaMalloc(void **p, size_t bytes) {
    LOCK;
    nccl_hazard("cudaMalloc");
    return device_alloc(p, bytes);
}

extern "C" cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned) {
    LOCK;
    *p = NULL;
    STICKY;
    *p = malloc(bytes ? bytes : 1);
    if (!*p) return fail(cudaErrorMemoryAllocation, "out of memory");
    return track(*p, bytes, MEM_PINNED);
}

static cudaError_t release(void *p, int kind, const char *call) {
    LOCK;
    if (!p) return cudaSuccess;
    nccl_hazard(call);
    host_syncs++;
    run_device(0);   /* an implicit device synchronisation, as on a GPU */
    auto it = regions.find((uintptr_t)p);
    if (it == regions.end() || it->second.kind != kind) {
        fprintf(stderr, "gpu_emu: %s: %p is not the start of a %s allocation\n", call, p,
                kind == MEM_DEVICE ? "cudaMalloc" : "cudaHostAlloc");
        return fail(cudaErrorInvalidValue, "%s: %p is not the start of a %s allocation", call, p,
                    kind == MEM_DEVICE ? "cudaMalloc" : "cudaHostAlloc");
    }
    if (kind == MEM_DEVICE) device_bytes -= it->second.size;
    memset(p, 0xfe, it->second.size);   /* a read after free sees garbage */
    regions.erase(it);
    free(p);
    return sticky ? last_err = sticky : cudaSuccess;
}

extern "C" cudaError_t cudaFree(void *p) { return release(p, MEM_DEVICE, "cudaFree"); }

/* Stream-ordered allocation: memory at once (valid for work queued after the call), and a
 * free queued behind the stream's work, with no synchronisation: the kernels queued
 * before it still read the old memory, and a read after it runs sees garbage. */
extern "C" cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t) { return device_alloc(p, bytes); }

extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t st) {
    LOCK;
    STICKY;
    if (!p) return cudaSuccess;
    auto it = regions.find((uintptr_t)p);
    if (it == regions.end() || it->second.kind != MEM_DEVICE) {
        fprintf(stderr, "gpu_emu: cudaFreeAsync: %p is not the start of a cudaMalloc allocation\n", p);
        return fail(cudaErrorInvalidValue, "cudaFreeAsync: %p is not the start of a cudaMalloc allocation", p);
    }
    emu_enqueue(st, "cudaFreeAsync", NULL, [p] {
        auto r = regions.find((uintptr_t)p);
        if (r == regions.end()) return false;   /* freed twice */
        device_bytes -= r->second.size;
        memset(p, 0xfe, r->second.size);
        regions.erase(r);
        free(p);
        return true;
    });
    return cudaSuccess;
}
extern "C" cudaError_t cudaFreeHost(void *p) { return release(p, MEM_PINNED, "cudaFreeHost"); }

static bool unmapped_reserved(uintptr_t a);   /* below, with the virtual memory calls */

extern "C" cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    LOCK;
    memset(a, 0, sizeof *a);
    a->device = -2;
    auto r = find(p, 0);
    /* an address of a reservation where nothing is mapped is no allocation to the runtime
     * (a GPU reports it so): unregistered, as a host pointer */
    if (!r || unmapped_reserved((uintptr_t)p)) return cudaSuccess;   /* cudaMemoryTypeUnregistered */
    a->type = r->second.kind == MEM_DEVICE ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    a->device = r->second.device;
    a->devicePointer = (void *)p;
    a->hostPointer = r->second.kind == MEM_PINNED ? (void *)p : NULL;
    return cudaSuccess;
}

static const char *const kind_name[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};

/* A copy's ranges against its kind: device ends must be device memory of this device,
 * host ends must not be device memory. */
static cudaError_t copy_check(const char *call, void *d, const void *s, size_t n, cudaMemcpyKind k) {
    if (k == cudaMemcpyDefault)
        k = (cudaMemcpyKind)((emu_mem_kind(s, n) == MEM_DEVICE ? 2 : 0) + (emu_mem_kind(d, n) == MEM_DEVICE ? 1 : 0));
    int dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice;
    int sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    char what[300];
    const void *ends[2] = {d, s};
    int dev[2] = {dd, sd};
    for (int i = 0; i < 2; i++) {
        const char *end = i ? "source" : "destination";
        if (dev[i] && describe(ends[i], n, 0, what, sizeof what)) {
            fprintf(stderr, "gpu_emu: %s (%s): the %s %s\n", call, kind_name[k], end, what);
            return fail(cudaErrorInvalidValue, "%s (%s): the %s %s", call, kind_name[k], end, what);
        }
        if (!dev[i] && emu_mem_kind(ends[i], 1) == MEM_DEVICE) {
            fprintf(stderr, "gpu_emu: %s (%s): the %s %p is device memory\n", call, kind_name[k], end, ends[i]);
            return fail(cudaErrorInvalidValue, "%s (%s): the %s %p is device memory", call, kind_name[k], end, ends[i]);
        }
    }
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    LOCK;
    STICKY;
    if (n == 0) return cudaSuccess;
    if (copy_check("cudaMemcpyAsync", d, s, n, k) != cudaSuccess) return last_err;
    emu_enqueue(st, "cudaMemcpyAsync", NULL, [d, s, n] { memmove(d, s, n); return true; });
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    host_syncs++;
    return cudaMemcpyAsync(d, s, n, k, 0);   /* the legacy stream: at once, after the blocking streams */
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st) {
    LOCK;
    STICKY;
    if (n == 0) return cudaSuccess;
    char what[300];
    if (describe(p, n, 0, what, sizeof what)) {
        fprintf(stderr, "gpu_emu: cudaMemsetAsync: %s\n", what);
        return fail(cudaErrorInvalidValue, "cudaMemsetAsync: %s", what);
    }
    emu_enqueue(st, "cudaMemsetAsync", NULL, [p, v, n] { memset(p, v, n); return true; });
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, 0); }

/* ---- the driver's virtual memory management (gpu_emu/cuda.h) ----
 * A reservation is an inaccessible mapping (PROT_NONE), tracked as device memory of the
 * current device so that pointers into it pass the calls' checks; cuMemMap makes one
 * granule of it accessible (filled with 0xff: fresh device memory is not zero),
 * cuMemUnmap makes it inaccessible again and gives its pages back. Device memory counts
 * the physical allocations (cuMemCreate .. cuMemRelease). Every call checks what the
 * driver checks: alignment to the granularity, a mapping inside a reservation, onto an
 * unmapped range, an unmap of exactly what is mapped. */

static size_t granule(void) {
    static size_t g;
    if (!g) {
        const char *e = getenv("DT_GPU_EMU_GRANULE");
        unsigned long v = e && *e ? strtoul(e, NULL, 0) : 0;
        g = v >= 4096 && (v & (v - 1)) == 0 ? v : (size_t)2 << 20;
    }
    return g;
}
struct vmm_handle { size_t size; };
static std::map<uintptr_t, size_t> reserved;          /* start -> bytes */
static std::map<uintptr_t, size_t> mapped;            /* start -> bytes */

static CUresult vfail(const char *call, const char *fmt, ...) {
    char buf[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "gpu_emu: %s: %s\n", call, buf);
    return CUDA_ERROR_INVALID_VALUE;
}

/* The reservation that holds [a, a + n), or reserved.end(). */
static std::map<uintptr_t, size_t>::iterator reservation_of(uintptr_t a, size_t n) {
    auto it = reserved.upper_bound(a);
    if (it == reserved.begin()) return reserved.end();
    --it;
    return a + n <= it->first + it->second ? it : reserved.end();
}

static bool unmapped_reserved(uintptr_t a) {
    if (reservation_of(a, 1) == reserved.end()) return false;
    auto m = mapped.upper_bound(a);
    if (m == mapped.begin()) return true;
    --m;
    return a >= m->first + m->second;
}

static CUresult emu_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags f) {
    (void)f;
    if (!g || !prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vfail("cuMemGetAllocationGranularity", "a pinned device allocation's properties expected");
    *g = granule();
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                        unsigned long long flags) {
    LOCK;
    size_t g = granule();
    if (!ptr || size == 0 || size % g || addr || flags || (align && (align & (align - 1))))
        return vfail("cuMemAddressReserve", "size %zu is not a positive multiple of the granularity %zu", size, g);
    if (align < g) align = g;
    char *p = (char *)mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t a = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (a > (uintptr_t)p) munmap(p, a - (uintptr_t)p);
    if ((uintptr_t)p + size + align > a + size) munmap((void *)(a + size), (uintptr_t)p + size + align - (a + size));
    reserved[a] = size;
    regions[a] = region{size, MEM_DEVICE, cur_dev};
    *ptr = (CUdeviceptr)a;
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    LOCK;
    auto it = reserved.find((uintptr_t)ptr);
    if (it == reserved.end() || it->second != size)
        return vfail("cuMemAddressFree", "%#llx (%zu bytes) is not a reservation", ptr, size);
    auto m = mapped.lower_bound((uintptr_t)ptr);
    if (m != mapped.end() && m->first < (uintptr_t)ptr + size)
        return vfail("cuMemAddressFree", "%#llx still has memory mapped at %#lx", ptr, (unsigned long)m->first);
    run_device(0);   /* work queued on it runs first; it would fault now */
    munmap((void *)ptr, size);
    reserved.erase(it);
    regions.erase((uintptr_t)ptr);
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                                unsigned long long flags) {
    LOCK;
    if (!h || !prop || flags || size == 0 || size % granule() || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id != cur_dev)
        return vfail("cuMemCreate", "%zu bytes on device %d: expected a multiple of the granularity on the current "
                     "device %d", size, prop ? prop->location.id : -1, cur_dev);
    *h = (CUmemGenericAllocationHandle)(uintptr_t) new vmm_handle{size};
    device_bytes += size;
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemRelease(CUmemGenericAllocationHandle h) {
    LOCK;
    vmm_handle *v = (vmm_handle *)(uintptr_t)h;
    if (!v) return vfail("cuMemRelease", "no handle");
    device_bytes -= v->size;   /* its memory goes when the last mapping does: unmapped first here */
    delete v;
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                             unsigned long long flags) {
    LOCK;
    vmm_handle *v = (vmm_handle *)(uintptr_t)h;
    uintptr_t a = (uintptr_t)ptr;
    if (!v || offset || flags || size != v->size || a % granule())
        return vfail("cuMemMap", "%#llx: %zu bytes of a handle expected whole, at a granule", ptr, size);
    if (reservation_of(a, size) == reserved.end())
        return vfail("cuMemMap", "%#llx + %zu bytes is not inside a reservation", ptr, size);
    auto m = mapped.lower_bound(a);
    if ((m != mapped.end() && m->first < a + size) || (m != mapped.begin() && std::prev(m)->first + std::prev(m)->second > a))
        return vfail("cuMemMap", "%#llx + %zu bytes overlaps a mapping", ptr, size);
    if (mprotect((void *)a, size, PROT_READ | PROT_WRITE)) return CUDA_ERROR_OUT_OF_MEMORY;
    memset((void *)a, 0xff, size);
    mapped[a] = size;
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *d, size_t count) {
    LOCK;
    auto m = mapped.find((uintptr_t)ptr);
    if (!d || count != 1 || d->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE || d->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        m == mapped.end() || m->second != size)
        return vfail("cuMemSetAccess", "%#llx + %zu bytes: read-write access from a device to one mapping expected", ptr, size);
    return CUDA_SUCCESS;
}

static CUresult emu_cuMemUnmap(CUdeviceptr ptr, size_t size) {
    LOCK;
    auto m = mapped.find((uintptr_t)ptr);
    if (m == mapped.end() || m->second != size)
        return vfail("cuMemUnmap", "%#llx + %zu bytes is not one mapping", ptr, size);
    nccl_hazard("cuMemUnmap");
    mapped.erase(m);
    /* queued work is not run first: as on a GPU, what still reads or writes it faults */
    madvise((void *)ptr, size, MADV_DONTNEED);
    mprotect((void *)ptr, size, PROT_NONE);
    return CUDA_SUCCESS;
}

extern "C" cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                                        unsigned long long flags,
                                                        enum cudaDriverEntryPointQueryResult *status) {
    static const struct { const char *name; void *f; } calls[] = {
        {"cuMemGetAllocationGranularity", (void *)emu_cuMemGetAllocationGranularity},
        {"cuMemAddressReserve", (void *)emu_cuMemAddressReserve},
        {"cuMemAddressFree", (void *)emu_cuMemAddressFree},
        {"cuMemCreate", (void *)emu_cuMemCreate},
        {"cuMemRelease", (void *)emu_cuMemRelease},
        {"cuMemMap", (void *)emu_cuMemMap},
        {"cuMemSetAccess", (void *)emu_cuMemSetAccess},
        {"cuMemUnmap", (void *)emu_cuMemUnmap},
    };
    (void)version;
    (void)flags;
    if (!symbol || !fn) return cudaErrorInvalidValue;
    *fn = NULL;
    for (const auto &c : calls)
        if (!strcmp(symbol, c.name)) *fn = c.f;
    if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}

extern "C" cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_err;
    last_err = sticky;   /* a sticky error stays */
    return e;
}
extern "C" cudaError_t cudaPeekAtLastError(void) { return last_err; }

extern "C" cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) {
    LOCK;
    *tot = (size_t)16 << 30;
    *fr = *tot > device_bytes ? *tot - device_bytes : 0;
    return cudaSuccess;
}

extern "C" const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess:                     return "cudaSuccess";
    case cudaErrorInvalidValue:           return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:       return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:   return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:   return "cudaErrorInvalidDevicePointer";
    case cudaErrorInsufficientDriver:     return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice:               return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice:          return "cudaErrorInvalidDevice";
    case cudaErrorNoKernelImageForDevice: return "cudaErrorNoKernelImageForDevice";
    case cudaErrorInvalidResourceHandle:  return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:               return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:         return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources:   return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure:          return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

extern "C" const char *cudaGetErrorString(cudaError_t e) {
    LOCK;
    auto it = detail.find(e);
    if (it != detail.end()) return it->second.c_str();
    return e == cudaSuccess ? "no error" : cudaGetErrorName(e);
}

/* ---- launches ---- */

static std::map<std::string, unsigned> &bounds(void) {
    static std::map<std::string, unsigned> m;   /* built before any static registration uses it */
    return m;
}

void emu_register_bounds(const char *k, unsigned threads) { bounds()[k] = threads; }

/* DT_GPU_EMU_RESOURCES=FILE: what nvcc says each kernel uses (tests/gpu_emu/resources.sh
 * writes it from `nvcc --resource-usage`), a line per kernel: its name as launched
 * ("k_ln_forward", "k_attn_forward<64, 32>"), its registers a thread and its bytes of
 * static shared memory, the most over the architectures built. With it every launch is
 * held to what a GPU grants a block: 65536 registers, allocated 256 to a warp (a thread's
 * count rounded up to 8), and 48 KiB of shared memory, static and dynamic together,
 * without an opt-in; a kernel the table lacks stops the program (the table would
 * otherwise check nothing). A line that does not read so stops it too. */
struct emu_res {
    unsigned regs;
    size_t smem;
};
static std::map<std::string, emu_res> *resources(void) {
    static std::map<std::string, emu_res> m;
    static int loaded = 0;
    if (!loaded) {
        loaded = 1;
        const char *path = getenv("DT_GPU_EMU_RESOURCES");
        if (!path || !*path) return NULL;
        FILE *f = fopen(path, "r");
        if (!f) {
            fprintf(stderr, "gpu_emu: DT_GPU_EMU_RESOURCES=%s: cannot open it\n", path);
            exit(2);
        }
        char line[512];
        for (int no = 1; fgets(line, sizeof line, f); no++) {
            char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL, *end;
            unsigned long r = tab2 ? strtoul(tab1 + 1, &end, 10) : 0;
            int good = tab2 && end == tab2 && r > 0 && r <= 255;
            unsigned long long sm = good ? strtoull(tab2 + 1, &end, 10) : 0;
            if (!good || (*end != '\n' && *end != '\0') || sm > (228u << 10)) {
                fprintf(stderr, "gpu_emu: DT_GPU_EMU_RESOURCES=%s line %d: expected NAME<tab>REGISTERS<tab>SMEM\n", path,
                        no);
                exit(2);
            }
            m[std::string(line, (size_t)(tab1 - line))] = emu_res{(unsigned)r, (size_t)sm};
        }
        fclose(f);
        if (m.empty()) {
            fprintf(stderr, "gpu_emu: DT_GPU_EMU_RESOURCES=%s: no kernel in it\n", path);
            exit(2);
        }
    }
    return m.empty() ? NULL : &m;
}

/* The launch against nvcc's resource usage: 0 (the last error set) when a GPU would refuse it. */
static int resources_ok(const char *k, unsigned long long threads, size_t shmem) {
    std::map<std::string, emu_res> *m = resources();
    if (!m) return 1;
    auto it = m->find(k);
    if (it == m->end()) {
        fprintf(stderr, "gpu_emu: kernel %s is not in DT_GPU_EMU_RESOURCES=%s (its resource usage cannot be checked)\n", k,
                getenv("DT_GPU_EMU_RESOURCES"));
        abort();
    }
    const emu_res &u = it->second;
    unsigned long long warps = (threads + 31) / 32, need = warps * 32 * ((u.regs + 7) / 8 * 8);
    if (need > 65536) {
        fail(cudaErrorLaunchOutOfResources, "too many resources requested for launch: kernel %s uses %u registers a "
             "thread (nvcc), so %llu threads a block need %llu of the 65536 registers a block may have", k, u.regs,
             threads, need);
        return 0;
    }
    if (u.smem + shmem > (48u << 10)) {
        fail(cudaErrorInvalidConfiguration, "invalid configuration argument: kernel %s: %zu bytes of static shared "
             "memory (nvcc) and %zu dynamic, %zu in all (at most 49152 without an opt-in)", k, u.smem, shmem,
             u.smem + shmem);
        return 0;
    }
    return 1;
}

int emu_launch_ok(const char *k, dim3 g, dim3 b, size_t shmem) {
    LOCK;
    if (sticky) { last_err = sticky; return 0; }
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    auto lb = bounds().find(k);
    if (lb != bounds().end() && threads > lb->second) {
        fail(cudaErrorLaunchOutOfResources, "too many resources requested for launch: kernel %s has "
             "__launch_bounds__(%u) and was launched with %llu threads a block", k, lb->second, threads);
        return 0;
    }
    if (b.x < 1 || b.y < 1 || b.z < 1 || b.x > 1024 || b.y > 1024 || b.z > 64 || threads > 1024) {
        fail(cudaErrorInvalidConfiguration, "invalid configuration argument: kernel %s: block (%u, %u, %u) "
             "(at most 1024 threads, 1024 x 1024 x 64)", k, b.x, b.y, b.z);
        return 0;
    }
    if (g.x < 1 || g.y < 1 || g.z < 1 || g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
        fail(cudaErrorInvalidConfiguration, "invalid configuration argument: kernel %s: grid (%u, %u, %u)", k, g.x,
             g.y, g.z);
        return 0;
    }
    if (shmem > (48u << 10)) {
        fail(cudaErrorInvalidConfiguration, "invalid configuration argument: kernel %s: %zu bytes of dynamic "
             "shared memory (at most 49152 without an opt-in)", k, shmem);
        return 0;
    }
    return resources_ok(k, threads, shmem);
}

int emu_kernel_ptr_ok(const char *k, int index, const void *p) {
    LOCK;
    if (!p) return 1;
    char what[300], call[160];
    if (!describe(p, 0, 1, what, sizeof what)) return 1;
    snprintf(call, sizeof call, "kernel %s", k);
    char arg[360];
    snprintf(arg, sizeof arg, "argument %d: %s", index, what);
    emu_fault(call, arg);
    return 0;
}

/* ---- cuBLAS ---- */

struct emu_blas {
    cudaStream_t s;
    cublasMath_t math;   /* CUBLAS_TF32_TENSOR_OP_MATH: single-precision products on TF32 */
};

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *h) {
    openblas_set_num_threads(1);   /* one "GPU" thread: OpenBLAS's spinning helpers only slow a loaded machine */
    *h = new emu_blas{};
    return CUBLAS_STATUS_SUCCESS;
}
extern "C" cublasStatus_t cublasDestroy(cublasHandle_t h) { delete h; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasGetVersion(cublasHandle_t, int *v) { *v = CUBLAS_VERSION; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) { h->s = s; return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasSetPointerMode(cublasHandle_t, cublasPointerMode_t) { return CUBLAS_STATUS_SUCCESS; }
extern "C" cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m) { h->math = m; return CUBLAS_STATUS_SUCCESS; }

/* x as a tensor core reads it in TF32 mode: 10 mantissa bits, rounded to nearest with
 * ties away from zero (cvt.rna.tf32.f32); infinities and NaNs pass */
static float emu_tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    memcpy(&x, &u, 4);
    return x;
}

/* Bytes spanned by a column-major rows x cols matrix with leading dimension ld. */
static size_t extent(int rows, int cols, int ld) {
    if (rows <= 0 || cols <= 0) return 0;
    return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * sizeof(float);
}

static int blas_ptrs_ok(const char *call, const float *A, size_t ea, const float *B, size_t eb, const float *C,
                        size_t ec) {
    const char *names[3] = {"A", "B", "C"};
    const float *p[3] = {A, B, C};
    size_t e[3] = {ea, eb, ec};
    for (int i = 0; i < 3; i++) {
        char what[300], arg[360];
        if (!e[i] || !describe(p[i], e[i], 1, what, sizeof what)) continue;
        snprintf(arg, sizeof arg, "matrix %s: %s", names[i], what);
        emu_fault(call, arg);
        return 0;
    }
    return 1;
}

extern "C" cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                    int m, int n, int k, const float *alpha, const float *A, int lda,
                                                    long long sa, const float *B, int ldb, long long sb,
                                                    const float *beta, float *C, int ldc, long long sc, int batch) {
    LOCK;
    if (sticky) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    size_t ea = ta == CUBLAS_OP_N ? extent(m, k, lda) : extent(k, m, lda);
    size_t eb = tb == CUBLAS_OP_N ? extent(k, n, ldb) : extent(n, k, ldb);
    size_t ec = extent(m, n, ldc);
    size_t more = (size_t)(batch - 1) * sizeof(float);
    const char *call = batch > 1 || sa || sb || sc ? "cublasSgemmStridedBatched" : "cublasSgemm";
    if (!blas_ptrs_ok(call, A, ea ? ea + more * (size_t)sa : 0, B, eb ? eb + more * (size_t)sb : 0, C,
                      ec + more * (size_t)sc))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    float al = *alpha, be = *beta;
    const bool tf32 = h->math == CUBLAS_TF32_TENSOR_OP_MATH;
    emu_enqueue(h->s, call, NULL, [=] {
        std::vector<float> a, b;   /* TF32: the operands as the tensor cores read them */
        for (int i = 0; i < batch; i++) {
            const float *x = A + i * sa, *y = B + i * sb;
            if (tf32) {
                a.assign(x, x + ea / sizeof(float));
                b.assign(y, y + eb / sizeof(float));
                for (float &v : a) v = emu_tf32(v);
                for (float &v : b) v = emu_tf32(v);
                x = a.data();
                y = b.data();
            }
            cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                        tb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, al, x, lda, y, ldb, be, C + i * sc, ldc);
        }
        return true;
    });
    return CUBLAS_STATUS_SUCCESS;
}

static float emu_widen(uint16_t h, bool bf16) {   /* bf16/f16 -> f32, exact */
    uint32_t u;
    if (bf16) {
        u = (uint32_t)h << 16;
    } else {
        uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
        if (e == 0) return (sign ? -1.0f : 1.0f) * (float)m * (1.0f / 16777216.0f);
        u = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* x rounded to bf16 or f16 (to nearest, ties to even) and back: what a FAST_16BF or
 * FAST_16F product multiplies (dtype.h's conversions, as the CPU backend's) */
static float emu_narrow(float x, bool bf16) {
    return bf16 ? dt_bf16_to_f32(dt_f32_to_bf16(x)) : dt_f16_to_f32(dt_f32_to_f16(x));
}

/* cublasGemmEx and its strided batched form (strides in elements of each operand) */
static cublasStatus_t gemm_ex(const char *call, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                              int n, int k, const void *alpha, const void *A, cudaDataType_t at, int lda, long long sa,
                              const void *B, cudaDataType_t bt, int ldb, long long sb, const void *beta, void *C,
                              cudaDataType_t ct, int ldc, long long sc, int batch, cublasComputeType_t comp) {
    LOCK;
    if (sticky) return CUBLAS_STATUS_EXECUTION_FAILED;
    /* 16-bit operands with f32 compute, or f32 operands that the compute type narrows
     * to 16 bits (FAST_16BF, FAST_16F: tensor cores on values the kernel rounds) */
    bool wide = at == CUDA_R_32F, bf16 = at == CUDA_R_16BF || comp == CUBLAS_COMPUTE_32F_FAST_16BF;
    if (at != bt || ct != CUDA_R_32F ||
        !(wide ? comp == CUBLAS_COMPUTE_32F_FAST_16BF || comp == CUBLAS_COMPUTE_32F_FAST_16F
               : (at == CUDA_R_16BF || at == CUDA_R_16F) && comp == CUBLAS_COMPUTE_32F))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    /* spans in elements; 16-bit operands take half the bytes of extent()'s floats */
    const size_t es = wide ? 4 : 2, more = (size_t)(batch - 1);
    size_t na = (ta == CUBLAS_OP_N ? extent(m, k, lda) : extent(k, m, lda)) / sizeof(float);
    size_t nb = (tb == CUBLAS_OP_N ? extent(k, n, ldb) : extent(n, k, ldb)) / sizeof(float);
    size_t ec = extent(m, n, ldc);
    if (!blas_ptrs_ok(call, (const float *)A, na ? (na + more * (size_t)sa) * es : 0, (const float *)B,
                      nb ? (nb + more * (size_t)sb) * es : 0, (const float *)C, ec + more * (size_t)sc * sizeof(float)))
        return CUBLAS_STATUS_EXECUTION_FAILED;
    float al = *(const float *)alpha, be = *(const float *)beta;
    const uint16_t *ha = (const uint16_t *)A, *hb = (const uint16_t *)B;
    const float *fa = (const float *)A, *fb = (const float *)B;
    float *hc = (float *)C;
    emu_enqueue(h->s, call, NULL, [=] {
        std::vector<float> a(na), b(nb);
        for (int j = 0; j < batch; j++) {
            const size_t oa = (size_t)j * (size_t)sa, ob = (size_t)j * (size_t)sb;
            for (size_t i = 0; i < na; i++) a[i] = wide ? emu_narrow(fa[oa + i], bf16) : emu_widen(ha[oa + i], bf16);
            for (size_t i = 0; i < nb; i++) b[i] = wide ? emu_narrow(fb[ob + i], bf16) : emu_widen(hb[ob + i], bf16);
            cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_T ? CblasTrans : CblasNoTrans,
                        tb == CUBLAS_OP_T ? CblasTrans : CblasNoTrans, m, n, k, al, a.data(), lda, b.data(), ldb, be,
                        hc + (size_t)j * (size_t)sc, ldc);
        }
        return true;
    });
    return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                       int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                       const void *B, cudaDataType_t bt, int ldb, const void *beta, void *C,
                                       cudaDataType_t ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t) {
    return gemm_ex("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                   comp);
}

extern "C" cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                     int m, int n, int k, const void *alpha, const void *A,
                                                     cudaDataType_t at, int lda, long long sa, const void *B,
                                                     cudaDataType_t bt, int ldb, long long sb, const void *beta,
                                                     void *C, cudaDataType_t ct, int ldc, long long sc, int batch,
                                                     cublasComputeType_t comp, cublasGemmAlgo_t) {
    return gemm_ex("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct,
                   ldc, sc, batch, comp);
}

extern "C" cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                      int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                                      const float *beta, float *C, int ldc) {
    return cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

extern "C" const char *cublasGetStatusString(cublasStatus_t s) {
    if (s == CUBLAS_STATUS_EXECUTION_FAILED && sticky) return cudaGetErrorString(sticky);
    return "emulated cuBLAS error";
}
