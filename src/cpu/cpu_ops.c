/*
 * cpu_ops.c: the CPU backend's table (generated from the op list of ops.h), its
 * memory and threads, and the per-thread scratch of the kernels.
 *
 * Device memory is host memory here: 64-byte aligned (one cache line, one AVX-512
 * vector) so kernels vectorise without peeling. "Pinned" host memory is the same
 * aligned allocation. Work runs synchronously, so synchronize() has nothing to wait for.
 *
 * Threads: every parallel region uses dt_cpu_threads() threads (set_threads), and
 * OpenBLAS is pinned to one thread: its own threading changes the bits of sgemm
 * with the thread count (docs/DESIGN.md rule 2), so cpu_gemm.c parallelises over fixed
 * output blocks instead.
 */
#include "cpu.h"

#include <cblas.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int cpu_nthreads = 0;   /* 0 until set: then omp_get_max_threads() at first use */

static void cpu_blas_one_thread(void) { openblas_set_num_threads(1); }

static void cpu_blas_single(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, cpu_blas_one_thread);
}

/* Read by the kernels on any thread, set between steps by the trainer's tuner (tuner.h). */
int dt_cpu_threads(void) {
    int n = __atomic_load_n(&cpu_nthreads, __ATOMIC_RELAXED);
    if (n > 0) return n;
#ifdef _OPENMP
    n = omp_get_max_threads();
#endif
    if (n < 1) n = 1;
    __atomic_store_n(&cpu_nthreads, n, __ATOMIC_RELAXED);
    return n;
}

static dt_status cpu_set_threads(int n) {
    if (n < 1) return dt_error(DT_ERR_INVALID, "cpu set_threads: thread count must be >= 1, got %d", n);
#ifndef _OPENMP
    if (n > 1) return dt_error(DT_ERR_UNSUPPORTED, "cpu set_threads: built without OpenMP, cannot use %d threads", n);
#endif
    cpu_blas_single();
    __atomic_store_n(&cpu_nthreads, n, __ATOMIC_RELAXED);
    return DT_OK;
}

static int cpu_threads(void) { return dt_cpu_threads(); }

/* Arrays of CPU_HUGE bytes or more (parameters, gradients, optimizer state, the
 * activation arena of any real model) start on a 2 MiB boundary, and their whole
 * 2 MiB blocks ask for transparent huge pages (the last, partial block stays in 4 KiB
 * pages, so that touching its start does not make 2 MiB resident). Sharding gives
 * back the pages of the ranges a rank does not own after each use (cpu_discard) and
 * touches them again at the next gather. With 4 KiB pages that is a page fault per
 * 4 KiB: writing 8 MiB and giving it back took 24 ms on a virtual machine here, 1 ms
 * in 2 MiB pages. A discarded range gives back its whole 2 MiB pages and splits the
 * ones at its ends, so what stays resident is what it would be with 4 KiB pages. */
#define CPU_HUGE ((size_t)2 << 20)

static dt_status cpu_alloc(void **p, size_t bytes) {
    if (!p) return dt_error(DT_ERR_INVALID, "cpu alloc: NULL result pointer");
    *p = NULL;
    if (bytes == 0) return DT_OK;
    void *q = NULL;
    if (posix_memalign(&q, bytes >= CPU_HUGE ? CPU_HUGE : 64, bytes) != 0 || !q)
        return dt_error(DT_ERR_NOMEM, "cpu alloc: out of memory allocating %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
    /* advice only: without transparent huge pages it fails, and the pages stay 4 KiB */
    if (bytes >= CPU_HUGE) (void)madvise(q, bytes & ~(CPU_HUGE - 1), MADV_HUGEPAGE);
#endif
    *p = q;
    return DT_OK;
}

/* The advice goes with the array: memory the allocator hands out again for something
 * small must not fault in 2 MiB at a time. */
static void cpu_free(void *p) {
#ifdef MADV_NOHUGEPAGE
    size_t n = p && ((uintptr_t)p & (CPU_HUGE - 1)) == 0 ? malloc_usable_size(p) : 0;
    if (n >= CPU_HUGE) (void)madvise(p, n & ~(CPU_HUGE - 1), MADV_NOHUGEPAGE);
#endif
    free(p);
}

static dt_status cpu_zero(void *p, size_t bytes) {
    if (bytes == 0) return DT_OK;
    if (!p) return dt_error(DT_ERR_INVALID, "cpu zero: NULL pointer for %zu bytes", bytes);
    memset(p, 0, bytes);
    return DT_OK;
}

static dt_status cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes == 0) return DT_OK;
    if (!dst || !src) return dt_error(DT_ERR_INVALID, "cpu copy: NULL pointer for %zu bytes", bytes);
    if (dst != src) memmove(dst, src, bytes);
    return DT_OK;
}

/* Device memory is host memory: one copy for every direction, one allocator for both. */
static dt_status cpu_copy_h2d(void *dst, const void *src, size_t bytes) { return cpu_copy(dst, src, bytes); }
static dt_status cpu_copy_h2d_async(void *dst, const void *src, size_t bytes) { return cpu_copy(dst, src, bytes); }
static dt_status cpu_copy_d2h(void *dst, const void *src, size_t bytes) { return cpu_copy(dst, src, bytes); }
static dt_status cpu_copy_d2d(void *dst, const void *src, size_t bytes) { return cpu_copy(dst, src, bytes); }
static dt_status cpu_host_alloc(void **p, size_t bytes) { return cpu_alloc(p, bytes); }
static dt_status cpu_alloc_sparse(void **p, size_t bytes) { return cpu_alloc(p, bytes); }   /* lazy pages */
static void cpu_host_free(void *p) { cpu_free(p); }

