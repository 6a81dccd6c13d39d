/*
 * ddp.h: distributed data parallelism for one model — the start-of-run
 * broadcast and check, the fixed-tree accumulation of micro-batch gradients,
 * and bucketed gradient all-reduces that overlap backward.
 *
 * Per optimizer step a rank runs k local micro-batches. Around each backward
 * the trainer calls dt_ddp_begin_micro(i); the model's grad_ready hook then
 * hands every finished layer's gradient slice to DDP, which adds it into a
 * binary-counter tree (left + right, the same tree for any split). During the
 * last micro-batch each slice is final as soon as its layer is done; once a
 * bucket (default 25 MiB, the first one 1 MiB, filled from the last parameter
 * backwards as PyTorch's DDP does) is complete it is all-reduced on the
 * communicator's worker thread while backward goes on. dt_ddp_finish waits for
 * the buckets; the model's gradient array then holds the SUM over the global
 * batch's micro-batches (each micro-batch gradient is already divided by B).
 *
 * For power-of-two world sizes the all-reduce continues the same binary tree
 * across ranks (comm.h), so the result is bitwise independent of the world size
 * and of the bucket sizes (docs/DESIGN.md rule 2).
 */
#ifndef DT_DDP_H
#define DT_DDP_H

#include <stddef.h>
#include <stdint.h>
#include "comm.h"
#include "model.h"
#include "status.h"

typedef struct dt_ddp dt_ddp;

typedef struct {
    size_t bucket_bytes;        /* bucket capacity; default 25 MiB */
    size_t first_bucket_bytes;  /* the first (last-layer) bucket; default 1 MiB */
    int    overlap;             /* 1: launch buckets during backward (default); 0: after it */
    int    sync_bn;             /* 1: batchnorm statistics over all ranks (synchronised BN) */
    int    local_only;          /* 1: sum the local micro-batches only, the caller reduces
                                 * across ranks (sharded gradients, shard.h) */
    int    sharded_params;      /* 1: each rank holds its shard of the parameters only (shard.h):
                                 * the start broadcasts the buffers, not the parameters, whose
                                 * shards come from the same seed, file or checkpoint */
    dt_dtype grad_dtype;        /* DT_F32 (default) or DT_BF16: gradients summed and sent in bf16, every
                                 * node of the tree rounded (half the bytes; still world-size invariant) */
    size_t   range_lo, range_hi; /* the gradients this rank's backward makes: the parameter tensors
                                 * lying in [range_lo, range_hi) of the flat array (a pipeline
                                 * stage's, pipeline.h), the only ones the start broadcasts and
                                 * the checks compare; 0, 0: all of them */
    int      in_place;          /* 1 (default): the accumulation tree's level 0 is the gradient
                                 * array (an odd micro-batch's backward writes into a scratch of
                                 * the largest layer): one gradient-sized array less, the same
                                 * bits; 0: copied, as with sharded parameters always */
} dt_ddp_opts;

DT_API void      dt_ddp_opts_default(dt_ddp_opts *o);
/* Gradient-sized arrays of the accumulation tree for k local micro-batches (0 for
 * k = 1; the bits of k, less one when k is a power of two, whose last leaf closes the tree
 * in the gradient itself): what DDP allocates beside the model's gradient (counted as
 * gradients) without in_place. */
DT_API int       dt_ddp_tree_arrays(int64_t k);
/* The floats DDP keeps beside the gradient for k local micro-batches over the parameters in
 * [lo, hi) of a model of these layers: dt_ddp_tree_arrays(k) arrays of the range, or in
 * place one less, plus level 0 of the layers that share a tied weight and the scratch of
 * the largest other layer. */
DT_API size_t    dt_ddp_tree_floats(const dt_layer *layers, int n, int64_t k, size_t lo, size_t hi, int in_place);
/* DDP for model m over comm (NULL or size 1: only the local accumulation) with
 * k local micro-batches per step. Installs the model's grad_ready (and, with
 * sync_bn, bn_sync) hooks. */
DT_API dt_status dt_ddp_init(dt_model *m, dt_comm *comm, int64_t k, const dt_ddp_opts *o, dt_ddp **out);
DT_API void      dt_ddp_free(dt_ddp *d);

/* Start of the run: every rank must hold the same architecture (the parameter
 * names and shapes are compared across ranks: the error names the first
 * parameter that differs and the ranks), then rank 0's parameters and buffers
 * are broadcast and their checksums verified equal on all ranks. */
DT_API dt_status dt_ddp_sync_start(dt_ddp *d);

/* Per step: call begin_micro(i) before the backward of local micro-batch i
 * (0 .. k-1), then finish() after the last one; the gradient array then holds
 * the global sum. *wait_s (optional) receives the seconds finish() waited for
 * communication (the part backward did not hide). */
DT_API dt_status dt_ddp_begin_micro(dt_ddp *d, int64_t i);
DT_API dt_status dt_ddp_finish(dt_ddp *d, double *wait_s);

/* Called once per step for each slice [lo, hi) of the flat gradient as soon as it is
 * final on this rank (the last micro-batch's backward has produced it and the local
 * micro-batches are summed), before any all-reduce of it; sharded parameters reduce
 * and drop it there (shard.h). NULL: none. */
typedef dt_status (*dt_ddp_final_fn)(void *ctx, size_t lo, size_t hi);
DT_API void      dt_ddp_set_final_hook(dt_ddp *d, dt_ddp_final_fn fn, void *ctx);

/* Compare every parameter across ranks (norm and 64-bit hash): DT_ERR_MISMATCH
 * naming the first parameter and the ranks that differ. */
DT_API dt_status dt_ddp_check_equal(dt_ddp *d);

/* All-gather over device memory (bytes per rank; send may lie in recv at this
 * rank's place): direct when the backend takes device pointers or the device's
 * memory is host memory, else through a host copy. */
DT_API dt_status dt_ddp_allgather_dev(dt_ddp *d, const void *send, void *recv, size_t bytes);

#endif /* DT_DDP_H */
