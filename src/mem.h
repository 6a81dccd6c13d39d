/*
 * mem.h: memory accounting — how many bytes this process holds for training, by
 * category, now and at most so far (as torch.cuda.memory_allocated and
 * max_memory_allocated, split the way the memory wall is argued about).
 *
 * The model, the optimizer, DDP and the trainer take their buffers through
 * dt_mem_alloc (device memory from the ops table) or dt_mem_host_alloc (the
 * ops table's pinned host memory, used for communication staging), naming a
 * category; dt_mem_free finds the size and category again. Code that holds
 * memory some other way can say so with dt_mem_add / dt_mem_sub. The counts are
 * per process (one rank), kept under a mutex, so the communicator's worker
 * thread may allocate too. Peaks are kept for the total and for each category
 * (the total's peak is the most held at one moment, not the sum of the
 * categories' peaks).
 *
 * The tcp backend's shared-memory rings (comm/shm.c) count as comm while mapped:
 * every page is resident, the rings a rank creates and those of its partners alike.
 * What is not counted: the loader's batches in pinned host memory, host copies
 * made for checks and checkpoints, and the buffers of the MPI and NCCL libraries.
 */
#ifndef DT_MEM_H
#define DT_MEM_H

#include <stddef.h>

#include "ops.h"
#include "status.h"

/* The categories, one row each: X(ENUM_SUFFIX, name, what it holds). */
#define DT_MEM_CATEGORIES(X)                                                                          \
    X(PARAMS, "params", "parameters and buffers (batchnorm running statistics)")                     \
    X(GRADS,  "grads",  "gradients, and the tree that sums micro-batch gradients (k > 1 per rank)")  \
    X(OPTIM,  "optim",  "optimizer state (momentum, AdamW's moments)")                               \
    X(ACTS,   "acts",   "activations, saved state and layer scratch, activation gradients")          \
    X(COMM,   "comm",   "communication buffers (staging, gathers, tcp shared-memory rings)")         \
    X(OTHER,  "other",  "the step's input batch and labels, batchnorm records, small scalars")

typedef enum {
#define DT_MEM_ENUM_(K, name, what) DT_MEM_##K,
    DT_MEM_CATEGORIES(DT_MEM_ENUM_)
#undef DT_MEM_ENUM_
    DT_MEM_NCAT,
    DT_MEM_TOTAL = DT_MEM_NCAT      /* the index of the total in dt_mem_stats */
} dt_mem_cat;

/* A snapshot: bytes per category, then the total at index DT_MEM_TOTAL. */
typedef struct {
    size_t cur[DT_MEM_NCAT + 1];
    size_t peak[DT_MEM_NCAT + 1];
} dt_mem_stats;

/* The category's name ("params", ...; "total" for DT_MEM_TOTAL), and what it holds. */
DT_API const char *dt_mem_cat_name(int cat);
DT_API const char *dt_mem_cat_help(int cat);

/* Device memory from ops->alloc, counted under cat (bytes 0 gives NULL, counted as 0). */
DT_API dt_status dt_mem_alloc(const dt_ops *ops, dt_mem_cat cat, void **p, size_t bytes);
/* An allocation of which only `counted` bytes are resident and counted (a sharded
 * array: the rest is never touched, or given back with ops discard); what is brought in
 * later is counted with dt_mem_add / dt_mem_sub. With counted < bytes it comes from
 * ops->alloc_sparse: the caller populates (ops populate) what it uses. */
DT_API dt_status dt_mem_alloc_part(const dt_ops *ops, dt_mem_cat cat, void **p, size_t bytes, size_t counted);
/* The ops table's host memory (host_alloc: pinned on a GPU), counted under cat. */
DT_API dt_status dt_mem_host_alloc(const dt_ops *ops, dt_mem_cat cat, void **p, size_t bytes);
/* Free memory from either of the two and stop counting it (NULL is fine; memory this
 * registry never handed out is freed with ops->free, uncounted). */
DT_API void      dt_mem_free(const dt_ops *ops, void *p);

/* Count bytes held some other way under cat, and stop counting them. */
DT_API void      dt_mem_add(dt_mem_cat cat, size_t bytes);
DT_API void      dt_mem_sub(dt_mem_cat cat, size_t bytes);

/* The counts now and the peaks so far. */
DT_API void      dt_mem_get(dt_mem_stats *out);
/* Start the peaks again from the current counts (a run's peak, not the process's). */
DT_API void      dt_mem_reset_peak(void);

/* A cap on the total counted, in bytes (0: none, the default), as a device of that size
 * would impose. An allocation through dt_mem_alloc, dt_mem_alloc_part or
 * dt_mem_host_alloc that would take the total over it fails with DT_ERR_NOMEM, saying
 * how much of which category it asked for and what the process holds; nothing is kept.
 * Bytes counted with dt_mem_add are held already and cannot be refused: a caller that
 * counts such bytes asks dt_mem_check_limit at a point where it can stop. */
DT_API void      dt_mem_set_limit(size_t bytes);
DT_API size_t    dt_mem_limit(void);
/* DT_ERR_NOMEM when the total has been over the cap since the peaks were last reset,
 * naming the peak, the cap and what was held at that peak by category; DT_OK otherwise. */
DT_API dt_status dt_mem_check_limit(void);

#endif /* DT_MEM_H */
