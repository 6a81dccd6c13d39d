/*
 * coll_dump.c: run a fixed set of reductions on pseudo-random data and write rank 0's
 * results to a file, so tests can compare backends bit for bit (tests/mpi_determinism.sh).
 *
 *   coll_dump OUTFILE      (under dtrun or mpirun; backend from DT_BACKEND)
 *
 * The inputs span many exponents, so a different summation order would change the
 * last bits: equal files mean the same reduction tree, not just luck.
 */
#include "comm.h"
#include "dtype.h"   /* dt_f32_to_f16, dt_f32_to_bf16 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: a tiny deterministic generator keyed by (rank, stream) */
static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* value in +-[2^-8, 2^8) with a random mantissa */
static float rnd(uint64_t *s) {
    uint64_t r = mix(s);
    float m = 1.0f + (float)(r & 0xffffff) / 16777216.0f;
    int e = (int)((r >> 24) % 16) - 8;
    float v = m;
    for (; e > 0; e--) v *= 2;
    for (; e < 0; e++) v /= 2;
    return (r >> 40) & 1 ? -v : v;
}

static int fail(const char *what) {
    fprintf(stderr, "coll_dump: %s: %s\n", what, dt_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: coll_dump OUTFILE\n"); return 2; }
    dt_comm *c;
    if (dt_comm_init(NULL, &c) != DT_OK) return fail("init");
    int r = dt_comm_rank(c), n = dt_comm_size(c);
    /* small (whole-buffer doubling), large (halving/doubling or rings), odd counts */
    static const size_t counts[] = { 1, 7, 1000, 100003 };
    FILE *f = NULL;
    if (r == 0 && !(f = fopen(argv[1], "wb"))) { perror(argv[1]); return 1; }
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        size_t cnt = counts[k];
        float *x = malloc(cnt * n * sizeof *x), *y = malloc(cnt * n * sizeof *y);
        uint16_t *h = malloc(cnt * sizeof *h), *hy = malloc(cnt * sizeof *hy);
        if (!x || !y || !h || !hy) { fprintf(stderr, "coll_dump: out of memory\n"); return 1; }
        uint64_t seed = 1000003u * (uint64_t)r + cnt;
        for (size_t i = 0; i < cnt * n; i++) x[i] = rnd(&seed);
        for (size_t i = 0; i < cnt; i++) h[i] = dt_f32_to_bf16(x[i]);
        if (dt_allreduce(c, x, y, cnt, DT_F32, DT_SUM) != DT_OK) return fail("all_reduce f32 sum");
        if (f && fwrite(y, sizeof *y, cnt, f) != cnt) return fail("write");
        if (dt_allreduce(c, x, y, cnt, DT_F32, DT_AVG) != DT_OK) return fail("all_reduce f32 avg");
        if (f && fwrite(y, sizeof *y, cnt, f) != cnt) return fail("write");
        if (dt_allreduce(c, h, hy, cnt, DT_BF16, DT_SUM) != DT_OK) return fail("all_reduce bf16 sum");
        if (f && fwrite(hy, sizeof *hy, cnt, f) != cnt) return fail("write");
        /* reduce_scatter of the (n, cnt) array: gather the blocks on rank 0 to dump them */
        if (dt_reduce_scatter(c, x, y, cnt, DT_F32, DT_SUM) != DT_OK) return fail("reduce_scatter");
        if (dt_allgather(c, y, y, cnt, DT_F32) != DT_OK) return fail("all_gather");
        if (f && fwrite(y, sizeof *y, cnt * n, f) != cnt * n) return fail("write");
        memcpy(y, x, cnt * sizeof *y);
        if (dt_reduce(c, y, y, cnt, DT_F32, DT_SUM, 0) != DT_OK) return fail("reduce");
        if (f && fwrite(y, sizeof *y, cnt, f) != cnt) return fail("write");
        free(x); free(y); free(h); free(hy);
    }
    if (f && fclose(f) != 0) { perror(argv[1]); return 1; }
    dt_comm_destroy(c);
    return 0;
}
