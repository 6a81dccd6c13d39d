/*
 * sampler.c: epoch permutations from (seed, epoch), or random draws from (seed,
 * global step, position), and their split into global batches, micro-batches
 * and rank blocks (see sampler.h for the layout and why).
 *
 * The permutation is a Fisher-Yates shuffle whose i-th draw is a pure function
 * of (seed, epoch, i), so any process computes the same order without
 * communicating, and a resumed run recomputes the order of its epoch exactly.
 */
#include "config.h"

#include "sampler.h"

#include <stdlib.h>

struct dt_sampler {
    int64_t  n, batch, micro, micro_size, steps;
    uint64_t seed;
    int      drop_last;
    int      random;     /* windows drawn with replacement, no permutation */
    int64_t  perm_epoch; /* epoch whose permutation is in perm; -1: none yet */
    int64_t *perm;       /* (n) */
};

/* The checks and fields both modes share; random mode allows B > n (draws repeat anyway). */
static dt_status sampler_new(int64_t n, int64_t global_batch, int64_t micro_batches, uint64_t seed, int random,
                             dt_sampler **out) {
    *out = NULL;
    if (n <= 0) return dt_error(DT_ERR_INVALID, "sampler: dataset size must be positive, got %lld", (long long)n);
    if (global_batch <= 0)
        return dt_error(DT_ERR_INVALID, "sampler: global batch must be positive, got %lld", (long long)global_batch);
    if (micro_batches <= 0)
        return dt_error(DT_ERR_INVALID, "sampler: micro-batch count must be positive, got %lld", (long long)micro_batches);
    if (global_batch % micro_batches != 0)
        return dt_error(DT_ERR_INVALID, "sampler: micro-batch count %lld does not divide the global batch %lld",
                        (long long)micro_batches, (long long)global_batch);
    if (!random && global_batch > n)
        return dt_error(DT_ERR_INVALID, "sampler: global batch %lld is larger than the dataset (%lld samples)",
                        (long long)global_batch, (long long)n);
    if (!random && (uint64_t)n > SIZE_MAX / sizeof(int64_t))
        return dt_error(DT_ERR_INVALID, "sampler: dataset size %lld too large", (long long)n);
    dt_sampler *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "sampler: out of memory");
    s->n = n;
    s->batch = global_batch;
    s->micro = micro_batches;
    s->micro_size = global_batch / micro_batches;
    s->seed = seed;
    s->random = random;
    s->perm_epoch = -1;
    *out = s;
    return DT_OK;
}

dt_status dt_sampler_init(int64_t n, int64_t global_batch, int64_t micro_batches,
                          uint64_t seed, int drop_last, dt_sampler **out) {
    DT_TRY(sampler_new(n, global_batch, micro_batches, seed, 0, out));
    dt_sampler *s = *out;
    s->drop_last = drop_last ? 1 : 0;
    s->steps = drop_last ? n / global_batch : (n + global_batch - 1) / global_batch;
    return DT_OK;
}

dt_status dt_sampler_init_random(int64_t n, int64_t global_batch, int64_t micro_batches, uint64_t seed,
                                 dt_sampler **out) {
    DT_TRY(sampler_new(n, global_batch, micro_batches, seed, 1, out));
    /* an "epoch" only numbers steps here: as many as one pass would take */
    (*out)->steps = n / global_batch > 0 ? n / global_batch : 1;
    return DT_OK;
}

void dt_sampler_free(dt_sampler *s) {
    if (!s) return;
    free(s->perm);
    free(s);
}

int64_t dt_sampler_steps_per_epoch(const dt_sampler *s) { return s->steps; }
int64_t dt_sampler_micro_size(const dt_sampler *s) { return s->micro_size; }
int64_t dt_sampler_len(const dt_sampler *s) { return s->n; }
int64_t dt_sampler_global_batch(const dt_sampler *s) { return s->batch; }
int64_t dt_sampler_micro_batches(const dt_sampler *s) { return s->micro; }

/* Fill s->perm for `epoch` unless it is already there (random mode has none). */
static dt_status ensure_perm(dt_sampler *s, int64_t epoch) {
    if (epoch < 0) return dt_error(DT_ERR_INVALID, "sampler: epoch must be >= 0, got %lld", (long long)epoch);
    if (s->random || s->perm_epoch == epoch) return DT_OK;
    if (!s->perm) {
        s->perm = malloc((size_t)s->n * sizeof *s->perm);
        if (!s->perm) return dt_error(DT_ERR_NOMEM, "sampler: out of memory for a permutation of %lld", (long long)s->n);
    }
    /* The per-epoch key mixes seed and epoch once; draw i uses counter i. */
    uint64_t key = dt_hash_u64(s->seed, (uint64_t)epoch, 0x5a3d1e);
    for (int64_t i = 0; i < s->n; i++) s->perm[i] = i;
    for (int64_t i = s->n - 1; i > 0; i--) {
        int64_t j = (int64_t)dt_hash_below(key, (uint64_t)i, (uint64_t)i + 1);
        int64_t t = s->perm[i];
        s->perm[i] = s->perm[j];
        s->perm[j] = t;
    }
    s->perm_epoch = epoch;
    return DT_OK;
}

