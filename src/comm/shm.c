/*
 * shm.c: shared-memory byte rings (see shm.h).
 *
 * Layout of a segment: a control page (magic, size, head on its own cache line, tail on
 * its own cache line, each beside the CPU its side last ran on, the futex bells, the ack
 * count, the consumer's accept flags) followed by the data area of `size` bytes. Space is reserved with posix_fallocate so a
 * full /dev/shm is an error when the ring is made (the caller then keeps the pair on TCP),
 * not a SIGBUS mid-training.
 */
#include "config.h"
#include "shm.h"
#include "mem.h"
#include "shm_name.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x44545348524e4731ull   /* "DTSHRNG1" */

/* A side that has nothing to do sleeps on a futex "bell" in the segment after raising
 * its waiters flag; the other side rings the bell (a syscall) only when the flag is up,
 * so the streaming fast path makes no system call. Lost wake-ups are excluded by the
 * order: the sleeper reads the bell, raises the flag, re-checks the counter, then sleeps
 * only if the bell is unchanged; the other side publishes the counter, then reads the
 * flag (all sequentially consistent). */
typedef struct {
    uint64_t magic, size;
    _Alignas(64) _Atomic uint64_t head;   /* bytes ever written (producer) */
    _Atomic int32_t prod_cpu;             /* the CPU the producer last ran on (-1: unknown) */
    _Alignas(64) _Atomic uint64_t tail;   /* bytes ever consumed (consumer) */
    _Atomic int32_t cons_cpu;             /* the CPU the consumer last ran on */
    _Alignas(64) _Atomic uint32_t data_bell, data_waiters;    /* consumer sleeps for data */
    _Alignas(64) _Atomic uint32_t space_bell, space_waiters;  /* producer sleeps for space
                                                                 or for an acknowledgement */
    _Alignas(64) _Atomic uint64_t acks;   /* messages the consumer has acknowledged */
    _Atomic uint32_t accepted;            /* DT_SHM_MAPPED | DT_SHM_CMA, set by the consumer */
} ring_ctrl;

struct dt_shm_ring {
    ring_ctrl *ctrl;
    char *data;
    size_t size, map_bytes;
    uint64_t pos;           /* local copy of our own counter (head or tail) */
    uint64_t seen;          /* the other side's counter when we last looked */
    int producer;           /* 1: this process writes the ring (it created it) */
    int cpu;                /* the CPU this side last published */
    char name[DT_SHM_NAME_MAX]; /* the creator's name for it, unlinked again on close */
};

static void bell_wait(_Atomic uint32_t *bell, uint32_t old, double timeout_s) {
    struct timespec ts = { (time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9) };
    /* EAGAIN (the bell rang already), EINTR and ETIMEDOUT all mean "look again" */
    syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAIT, old, &ts, NULL, 0);
}

/* Sleep on bell unless counter has moved past seen (the sleeper's half of the protocol). */
static void sleep_until_moved(_Atomic uint32_t *bell, _Atomic uint32_t *waiters, _Atomic uint64_t *counter,
                              uint64_t seen, double timeout_s) {
    uint32_t b = atomic_load(bell);
    atomic_store(waiters, 1);
    if (atomic_load(counter) == seen) bell_wait(bell, b, timeout_s);
    atomic_store(waiters, 0);
}

