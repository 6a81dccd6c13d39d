/* test_sampler.c: the world-size-invariant sampler (docs/DESIGN.md rule 2): rank
 * blocks reassemble the 1-rank global batch, orders depend on (seed, epoch)
 * only, every sample once per epoch, padding, bad configurations, and the
 * random-window mode (draws from (seed, global step, position) only). */
#include "sampler.h"
#include "tap.h"

#include <stdlib.h>
#include <string.h>

/* seed 42, epoch 0, step 0 of the random mode (N 1000, B 64) */
#define GOLD_RANDOM 552, 700, 392, 481, 20, 829, 134, 887

/* 1 if a is a permutation of [0, n). */
static int is_permutation(const int64_t *a, int64_t n) {
    char *seen = calloc((size_t)n, 1);
    int good = seen != NULL;
    for (int64_t i = 0; good && i < n; i++) {
        if (a[i] < 0 || a[i] >= n || seen[a[i]]) good = 0;
        else seen[a[i]] = 1;
    }
    free(seen);
    return good;
}

/* Step (epoch, step) of s into glob (B values); clears *micro_ok unless its
 * micro-batches are consecutive slices of it, and *union_ok unless the rank
 * blocks of W = 1, 2, 4, 8 concatenate to it. */
static void check_step(dt_sampler *s, int64_t epoch, int64_t step, int64_t *glob, int *union_ok, int *micro_ok) {
    int64_t B = dt_sampler_global_batch(s), S = dt_sampler_micro_batches(s), m_size = B / S;
    int64_t idx[256], cat[256];
    if (B > 256 || dt_sampler_global(s, epoch, step, glob) != DT_OK) *union_ok = 0;
    for (int64_t m = 0; m < S; m++)
        if (dt_sampler_micro(s, epoch, step, m, idx) != DT_OK ||
            memcmp(idx, glob + m * m_size, sizeof(int64_t) * (size_t)m_size) != 0)
            *micro_ok = 0;
    for (int w = 1; w <= 8; w *= 2) {
        size_t filled = 0;
        for (int r = 0; r < w; r++) {
            size_t n = 0;
            if (dt_sampler_rank_indices(s, epoch, step, w, r, cat + filled, &n) != DT_OK) *union_ok = 0;
            int64_t f, c;
            dt_sampler_rank_block(s, w, r, &f, &c);
            if (n != (size_t)(c * m_size) || f * m_size != (int64_t)filled) *union_ok = 0;
            filled += n;
        }
        if (filled != (size_t)B || memcmp(cat, glob, sizeof(int64_t) * (size_t)B) != 0) *union_ok = 0;
    }
}