dt_status dt_sampler_permutation(dt_sampler *s, int64_t epoch, const int64_t **perm) {
    *perm = NULL;
    if (s->random)
        return dt_error(DT_ERR_INVALID, "sampler: a random-window sampler draws with replacement and has no permutation");
    DT_TRY(ensure_perm(s, epoch));
    *perm = s->perm;
    return DT_OK;
}

static dt_status check_step(const dt_sampler *s, int64_t step) {
    if (step < 0 || step >= s->steps)
        return dt_error(DT_ERR_INVALID, "sampler: step %lld out of range [0, %lld)", (long long)step,
                        (long long)s->steps);
    return DT_OK;
}

/* Positions [first, first+count) of step `step` of `epoch`, counted from the start
 * of the step. Permutation mode reads the epoch's order at step*B + position,
 * wrapping past n (padding). Random mode draws position p of global step
 * g = epoch * steps + step as dt_hash_below(key(seed, g), p, n): a function of
 * (seed, g, p) alone, so no world size can change it. */
static void copy_positions(const dt_sampler *s, int64_t epoch, int64_t step, int64_t first, int64_t count,
                           int64_t *out) {
    if (s->random) {
        uint64_t g = (uint64_t)epoch * (uint64_t)s->steps + (uint64_t)step;
        uint64_t key = dt_hash_u64(dt_hash_u64(s->seed, 0x7a2d0e, 0), g, 0);
        for (int64_t k = 0; k < count; k++)
            out[k] = (int64_t)dt_hash_below(key, (uint64_t)(first + k), (uint64_t)s->n);
        return;
    }
    for (int64_t k = 0; k < count; k++) out[k] = s->perm[(step * s->batch + first + k) % s->n];
}

dt_status dt_sampler_micro(dt_sampler *s, int64_t epoch, int64_t step, int64_t micro, int64_t *idx_out) {
    DT_TRY(check_step(s, step));
    if (micro < 0 || micro >= s->micro)
        return dt_error(DT_ERR_INVALID, "sampler: micro-batch %lld out of range [0, %lld)", (long long)micro,
                        (long long)s->micro);
    DT_TRY(ensure_perm(s, epoch));
    copy_positions(s, epoch, step, micro * s->micro_size, s->micro_size, idx_out);
    return DT_OK;
}

dt_status dt_sampler_global(dt_sampler *s, int64_t epoch, int64_t step, int64_t *idx_out) {
    DT_TRY(check_step(s, step));
    DT_TRY(ensure_perm(s, epoch));
    copy_positions(s, epoch, step, 0, s->batch, idx_out);
    return DT_OK;
}

dt_status dt_sampler_rank_block(const dt_sampler *s, int world, int rank, int64_t *first_micro, int64_t *n_micro) {
    if (world <= 0) return dt_error(DT_ERR_INVALID, "sampler: world size must be positive, got %d", world);
    if (rank < 0 || rank >= world)
        return dt_error(DT_ERR_INVALID, "sampler: rank %d out of range [0, %d)", rank, world);
    if (s->micro % world != 0)
        return dt_error(DT_ERR_INVALID,
                        "sampler: micro-batch count %lld is not a multiple of the world size %d "
                        "(each rank must own the same number of micro-batches)",
                        (long long)s->micro, world);
    int64_t per = s->micro / world;
    *first_micro = (int64_t)rank * per;
    *n_micro = per;
    return DT_OK;
}

dt_status dt_sampler_rank_indices(dt_sampler *s, int64_t epoch, int64_t step, int world, int rank,
                                  int64_t *idx_out, size_t *n_out) {
    int64_t first, count;
    DT_TRY(dt_sampler_rank_block(s, world, rank, &first, &count));
    DT_TRY(check_step(s, step));
    DT_TRY(ensure_perm(s, epoch));
    /* The block's micro-batches are adjacent, so its positions are one run. */
    copy_positions(s, epoch, step, first * s->micro_size, count * s->micro_size, idx_out);
    if (n_out) *n_out = (size_t)(count * s->micro_size);
    return DT_OK;
}
