/*
 * shard.h: sharded data parallelism (ZeRO), the optimizer's side of a step.
 *
 * The flat parameter array of n floats is cut into W contiguous shards of `per`
 * floats each (per = ceil(n / W) rounded up to DT_SUM_CHUNK, the chunk of the
 * deterministic sums), rank r owning [r*per, (r+1)*per) clipped to n; the model's
 * parameter and gradient arrays are padded to W*per floats (zeros) so the shards are
 * equal and the collectives need no special case.
 *
 *   none    every rank keeps the whole optimizer state and updates every parameter
 *           (plain DDP: gradients all-reduced in buckets during backward);
 *   optim   ZeRO-1: gradients all-reduced as with none (on the CPU at a power-of-two
 *           world size reduce-scattered as with grads: dt_shard_scatter_sums); each
 *           rank keeps the optimizer state of its shard only, updates its shard, and
 *           the updated parameters are all-gathered;
 *   grads   ZeRO-2: after backward the local gradient sum is reduce-scattered, so a
 *           rank receives (and clips and applies) its shard's global gradient only;
 *           the optimizer as with optim. Half the gradient bytes of an all-reduce
 *           reach each rank, but the exchange waits for the end of backward.
 *   params  ZeRO-3 / FSDP: a rank keeps the parameters and gradients of its shard
 *           only. Just before a unit (consecutive layers of at least a given size)
 *           runs, forward or backward, the parameters it reads are gathered (broadcast
 *           from the ranks whose shards hold them; the next unit while this one runs),
 *           and dropped after it; a finished gradient slice is reduced to the ranks
 *           that own it, then dropped (the device takes its pages back: ops discard;
 *           a GPU's arrays are sparse, mapped granule by granule: cuda_ops.cu).
 *           Unless gradients are staged through host memory (a host backend on a
 *           GPU), a unit is gathered into a slot of a pool of reused buffers and
 *           its layers read it there (dt_model_set_param_view); their backward writes
 *           its gradient into another slot of the pool (dt_model_set_grad_view; two at
 *           most), whose sum leaves this rank's part in the flat array's shard. So no
 *           page goes back and comes again at every gather: on a virtual machine each
 *           such 4 KiB page costs microseconds at its first touch. Each slot is the
 *           largest unit's size; with --backward-prefetch post the pool holds two in
 *           all (what the gathers in place hold beyond the shard), with pre as many as
 *           are in use at once, until the end of training. A gradient two units share (the tied
 *           embedding's) and a unit wholly in this rank's shard stay in the flat array
 *           (in mixed precision such a unit takes a slot too: the pool's copy of a
 *           unit has its GEMM weights rounded in place as it arrives, so no rank holds
 *           a rounded copy of the whole model and the master weights stay f32).
 *           DT_SHARD_POOL=0 gathers in place instead: into the flat arrays, whose pages
 *           outside the shard go back after each use (the least memory).
 *           Between steps a rank holds 1/W of parameters, gradients and optimizer
 *           state; evaluation gathers unit by unit as training does, checkpoints write
 *           each rank's shard, and at the end rank 0 alone receives the whole model
 *           (dt_shard_gather_root). Several local micro-batches (S/W > 1) still
 *           accumulate in full-size arrays.
 *
 * Bits (docs/DESIGN.md rule 2): every mode gives the weights of none. The reduce-scatter
 * sums each element over the all-reduce's tree of ranks (comm.h), the update is
 * element-wise, and the global gradient norm is the pairwise sum of fixed 4096-float
 * chunk sums (ops.h, sumsq_chunks): a shard boundary is a chunk boundary, so the
 * chunk sums, gathered from the shards, are those of the whole array. (Over a world
 * size that is not a power of two, grads uses a ring reduce-scatter whose order differs
 * from the bucketed all-reduce's: results agree to rounding.)
 *
 * Checkpoints: a sharded run writes a sharded checkpoint, every rank its own range
 * (ckpt.h), which loads on any world size and in any mode.
 */
#ifndef DT_SHARD_H
#define DT_SHARD_H

#include <stddef.h>
#include "comm.h"
#include "ddp.h"
#include "model.h"
#include "optim.h"
#include "status.h"

typedef enum { DT_SHARD_NONE, DT_SHARD_OPTIM, DT_SHARD_GRADS, DT_SHARD_PARAMS, DT_SHARD_COUNT } dt_shard_mode;

