/*
 * shm.h: single-producer single-consumer byte rings in POSIX shared memory.
 *
 * Same-host peers exchange messages through one ring per direction instead of loopback
 * TCP: a message costs one copy in (sender) and one pass out (receiver, which reduces
 * straight from the ring), with no system call on the fast path. The ring is a byte
 * stream like a socket; the tcp backend frames messages on it the same way.
 *
 * Positions are free-running 64-bit byte counters: head (written by the producer only)
 * and tail (consumer only) sit on separate cache lines and are published with
 * release/acquire ordering; a side with nothing to do sleeps on a futex in the segment
 * and is woken by the other. One side creates a ring under a name that says who made it
 * (shm_name.h), the other opens it by name, says so in the ring (dt_shm_accept) and
 * unlinks the name at once; the creator unlinks it again when it closes the ring, in case
 * the other side never came. So a name lives in /dev/shm only between creation and the
 * peer's first look, and what a killed creator leaves there is swept (shm_name.h).
 */
#ifndef DT_SHM_H
#define DT_SHM_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

typedef struct dt_shm_ring dt_shm_ring;

#define DT_SHM_CTRL_BYTES 4096   /* a segment is this control page + the data area */
#define DT_SHM_MAPPED 1u         /* dt_shm_accept flags: the consumer has mapped the ring */
#define DT_SHM_CMA    2u         /* ... and can read the producer's memory (process_vm_readv) */

/* Create a ring of `bytes` (a power of two) under a fresh name (written to name, at most
 * DT_SHM_NAME_MAX bytes); closing it unlinks that name (if the peer has not). */
dt_status dt_shm_create(size_t bytes, char *name, size_t name_len, dt_shm_ring **out);
/* Map a ring another process created. */
dt_status dt_shm_open  (const char *name, dt_shm_ring **out);
void      dt_shm_unlink(const char *name);
void      dt_shm_close (dt_shm_ring *r);
/* Consumer: it has mapped the ring (DT_SHM_MAPPED is always set) and what else it can do;
 * producer: those flags, 0 until then. */
void      dt_shm_accept  (dt_shm_ring *r, unsigned flags);
unsigned  dt_shm_accepted(dt_shm_ring *r);

/* Producer: a contiguous writable span (0 bytes when full), then publish n of it. */
size_t    dt_shm_write_span  (dt_shm_ring *r, void **p);
void      dt_shm_write_commit(dt_shm_ring *r, size_t n);
size_t    dt_shm_size        (const dt_shm_ring *r);   /* bytes of the data area */
/* Consumer: a contiguous readable span (0 when empty), then release n of it. */
size_t    dt_shm_read_span   (dt_shm_ring *r, const void **p);
void      dt_shm_read_commit (dt_shm_ring *r, size_t n);
/* Sleep (at most timeout_s) until the other side moves past what the last span call
 * saw: new data for the consumer, free space for the producer. Callers re-check. */
void      dt_shm_wait_data   (dt_shm_ring *r, double timeout_s);
void      dt_shm_wait_space  (dt_shm_ring *r, double timeout_s);
/* Acknowledgements, for messages whose payload the consumer fetches out of band (tcp_xfer.c:
 * cross-memory reads): the consumer counts one up when it is done with the sender's buffer;
 * the producer reads the count, or sleeps (at most timeout_s) until it differs from seen. */
void      dt_shm_ack         (dt_shm_ring *r);
uint64_t  dt_shm_acks        (dt_shm_ring *r);
void      dt_shm_wait_ack    (dt_shm_ring *r, uint64_t seen, double timeout_s);

/* Where each side runs: a side publishes the CPU it is on (cheap when unchanged), the
 * other reads it, so a waiting side can tell that its peer shares its CPU and cannot run
 * until it yields (tcp_xfer.c). -1: not published yet. */
void      dt_shm_set_cpu     (dt_shm_ring *r, int cpu);
int       dt_shm_peer_cpu    (dt_shm_ring *r);

#endif /* DT_SHM_H */
