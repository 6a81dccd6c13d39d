/*
 * sampler.h: the world-size-invariant sampler (docs/DESIGN.md rule 2).
 *
 * The order of an epoch is a permutation of [0, N) computed from (seed, epoch)
 * alone: Fisher-Yates driven by a counter-based hash keyed by (seed, epoch, i).
 * Step t of the epoch takes the global batch of B consecutive positions
 * [t*B, (t+1)*B) of that permutation. The global batch is split into S
 * micro-batches of B/S samples each (micro-batch m holds positions
 * [t*B + m*B/S, t*B + (m+1)*B/S)), and with W ranks, rank r owns the contiguous
 * block of micro-batches [r*S/W, (r+1)*S/W). Because nothing here depends on W,
 * the union over ranks of a step is the same global batch for every world size
 * that divides S; PyTorch's DistributedSampler instead interleaves samples by
 * rank, so its global batch changes with W.
 *
 * Last batch: with drop_last (the default) an epoch has floor(N/B) steps and the
 * N mod B samples at the end of the permutation are skipped this epoch (a
 * different set every epoch). Without it an epoch has ceil(N/B) steps and the
 * last batch is padded by wrapping around to the start of the same permutation
 * (position p reads perm[p mod N]), so a few samples are seen twice in that
 * epoch, exactly as with torch's DistributedSampler(drop_last=False).
 *
 * Random mode (dt_sampler_init_random), for token windows, where an epoch of
 * every window start would be T times the corpus: position p of global step
 * g = epoch * steps_per_epoch + step holds an index drawn with replacement,
 * uniformly from [0, N), as a pure function of (seed, g, p). Micro-batches and
 * rank blocks cut the global batch exactly as above, so the union over ranks is
 * again the same for every world size. An "epoch" has max(1, N/B) steps there
 * (it only numbers the steps), B may exceed N, and there is no permutation.
 *
 * The epoch is an argument of every call, so it cannot be forgotten (the
 * classic DistributedSampler.set_epoch bug). A sampler caches the permutation
 * of the last epoch asked for; it is not thread-safe.
 */
#ifndef DT_SAMPLER_H
#define DT_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "hash.h"     /* dt_hash_u64 / dt_hash_below, which the orders are drawn from */
#include "status.h"

typedef struct dt_sampler dt_sampler;

/* ---- sampler ------------------------------------------------------------- */
/* n samples, global batch B, S micro-batches per global batch (S divides B),
 * seed, drop_last (1: floor(n/B) steps; 0: ceil with wrap-around padding). */
DT_API dt_status dt_sampler_init(int64_t n, int64_t global_batch, int64_t micro_batches,
                                 uint64_t seed, int drop_last, dt_sampler **out);
/* Random mode: indices drawn with replacement from (seed, global step, position). */
DT_API dt_status dt_sampler_init_random(int64_t n, int64_t global_batch, int64_t micro_batches,
                                        uint64_t seed, dt_sampler **out);
DT_API void      dt_sampler_free(dt_sampler *s);
/* Steps (global batches) per epoch. */
DT_API int64_t   dt_sampler_steps_per_epoch(const dt_sampler *s);
/* Samples per micro-batch, B/S. */
DT_API int64_t   dt_sampler_micro_size(const dt_sampler *s);
/* Dataset size, global batch and micro-batch count as given to init. */
DT_API int64_t   dt_sampler_len(const dt_sampler *s);
DT_API int64_t   dt_sampler_global_batch(const dt_sampler *s);
DT_API int64_t   dt_sampler_micro_batches(const dt_sampler *s);
/* The B/S global sample indices of micro-batch `micro` of `step` of `epoch`
 * into idx_out (room for dt_sampler_micro_size() values). */
DT_API dt_status dt_sampler_micro(dt_sampler *s, int64_t epoch, int64_t step, int64_t micro,
                                  int64_t *idx_out);
/* The B global sample indices of a step, micro-batch after micro-batch. */
DT_API dt_status dt_sampler_global(dt_sampler *s, int64_t epoch, int64_t step, int64_t *idx_out);
/* Rank `rank` of `world` owns micro-batches [*first_micro, *first_micro + *n_micro).
 * S must be a multiple of world. */
DT_API dt_status dt_sampler_rank_block(const dt_sampler *s, int world, int rank,
                                       int64_t *first_micro, int64_t *n_micro);
/* The indices of the whole block of `rank` for a step (n_micro * B/S values),
 * in micro-batch order: the rank-local batch to hand to the loader. */
DT_API dt_status dt_sampler_rank_indices(dt_sampler *s, int64_t epoch, int64_t step, int world,
                                         int rank, int64_t *idx_out, size_t *n_out);
/* The permutation of an epoch (n values), for tests and tools; DT_ERR_INVALID in random mode. */
DT_API dt_status dt_sampler_permutation(dt_sampler *s, int64_t epoch, const int64_t **perm);

#endif /* DT_SAMPLER_H */