DT_API const char *dt_shard_name (dt_shard_mode m);         /* "none", "optim", "grads", "params"; "?" */
/* DT_ERR_INVALID "shard: expected none, optim, grads or params, got 'X'" (the names
 * from the modes' rows, shard.c). */
DT_API dt_status   dt_shard_parse(const char *s, dt_shard_mode *out);
/* Whether a mode reduce-scatters the gradients (grads, params) instead of DDP's sum. */
DT_API int         dt_shard_mode_grads(dt_shard_mode m);

/* params: when backward gathers the unit before the one it runs (FSDP's backward_prefetch).
 *   pre   with the current unit, before its backward: the gather overlaps that backward;
 *         at most three units beyond the shard (two of parameters, one of gradient);
 *   post  after the current unit's backward, its parameters dropped: two units at most,
 *         the gather overlapping only the gradient's sum. With recomputation a block's
 *         units are also dropped after their forward runs again (the block's last
 *         kept), and gathered once more for their backward. Same bits either way. */
typedef enum { DT_PREFETCH_PRE, DT_PREFETCH_POST } dt_shard_prefetch;
/* DT_ERR_INVALID "backward_prefetch: expected pre or post, got 'X'". */
DT_API dt_status   dt_shard_prefetch_parse(const char *s, dt_shard_prefetch *out);

typedef struct dt_shard dt_shard;

/* How to build the model for sharding its nparams parameters over comm in mode: the
 * padded capacity and, with params, the range this rank keeps (model.h). */
DT_API dt_status dt_shard_layout(size_t nparams, dt_comm *comm, dt_shard_mode mode, dt_model_layout *out);
/* Sharding of m's parameters over comm (NULL or size 1: one shard) in mode; pads the
 * model's arrays (dt_model_reserve). Call before any hook or pointer into them is kept. */
DT_API dt_status dt_shard_init(dt_model *m, dt_comm *comm, dt_shard_mode mode, dt_shard **out);
/* The same over the parameters [lo, hi) only (a pipeline stage's, pipeline.h: every rank
 * of comm the same range), as if they were the whole array: none updates the range,
 * optim and grads cut it into comm's shards (the last one padded into what follows, so
 * the arrays are reserved to lo + the padded length). params: DT_ERR_UNSUPPORTED. The
 * norm (dt_shard_clip) is then the caller's: the range's chunks are not the array's. */
DT_API dt_status dt_shard_init_range(dt_model *m, dt_comm *comm, dt_shard_mode mode, size_t lo, size_t hi,
                                     dt_shard **out);
DT_API void      dt_shard_free(dt_shard *s);

DT_API dt_shard_mode dt_shard_mode_of(const dt_shard *s);
/* Floats per shard of n parameters over world ranks: whole DT_SUM_CHUNK chunks,
 * ceil(chunks / world) of them (the last rank's shard padded). dtrain plan reads it. */
DT_API size_t    dt_shard_floats(size_t n, int world);
/* 1 when the optimizer state is split over several ranks (a checkpoint is then written
 * by every rank, its shard); 0 with none or one rank. */
DT_API int       dt_shard_state_sharded(const dt_shard *s);
/* 1 when each rank keeps its shard of the parameters only (params on several ranks):
 * no rank holds the whole model until dt_shard_gather_root. */
DT_API int       dt_shard_params_sharded(const dt_shard *s);
/* What this rank keeps, for the log ("shard optim: rank 1 of 2 keeps the optimizer state
 * of ..."); "" with none. */
DT_API void      dt_shard_note(const dt_shard *s, char *buf, size_t n);
/* params, the pool: the slots a rank takes at most at once when its longest run of
 * consecutive units not wholly its own is `run` units long, and how many of them hold
 * gradients (*grad_slots); post: backward's prefetch after the unit (DT_PREFETCH_POST).
 * shard_params.c explains the count; dtrain plan reads it. */
DT_API void      dt_shard_pool_in_use(int run, int post, int *slots, int *grad_slots);
/* This rank's part of the parameters the optimizer updates: [*lo, *lo + *len) of the
 * n parameters (the whole array, or init_range's range, with none). */
