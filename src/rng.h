/*
 * rng.h: Philox4x32-10, the counter-based random generator behind every random
 * number in dtrain (initialisation, dropout, augmentation).
 *
 * A counter-based generator is a pure function (key, counter) -> 128 random bits,
 * so the value used for "sample 1234 of epoch 3, element 17" is the same whichever
 * rank, micro-batch or thread computes it (docs/DESIGN.md rule 2). There is no state to
 * advance, seed per thread or save in a checkpoint.
 *
 * The algorithm is the one of Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3" (SC'11), and matches the Random123 reference bit for bit
 * (counter {0,0,0,0}, key {0,0} -> {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}).
 * The header is plain C with static inline functions so the CUDA backend can
 * compile the same code for the device.
 */
#ifndef DT_RNG_H
#define DT_RNG_H

#include <stdint.h>

#include "dt_api.h"

#ifdef __CUDACC__
#define DT_RNG_FN static inline __host__ __device__
#else
#define DT_RNG_FN static inline
#endif

typedef struct { uint32_t v[4]; } dt_philox_ctr;   /* 128-bit counter, also the output */
typedef struct { uint32_t v[2]; } dt_philox_key;   /* 64-bit key */

#define DT_PHILOX_M0 0xD2511F53u
#define DT_PHILOX_M1 0xCD9E8D57u
#define DT_PHILOX_W0 0x9E3779B9u
#define DT_PHILOX_W1 0xBB67AE85u

/* One Philox4x32 round: two 32x32->64 multiplies, xors with the key. */
DT_RNG_FN dt_philox_ctr dt_philox_round_(dt_philox_ctr c, dt_philox_key k) {
    uint64_t p0 = (uint64_t)DT_PHILOX_M0 * c.v[0];
    uint64_t p1 = (uint64_t)DT_PHILOX_M1 * c.v[2];
    dt_philox_ctr r;
    r.v[0] = (uint32_t)(p1 >> 32) ^ c.v[1] ^ k.v[0];
    r.v[1] = (uint32_t)p1;
    r.v[2] = (uint32_t)(p0 >> 32) ^ c.v[3] ^ k.v[1];
    r.v[3] = (uint32_t)p0;
    return r;
}

/* Philox4x32-10: ten rounds with the key bumped by the Weyl constants between them. */
DT_RNG_FN dt_philox_ctr dt_philox4x32_10(dt_philox_ctr c, dt_philox_key k) {
    for (int i = 0; i < 10; i++) {
        if (i > 0) { k.v[0] += DT_PHILOX_W0; k.v[1] += DT_PHILOX_W1; }
        c = dt_philox_round_(c, k);
    }
    return c;
}

/* A key from a 64-bit seed. */
DT_RNG_FN dt_philox_key dt_philox_seed(uint64_t seed) {
    dt_philox_key k;
    k.v[0] = (uint32_t)seed;
    k.v[1] = (uint32_t)(seed >> 32);
    return k;
}

/* 32 random bits -> float in [0, 1) with 24 bits of precision (exact, no rounding up to 1). */
DT_RNG_FN float dt_u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* Host helpers (rng.c). */

/* The four 32-bit words of Philox4x32-10 at (seed, counter c0..c3); out has 4 words. */
DT_API void dt_philox_block(uint64_t seed, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t out[4]);

/* A uniform float in [0, 1) for element `index` of stream `stream` under `seed`: the
 * same value dt_ops.rng_uniform(lo=0, hi=1) writes at that position. */
DT_API float dt_rng_unit(uint64_t seed, uint64_t stream, uint64_t index);

/* The dropout keep decision for (seed, stream, epoch, sample, element) at drop
 * probability p: 1 keep, 0 drop. The kernels compute the same decisions four
 * elements per Philox block; this is the definition they are tested against. */
DT_API int dt_rng_dropout_keep(uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample,
                               uint64_t element, float p);

#endif /* DT_RNG_H */