/* Random mode: indices with replacement from (seed, global step, position). */
static void test_random(void) {
    const int64_t N = 1000, B = 64, S = 8;
    dt_sampler *r = NULL, *r2 = NULL;
    is_int(dt_sampler_init_random(N, B, 7, 1, &r), DT_ERR_INVALID, "random: S not dividing B is rejected");
    is_int(dt_sampler_init_random(0, B, S, 1, &r), DT_ERR_INVALID, "random: N = 0 is rejected");
    is_int(dt_sampler_init_random(N, B, S, 42, &r), DT_OK, "random: init N=1000 B=64 S=8");
    is_int(dt_sampler_steps_per_epoch(r), 15, "  steps per epoch: N / B = 15");
    const int64_t *perm = (const int64_t *)1;
    is_int(dt_sampler_permutation(r, 0, &perm), DT_ERR_INVALID, "  has no permutation");
    ok(perm == NULL, "  and returns none");
    int64_t glob[64], idx[64], other[64];
    is_int(dt_sampler_micro(r, -1, 0, 0, idx), DT_ERR_INVALID, "  negative epoch is rejected");
    is_int(dt_sampler_global(r, 0, 15, idx), DT_ERR_INVALID, "  step past the epoch is rejected");

    /* the union of the rank blocks is the global batch for W = 1, 2, 4, 8; micro-batches are its slices */
    int union_ok = 1, micro_ok = 1, range_ok = 1, dup = 0;
    for (int64_t epoch = 0; epoch < 3; epoch++)
        for (int64_t step = 0; step < 15; step++) {
            check_step(r, epoch, step, glob, &union_ok, &micro_ok);
            for (int k = 0; k < B; k++) range_ok &= glob[k] >= 0 && glob[k] < N;
            for (int k = 1; k < B; k++) dup += glob[k] == glob[k - 1];
        }
    ok(union_ok, "  the rank blocks of W=1,2,4,8 concatenate to the global batch (45 steps)");
    ok(micro_ok, "  micro-batches are consecutive slices of it");
    ok(range_ok, "  every index lies in [0, N)");
    ok(dup < 10, "  neighbours rarely repeat (%d of %d)", dup, 45 * 63);

    /* what an index depends on: the seed and the global step, not S nor the sampler object */
    dt_sampler_global(r, 0, 0, glob);
    dt_sampler_global(r, 0, 1, other);
    ok(memcmp(glob, other, sizeof glob) != 0, "  steps 0 and 1 differ");
    dt_sampler_global(r, 1, 0, other);
    ok(memcmp(glob, other, sizeof glob) != 0, "  epoch 1 step 0 differs from epoch 0 step 0");
    is_int(dt_sampler_init_random(N, B, 1, 42, &r2), DT_OK, "  a second sampler, same seed, S = 1");
    dt_sampler_global(r2, 0, 0, other);
    ok(memcmp(glob, other, sizeof glob) == 0, "  the same global batch (deterministic, S does not matter)");
    dt_sampler_free(r2);
    /* B = 32: 31 steps per epoch, so global step 33 is its (epoch 1, step 2) */
    dt_sampler_init_random(N, 32, 4, 42, &r2);
    dt_sampler_global(r, 2, 3, glob);
    dt_sampler_global(r2, 1, 2, other);
    ok(memcmp(glob, other, 32 * sizeof(int64_t)) == 0,
       "  global step 33 starts with the same indices for B = 64 (epoch 2, step 3) and B = 32 (epoch 1, step 2)");
    dt_sampler_free(r2);
    dt_sampler_init_random(N, B, S, 43, &r2);
    dt_sampler_global(r, 0, 0, glob);
    dt_sampler_global(r2, 0, 0, other);
    ok(memcmp(glob, other, sizeof glob) != 0, "  another seed: other indices");
    dt_sampler_free(r2);
    const int64_t gold[8] = {GOLD_RANDOM};
    ok(memcmp(glob, gold, sizeof gold) == 0, "  seed 42 step 0 starts with the pinned indices (format stability)");

    /* close to uniform: 10 samples, 64000 draws */
    dt_sampler *ru = NULL;
    is_int(dt_sampler_init_random(10, 64, 4, 7, &ru), DT_OK, "random: B > N is allowed (draws repeat anyway)");
    is_int(dt_sampler_steps_per_epoch(ru), 1, "  one step per epoch");
    int hist[10] = {0};
    for (int64_t e = 0; e < 1000; e++) {
        dt_sampler_global(ru, e, 0, glob);
        for (int k = 0; k < 64; k++) hist[glob[k]]++;
    }
    int uniform = 1;
    for (int i = 0; i < 10; i++) uniform &= hist[i] > 6000 && hist[i] < 6800;
    ok(uniform, "  64000 draws over 10 windows are close to uniform (%d .. %d each)", hist[0], hist[9]);
    dt_sampler_free(ru);
    dt_sampler_free(r);

    /* the bounded draw under it */
    int below = 1;
    for (uint64_t i = 0; i < 1000; i++) below &= dt_hash_below(5, i, 3) < 3 && dt_hash_below(5, i, 1) == 0;
    ok(below && dt_hash_below(9, 1, UINT64_MAX) == dt_hash_below(9, 1, UINT64_MAX), "dt_hash_below stays below its bound");
}