DT_API void      dt_shard_range(const dt_shard *s, size_t *lo, size_t *len);
/* 1 when DDP must all-reduce the gradient (none, optim); 0 when it only sums the
 * local micro-batches and sharding does the rest (grads, params, and optim where
 * dt_shard_scatter_sums chose the reduce-scatter). */
DT_API int       dt_shard_ddp_reduces(const dt_shard *s);
/* optim: sum the gradients as grads does, one reduce-scatter after backward, instead of
 * DDP's all-reduce during it, where that moves fewer bytes through the same cores and
 * changes no bit: the device computes in host memory (a CPU, whose threads fill its
 * cores, so an all-reduce overlapped with backward takes its time from backward), the
 * world size is a power of two (the reduce-scatter then sums each element over the
 * all-reduce's tree), the shard spans the whole model (not a pipeline stage's range) and
 * `may` (the caller's gradients are f32: bf16 gradient sums are DDP's). Call it before
 * dt_shard_ddp_reduces and DDP's set-up; a rank's memory stays optim's (whole gradients). */
DT_API void      dt_shard_scatter_sums(dt_shard *s, int may);
/* params: install the model's layer hook and DDP's final-slice hook, with units of at
 * least unit_bytes of parameters (consecutive layers gathered as one) and backward's
 * prefetch as given. After the start-of-run broadcast (dt_ddp_sync_start) call
 * dt_shard_drop_params. */
DT_API dt_status dt_shard_attach(dt_shard *s, dt_ddp *ddp, size_t unit_bytes, dt_shard_prefetch prefetch);
/* DT_SHARD_POOL: 1 (or unset) gathers --shard params' units into the pool (unless
 * staging through host memory), 0 in place (above); anything else is an error. */
DT_API dt_status dt_shard_pool_env(int *on);
/* params, training over: rank 0 receives every other rank's shard and holds the whole
 * parameter array (layer gathers pause there), the others keep their shard only and
 * drop any unit still gathered (FSDP's rank0_only full state dict: no rank holds
 * more at the end than during the steps, rank 0 aside). Nothing to do in the other
 * modes. Every rank calls it. */
DT_API dt_status dt_shard_gather_root(dt_shard *s);
/* params: drop every unit still gathered, as after an evaluation (forward only, which
 * keeps the last unit as a training forward does for its backward). No communication;
 * nothing to do in the other modes or while the whole array is held. */
DT_API dt_status dt_shard_drop_units(dt_shard *s);
/* params: after the start-of-run broadcast, keep this rank's shard only. */
DT_API dt_status dt_shard_drop_params(dt_shard *s);
/* params, training over: this rank's gradient shard is given back (its pages discarded,
 * no longer counted), before the end-of-run gather_root. Where the device takes
 * discarded memory back (host memory, a GPU's sparse arrays; elsewhere the pages stay,
 * and so does their count); nothing to do in the other modes. */
DT_API dt_status dt_shard_release_grads(dt_shard *s);

/* After DDP's local sum (grads mode): reduce-scatter, so this rank's shard of the
 * gradient holds the global sum. Nothing to do in the other modes. */
DT_API dt_status dt_shard_reduce(dt_shard *s);
/* The global gradient norm (*norm; the bits of dt_clip_grad_norm_scaled over the whole
 * summed gradient: the gradient's norm times unscale, 1 without loss scaling), and with
 * max_norm > 0 the clipping of the part this rank applies. */
DT_API dt_status dt_shard_clip(dt_shard *s, float max_norm, float unscale, float *norm);
/* The same for one rank's whole array decided on the device, read nothing back: checks
 * (3 device floats, ops.h step_checks) = the norm (when `norm` or max_norm > 0, else 0),
 * the clipping coefficient, and the gate (0 when the norm or one of the k losses, device,
 * is not finite), and with max_norm > 0 the gradient clipped by the coefficient. A
 * sharded state (several ranks), or a range: DT_ERR_INTERNAL. */
DT_API dt_status dt_shard_clip_device(dt_shard *s, float max_norm, float unscale, int norm, const float *losses,
                                      size_t k, float *checks);
/* The optimizer step over this rank's range (o was made for dt_shard_range's len),
 * then the all-gather that gives every rank the updated parameters. */
DT_API dt_status dt_shard_step(dt_shard *s, dt_optim *o, float lr, float grad_scale);

#endif /* DT_SHARD_H */