static void bell_ring(_Atomic uint32_t *bell, _Atomic uint32_t *waiters) {
    if (!atomic_load(waiters)) return;
    atomic_fetch_add(bell, 1);
    syscall(SYS_futex, (uint32_t *)bell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* MAP_POPULATE: both sides map every page of the ring up front. Mapped lazily, each side
 * took a page fault on its first touch of every 4 KiB of the ring (about 2,000 faults per
 * 4 MiB ring, both processes together), all of them in the first few MiB that went through
 * it: they made a job's first mid-sized collectives several times slower than later ones
 * (dtbench from 32 KiB up: 64-256 KiB at a tenth of their speed). */
static dt_status map_ring(int fd, size_t total, dt_shm_ring **out) {
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) return dt_error(DT_ERR_IO, "shared memory: mmap of %zu bytes: %s", total, strerror(errno));
    dt_shm_ring *r = calloc(1, sizeof *r);
    if (!r) { munmap(m, total); return dt_error(DT_ERR_NOMEM, "out of memory"); }
    r->ctrl = m;
    r->data = (char *)m + DT_SHM_CTRL_BYTES;
    r->map_bytes = total;
    dt_mem_add(DT_MEM_COMM, total);   /* resident in this process: every page is mapped */
    *out = r;
    return DT_OK;
}

dt_status dt_shm_create(size_t bytes, char *name, size_t name_len, dt_shm_ring **out) {
    *out = NULL;
    if (bytes == 0 || (bytes & (bytes - 1)) != 0)
        return dt_error(DT_ERR_INTERNAL, "shared memory ring size %zu is not a power of two", bytes);
    static _Atomic unsigned counter;
    char tag[32];
    snprintf(tag, sizeof tag, "r%u", atomic_fetch_add(&counter, 1));
    if (name_len > DT_SHM_NAME_MAX) name_len = DT_SHM_NAME_MAX;
    if (dt_shm_name_make(name, name_len, tag) != 0)
        return dt_error(DT_ERR_INTERNAL, "shared memory segment name does not fit in %zu bytes", name_len);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return dt_error(DT_ERR_IO, "shm_open(%s): %s", name, strerror(errno));
    size_t total = DT_SHM_CTRL_BYTES + bytes;
    int rc = posix_fallocate(fd, 0, (off_t)total);
    if (rc != 0) {
        close(fd);
        shm_unlink(name);
        return dt_error(DT_ERR_IO, "cannot reserve %zu bytes of shared memory (%s): %s", total, name, strerror(rc));
    }
    dt_status s = map_ring(fd, total, out);
    close(fd);
    if (s != DT_OK) { shm_unlink(name); return s; }
    dt_shm_ring *r = *out;
    r->ctrl->magic = SHM_MAGIC;
    r->ctrl->size = bytes;
    atomic_store(&r->ctrl->head, 0);
    atomic_store(&r->ctrl->tail, 0);
    atomic_store(&r->ctrl->data_waiters, 0);
    atomic_store(&r->ctrl->space_waiters, 0);
    atomic_store(&r->ctrl->acks, 0);
    atomic_store(&r->ctrl->accepted, 0);
    atomic_store(&r->ctrl->prod_cpu, -1);
    atomic_store(&r->ctrl->cons_cpu, -1);
    r->size = bytes;
    r->producer = 1;
    r->cpu = -1;
    snprintf(r->name, sizeof r->name, "%s", name);
    return DT_OK;
}

dt_status dt_shm_open(const char *name, dt_shm_ring **out) {
    *out = NULL;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return dt_error(DT_ERR_IO, "shm_open(%s): %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size <= DT_SHM_CTRL_BYTES) {
        close(fd);
        return dt_error(DT_ERR_FORMAT, "shared memory segment %s is too small", name);
    }
    dt_status s = map_ring(fd, (size_t)st.st_size, out);
    close(fd);
    if (s != DT_OK) return s;
    dt_shm_ring *r = *out;
    if (r->ctrl->magic != SHM_MAGIC || r->ctrl->size + DT_SHM_CTRL_BYTES != (size_t)st.st_size) {
        dt_shm_close(r);
        *out = NULL;
        return dt_error(DT_ERR_FORMAT, "shared memory segment %s is not a dtrain ring", name);
    }
    r->size = r->ctrl->size;
    r->cpu = -1;
    return DT_OK;
}

void dt_shm_unlink(const char *name) { if (name && *name) shm_unlink(name); }

void dt_shm_close(dt_shm_ring *r) {
    if (!r) return;
    /* names are never reused, so this only removes our own segment if nobody else did */
    dt_shm_unlink(r->name);
    munmap(r->ctrl, r->map_bytes);
    dt_mem_sub(DT_MEM_COMM, r->map_bytes);
    free(r);
}

size_t dt_shm_write_span(dt_shm_ring *r, void **p) {
    uint64_t tail = atomic_load_explicit(&r->ctrl->tail, memory_order_acquire);
    r->seen = tail;
    size_t used = (size_t)(r->pos - tail), off = (size_t)(r->pos & (r->size - 1));
    size_t n = r->size - used, cont = r->size - off;
    *p = r->data + off;
    return n < cont ? n : cont;
}

void dt_shm_write_commit(dt_shm_ring *r, size_t n) {
    r->pos += n;
    atomic_store(&r->ctrl->head, r->pos);
    bell_ring(&r->ctrl->data_bell, &r->ctrl->data_waiters);
}

void dt_shm_wait_space(dt_shm_ring *r, double timeout_s) {
    ring_ctrl *c = r->ctrl;
    sleep_until_moved(&c->space_bell, &c->space_waiters, &c->tail, r->seen, timeout_s);
}

size_t dt_shm_size(const dt_shm_ring *r) { return r->size; }

size_t dt_shm_read_span(dt_shm_ring *r, const void **p) {
    uint64_t head = atomic_load_explicit(&r->ctrl->head, memory_order_acquire);
    r->seen = head;
    size_t n = (size_t)(head - r->pos), off = (size_t)(r->pos & (r->size - 1)), cont = r->size - off;
    *p = r->data + off;
    return n < cont ? n : cont;
}

void dt_shm_read_commit(dt_shm_ring *r, size_t n) {
    r->pos += n;
    atomic_store(&r->ctrl->tail, r->pos);
    bell_ring(&r->ctrl->space_bell, &r->ctrl->space_waiters);
}

void dt_shm_wait_data(dt_shm_ring *r, double timeout_s) {
    ring_ctrl *c = r->ctrl;
    sleep_until_moved(&c->data_bell, &c->data_waiters, &c->head, r->seen, timeout_s);
}

void dt_shm_accept(dt_shm_ring *r, unsigned flags) {
    atomic_store(&r->ctrl->accepted, (uint32_t)flags | DT_SHM_MAPPED);
}

unsigned dt_shm_accepted(dt_shm_ring *r) {
    return atomic_load_explicit(&r->ctrl->accepted, memory_order_acquire);
}

void dt_shm_ack(dt_shm_ring *r) {
    atomic_fetch_add(&r->ctrl->acks, 1);
    bell_ring(&r->ctrl->space_bell, &r->ctrl->space_waiters);
}

uint64_t dt_shm_acks(dt_shm_ring *r) {
    return atomic_load_explicit(&r->ctrl->acks, memory_order_acquire);
}

void dt_shm_wait_ack(dt_shm_ring *r, uint64_t seen, double timeout_s) {
    ring_ctrl *c = r->ctrl;
    sleep_until_moved(&c->space_bell, &c->space_waiters, &c->acks, seen, timeout_s);
}

void dt_shm_set_cpu(dt_shm_ring *r, int cpu) {
    if (cpu == r->cpu) return;          /* written only when it changes: the line stays quiet */
    r->cpu = cpu;
    atomic_store_explicit(r->producer ? &r->ctrl->prod_cpu : &r->ctrl->cons_cpu, cpu, memory_order_relaxed);
}

int dt_shm_peer_cpu(dt_shm_ring *r) {
    return atomic_load_explicit(r->producer ? &r->ctrl->cons_cpu : &r->ctrl->prod_cpu, memory_order_relaxed);
}