int main(void) {
    dt_sampler *s = NULL;
    const int64_t N = 1000, B = 64, S = 8;

    /* ---- configuration errors ---- */
    is_int(dt_sampler_init(N, 64, 7, 1, 1, &s), DT_ERR_INVALID, "S not dividing B is rejected");
    like(dt_last_error(), "does not divide", "  message says so");
    ok(s == NULL, "  no sampler returned");
    is_int(dt_sampler_init(10, 16, 4, 1, 1, &s), DT_ERR_INVALID, "B > N is rejected");
    like(dt_last_error(), "larger than the dataset", "  message says so");
    is_int(dt_sampler_init(0, 16, 4, 1, 1, &s), DT_ERR_INVALID, "N = 0 is rejected");
    is_int(dt_sampler_init(N, 0, 1, 1, 1, &s), DT_ERR_INVALID, "B = 0 is rejected");
    is_int(dt_sampler_init(N, 16, 0, 1, 1, &s), DT_ERR_INVALID, "S = 0 is rejected");

    is_int(dt_sampler_init(N, B, S, 42, 1, &s), DT_OK, "init N=1000 B=64 S=8 drop_last");
    is_int(dt_sampler_steps_per_epoch(s), 15, "drop_last: floor(1000/64) = 15 steps");
    is_int(dt_sampler_micro_size(s), 8, "micro-batch of 8");
    int64_t first, count;
    is_int(dt_sampler_rank_block(s, 3, 0, &first, &count), DT_ERR_INVALID, "S=8 with W=3 is rejected");
    like(dt_last_error(), "not a multiple of the world size 3", "  message names the world size");
    is_int(dt_sampler_rank_block(s, 2, 2, &first, &count), DT_ERR_INVALID, "rank 2 of 2 is rejected");
    is_int(dt_sampler_rank_block(s, 4, 3, &first, &count), DT_OK, "rank 3 of 4");
    ok(first == 6 && count == 2, "  owns micro-batches [6, 8)");
    int64_t idx[64], glob[64];
    is_int(dt_sampler_micro(s, 0, 15, 0, idx), DT_ERR_INVALID, "step past the epoch is rejected");
    is_int(dt_sampler_micro(s, 0, 0, 8, idx), DT_ERR_INVALID, "micro-batch past S is rejected");
    is_int(dt_sampler_micro(s, -1, 0, 0, idx), DT_ERR_INVALID, "negative epoch is rejected");

    /* ---- union over ranks == 1-rank global batch, for W in {1,2,4,8} ---- */
    int union_ok = 1, micro_ok = 1;
    for (int64_t epoch = 0; epoch < 3; epoch++)
        for (int64_t step = 0; step < dt_sampler_steps_per_epoch(s); step++)
            check_step(s, epoch, step, glob, &union_ok, &micro_ok);
    ok(micro_ok, "micro-batches are consecutive slices of the global batch");
    ok(union_ok, "the rank blocks of W=1,2,4,8 concatenate to the 1-rank global batch (3 epochs)");

    /* ---- every sample exactly once per epoch with drop_last ---- */
    int64_t *all = malloc(sizeof(int64_t) * (size_t)N);
    int once = all != NULL;
    int64_t steps = dt_sampler_steps_per_epoch(s);
    for (int64_t st = 0; once && st < steps; st++)
        if (dt_sampler_global(s, 1, st, all + st * B) != DT_OK) once = 0;
    /* The 15 full batches cover 960 distinct samples; with the tail they form the permutation. */
    const int64_t *perm = NULL;
    dt_sampler_permutation(s, 1, &perm);
    if (once) {
        memcpy(all + steps * B, perm + steps * B, sizeof(int64_t) * (size_t)(N - steps * B));
        once = is_permutation(all, N) && memcmp(all, perm, sizeof(int64_t) * (size_t)N) == 0;
    }
    ok(once, "drop_last: the full batches of an epoch hold distinct samples, the tail the rest");
    ok(is_permutation(perm, N), "the epoch order is a permutation of [0, N)");

    /* ---- same (seed, epoch) same order; different epochs/seeds differ ---- */
    int64_t *p0 = malloc(sizeof(int64_t) * (size_t)N), *p1 = malloc(sizeof(int64_t) * (size_t)N);
    dt_sampler_permutation(s, 0, &perm);
    memcpy(p0, perm, sizeof(int64_t) * (size_t)N);
    dt_sampler_permutation(s, 1, &perm);
    memcpy(p1, perm, sizeof(int64_t) * (size_t)N);
    ok(memcmp(p0, p1, sizeof(int64_t) * (size_t)N) != 0, "epochs 0 and 1 give different orders");
    int identity = 1;
    for (int64_t i = 0; i < N; i++) identity &= p0[i] == i;
    ok(!identity, "epoch 0 is shuffled");
    dt_sampler *s2 = NULL;
    is_int(dt_sampler_init(N, 32, 4, 42, 0, &s2), DT_OK, "a second sampler with the same seed (other B, S)");
    dt_sampler_permutation(s2, 0, &perm);
    ok(memcmp(p0, perm, sizeof(int64_t) * (size_t)N) == 0, "same (seed, epoch): same order, whatever B and S");
    dt_sampler_free(s2);
    dt_sampler_init(N, 32, 4, 43, 0, &s2);
    dt_sampler_permutation(s2, 0, &perm);
    ok(memcmp(p0, perm, sizeof(int64_t) * (size_t)N) != 0, "another seed: another order");
    dt_sampler_free(s2);
    /* A permutation does not depend on which epochs were asked for before. */
    dt_sampler_permutation(s, 0, &perm);
    ok(memcmp(p0, perm, sizeof(int64_t) * (size_t)N) == 0, "returning to epoch 0 recomputes the same order");

    /* Rough uniformity: over 200 epochs, position 0 holds sample 0 about 200/N times... use a small N. */
    dt_sampler *s3 = NULL;
    dt_sampler_init(4, 4, 1, 7, 1, &s3);
    int hist[4][4] = {{0}};
    for (int64_t e = 0; e < 4000; e++) {
        dt_sampler_permutation(s3, e, &perm);
        for (int i = 0; i < 4; i++) hist[i][perm[i]]++;
    }
    int uniform = 1;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) uniform &= hist[i][j] > 850 && hist[i][j] < 1150;
    ok(uniform, "shuffles of 4 elements are close to uniform over 4000 epochs");
    dt_sampler_free(s3);

    /* ---- padding mode ---- */
    dt_sampler *sp = NULL;
    is_int(dt_sampler_init(N, B, S, 42, 0, &sp), DT_OK, "init without drop_last");
    is_int(dt_sampler_steps_per_epoch(sp), 16, "padding: ceil(1000/64) = 16 steps");
    dt_sampler_permutation(sp, 2, &perm);
    memcpy(p0, perm, sizeof(int64_t) * (size_t)N);
    is_int(dt_sampler_global(sp, 2, 15, glob), DT_OK, "last (padded) batch");
    int pad_ok = 1;
    for (int64_t k = 0; k < B; k++) {
        int64_t pos = 15 * B + k;
        pad_ok &= glob[k] == p0[pos % N];
    }
    ok(pad_ok, "the last batch is the tail of the order followed by its start (wrap-around)");
    ok(glob[B - 1] == p0[(16 * B - 1) % N] && glob[40] == p0[0], "  position 1000 wraps to position 0");
    /* Over an epoch with padding, every sample appears at least once and 24 twice. */
    int *cnt = calloc((size_t)N, sizeof(int));
    for (int64_t st = 0; st < 16; st++) {
        dt_sampler_global(sp, 2, st, glob);
        for (int64_t k = 0; k < B; k++) cnt[glob[k]]++;
    }
    int ones = 0, twos = 0, other = 0;
    for (int64_t i = 0; i < N; i++) {
        if (cnt[i] == 1) ones++;
        else if (cnt[i] == 2) twos++;
        else other++;
    }
    ok(ones == 976 && twos == 24 && other == 0, "padding: 976 samples once, 24 twice (got %d, %d, %d)", ones, twos, other);
    free(cnt);
    dt_sampler_free(sp);

    /* B == N is allowed: one step covering everything. */
    dt_sampler *sa = NULL;
    is_int(dt_sampler_init(8, 8, 2, 1, 1, &sa), DT_OK, "B == N");
    is_int(dt_sampler_steps_per_epoch(sa), 1, "  one step");
    dt_sampler_free(sa);

    /* Pinned values: the order is part of every checkpoint's meaning (a resumed
     * run recomputes it), so it must not change between versions. */
    dt_sampler *sg = NULL;
    dt_sampler_init(1000, 64, 8, 42, 1, &sg);
    const int64_t gold0[8] = {526, 112, 675, 550, 664, 736, 286, 364}, gold5[8] = {386, 641, 26, 849, 848, 180, 926, 183};
    dt_sampler_permutation(sg, 0, &perm);
    int pinned = memcmp(perm, gold0, sizeof gold0) == 0;
    dt_sampler_permutation(sg, 5, &perm);
    pinned &= memcmp(perm, gold5, sizeof gold5) == 0;
    ok(pinned && dt_hash_u64(1, 2, 3) == 9538264219077628529ULL,
       "seed 42, epochs 0 and 5 start with the pinned orders (format stability)");
    dt_sampler_free(sg);

    /* The hash is a pure function of its arguments. */
    ok(dt_hash_u64(1, 2, 3) == dt_hash_u64(1, 2, 3) && dt_hash_u64(1, 2, 3) != dt_hash_u64(1, 2, 4) &&
       dt_hash_u64(1, 2, 3) != dt_hash_u64(1, 3, 2), "dt_hash_u64 depends on every argument");

    free(all);
    free(p0);
    free(p1);
    dt_sampler_free(s);
    test_random();
    return done_testing();
}