/* The whole pages inside [p, p + bytes): [*a, *b), empty when there are none. */
static void whole_pages(const void *p, size_t bytes, uintptr_t *a, uintptr_t *b) {
    long pg = sysconf(_SC_PAGESIZE);
    *a = *b = 0;
    if (pg <= 0 || bytes == 0 || !p) return;
    *a = ((uintptr_t)p + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
    *b = ((uintptr_t)p + bytes) & ~((uintptr_t)pg - 1);
}

/* The whole pages inside [p, p + bytes) go back to the kernel (MADV_DONTNEED: private
 * anonymous memory reads as zeros afterwards); the pages at either end, which may hold
 * other data, stay. */
static dt_status cpu_discard(void *p, size_t bytes) {
    uintptr_t a, b;
    whole_pages(p, bytes, &a, &b);
    if (b > a && madvise((void *)a, b - a, MADV_DONTNEED) != 0)
        return dt_error(DT_ERR_IO, "cpu discard: madvise of %zu bytes failed", (size_t)(b - a));
    return DT_OK;
}

/* Khugepaged would fill a partly resident block to a whole huge page (up to 511 of
 * its 512 pages may be absent), making 2 MiB resident where the owner keeps a part. */
static dt_status cpu_small_pages(void *p, size_t bytes) {
#ifdef MADV_NOHUGEPAGE
    uintptr_t a, b;
    whole_pages(p, bytes, &a, &b);
    if (b > a && madvise((void *)a, b - a, MADV_NOHUGEPAGE) != 0)
        return dt_error(DT_ERR_IO, "cpu small_pages: madvise of %zu bytes failed", (size_t)(b - a));
#else
    (void)p;
    (void)bytes;
#endif
    return DT_OK;
}

/* A 4 KiB page fault costs 12 us in some virtual machines; MADV_POPULATE_WRITE (Linux
 * 5.14) brings a range's pages back in one call at about half that. Older kernels
 * (EINVAL) and other systems fault them in as they are written. */
#if defined(__linux__) && !defined(MADV_POPULATE_WRITE)
#define MADV_POPULATE_WRITE 23   /* glibc's headers before 2.35 lack it */
#endif
static dt_status cpu_populate(void *p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    uintptr_t a, b;
    whole_pages(p, bytes, &a, &b);
    if (b > a && madvise((void *)a, b - a, MADV_POPULATE_WRITE) != 0 && errno != EINVAL)
        return dt_error(DT_ERR_NOMEM, "cpu populate: %zu bytes: %s", (size_t)(b - a), strerror(errno));
#else
    (void)p;
    (void)bytes;
#endif
    return DT_OK;
}

static dt_status cpu_synchronize(void) { return DT_OK; }

/* Generated from ops.h's lists: the functions above are cpu_<name>, the kernels
 * dt_cpu_<op> (cpu.h); one missing is a compile error here. No memory statistics:
 * the process's resident memory tells instead. */
#define DT_OPS_DEVFN(name) cpu_##name
#define DT_OPS_KERNEL(name) dt_cpu_##name
static const dt_ops cpu_table = {
    .name        = "cpu",
    .host_memory = 1,
    .page_block  = CPU_HUGE,
    DT_OPS_TABLE_INIT(NULL, NULL, NULL)
};

const dt_ops *dt_ops_cpu(void) {
    cpu_blas_single();
    return &cpu_table;
}

/* ---- per-thread scratch ------------------------------------------------------------ */

#define DT_CPU_SCRATCH_SLOTS 4
typedef struct { float *p; size_t cap; } scratch_slot;
static _Thread_local scratch_slot scratch_tl[DT_CPU_SCRATCH_SLOTS];

/* A thread's scratch goes with the thread: OpenMP ends worker threads when a region asks
 * for fewer than the last (the thread tuner changes the count as it runs), and each
 * would otherwise leave its buffers behind. The key's value is the thread's own array. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_release(void *v) {
    scratch_slot *s = v;
    for (int i = 0; i < DT_CPU_SCRATCH_SLOTS; i++) {
        free(s[i].p);
        s[i].p = NULL;
        s[i].cap = 0;
    }
}

static void scratch_key_make(void) { scratch_key_ok = pthread_key_create(&scratch_key, scratch_release) == 0; }

float *dt_cpu_scratch(int slot, size_t floats) {
    if (slot < 0 || slot >= DT_CPU_SCRATCH_SLOTS) return NULL;
    if (scratch_tl[slot].cap < floats) {
        pthread_once(&scratch_once, scratch_key_make);
        if (scratch_key_ok && !pthread_getspecific(scratch_key)) pthread_setspecific(scratch_key, scratch_tl);
        free(scratch_tl[slot].p);
        size_t bytes = (floats * sizeof(float) + 63) & ~(size_t)63;
        scratch_tl[slot].p = aligned_alloc(64, bytes ? bytes : 64);
        scratch_tl[slot].cap = scratch_tl[slot].p ? floats : 0;
    }
    return scratch_tl[slot].p;
}
