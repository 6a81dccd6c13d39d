/*
 * rng.c: host helpers over Philox4x32-10 (rng.h): the exact mapping from
 * (seed, stream, position) to uniforms and dropout decisions that the kernels
 * use, so tests and the CPU backend share one definition.
 */
#include "rng.h"

void dt_philox_block(uint64_t seed, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t out[4]) {
    dt_philox_ctr c = {{c0, c1, c2, c3}};
    dt_philox_ctr r = dt_philox4x32_10(c, dt_philox_seed(seed));
    for (int i = 0; i < 4; i++) out[i] = r.v[i];
}

/* Element `index` of a fill owns the block at counter (index, stream): word 0 gives
 * a uniform. One block per element wastes bits but makes every element independent
 * of how the fill is cut into pieces. */
static dt_philox_ctr fill_block(uint64_t seed, uint64_t stream, uint64_t index) {
    dt_philox_ctr c = {{(uint32_t)index, (uint32_t)(index >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)}};
    return dt_philox4x32_10(c, dt_philox_seed(seed));
}

float dt_rng_unit(uint64_t seed, uint64_t stream, uint64_t index) {
    return dt_u32_to_unit(fill_block(seed, stream, index).v[0]);
}

/* Elements come in fours: element e of a sample uses word e % 4 of the block at
 * counter (e / 4, sample, epoch, stream). Samples are told apart by their low 32 bits
 * (an epoch has fewer than 2^32 samples). */
int dt_rng_dropout_keep(uint64_t seed, uint32_t stream, uint32_t epoch, uint64_t sample,
                        uint64_t element, float p) {
    dt_philox_ctr c = {{(uint32_t)(element >> 2), (uint32_t)sample, epoch, stream}};
    dt_philox_ctr r = dt_philox4x32_10(c, dt_philox_seed(seed));
    return dt_u32_to_unit(r.v[element & 3]) >= p;
}
