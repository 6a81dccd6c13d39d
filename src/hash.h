/*
 * hash.h: the two non-cryptographic hashes of dtrain.
 *
 *   dt_xxh64     XXH64 of a byte string: checkpoint checksums, parameter
 *                fingerprints of DDP's rank checks. The reference algorithm
 *                (portable, little-endian loads, no tables), so a value can be
 *                checked with the xxhsum tool.
 *   dt_hash_u64  a counter-based hash of three 64-bit words: the sampler's
 *                permutations, synthetic data, batch fingerprints; wherever a
 *                random value must depend on its coordinates only (docs/DESIGN.md
 *                rule 2), and Philox (rng.h) would be more than is needed;
 *                dt_hash_below draws a bounded integer from it without bias.
 */
#ifndef DT_HASH_H
#define DT_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "dt_api.h"

/* XXH64 of n bytes with a seed. */
DT_API uint64_t dt_xxh64  (const void *p, size_t n, uint64_t seed);
/* The same over bytes that come in pieces: init, update with each piece in order, digest
 * (the state stays usable: digest does not change it). The value is dt_xxh64's of the
 * pieces put end to end, however they are cut. */
typedef struct {
    uint64_t      v[4], seed, total;
    unsigned char buf[32];   /* the bytes of a stripe not yet complete */
    size_t        nbuf;
} dt_xxh64_state;
DT_API void     dt_xxh64_init  (dt_xxh64_state *s, uint64_t seed);
DT_API void     dt_xxh64_update(dt_xxh64_state *s, const void *p, size_t n);
DT_API uint64_t dt_xxh64_digest(const dt_xxh64_state *s);
/* A 64-bit hash of (key, a, b): three chained SplitMix64 finaliser rounds. */
DT_API uint64_t dt_hash_u64(uint64_t key, uint64_t a, uint64_t b);
/* An unbiased integer in [0, bound) (bound > 0) from the stream keyed by (key, i):
 * Lemire's multiply-shift over dt_hash_u64(key, i, attempt), redrawing on rejection. */
DT_API uint64_t dt_hash_below(uint64_t key, uint64_t i, uint64_t bound);

#endif /* DT_HASH_H */
