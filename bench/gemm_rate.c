/*
 * bench/gemm_rate.c: the CPU's GEMM kernels on a model's matrix products, f32 against
 * the bf16 products of --precision bf16, in one run (bench/precision.sh calls it).
 *
 *   bench/gemm_rate [gpt|gpt2 ...] [-t THREADS] [-r REPEATS] [-v] [-f]
 *
 * A model's products are those of its linear layers in one training step of one
 * micro-batch: forward y = x W^T (rows x in -> out), backward dx = dy W and dW = dy^T x,
 * for every distinct layer shape (qkv, attention projection, MLP up and down, head):
 *   gpt   the default gpt: dim 128, MLP 512, vocab 256, 12 x 64 = 768 rows
 *   gpt2  GPT-2 124M at block 256, batch 4: dim 768, MLP 3072, vocab 50304, 1024 rows
 * Each kernel runs the whole set REPEATS times (default 5) after one warm-up; the best
 * repeat counts (the machine is shared). Prints GFLOP/s (2 M N K per product) per
 * kernel and the ratio bf16 / f32 (-v: each product's too, its best repeat). The
 * kernels: f32 is sgemm as DT_CPU_GEMM chose it (auto: dtrain's AVX-512 kernel where the
 * CPU has AVX-512 F); bf16 is gemm_lp on bf16 operands (auto: vdpbf16ps where the CPU
 * has AVX512-BF16).
 *
 * -f first prints the core's FMA ceiling: one thread issuing nothing but independent
 * AVX-512 FMAs (14 chains, more than latency x pipes), the most any f32 kernel can do on
 * one core, to hold the MFU's measured peak (dtrain's 1024^3 product) against.
 */
#include "clock.h"
#include "dtype.h"
#include "ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const char *name; int rows, shapes[5][2]; } model;

static const model models[] = {
    {"gpt", 768, {{128, 384}, {128, 128}, {128, 512}, {512, 128}, {128, 256}}},
    {"gpt2", 1024, {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}}},
};

/* each product's best time (-v), by kernel: [lp][shape * 3 + product] */
static double each[2][15];

static double run_set(const dt_ops *ops, const model *m, int lp, float *x, float *w, float *y, double *flops) {
    double t0 = dt_now();
    *flops = 0;
    for (int s = 0; s < 5; s++) {
        int in = m->shapes[s][0], out = m->shapes[s][1], R = m->rows;
        /* forward y = x W^T; backward dx = dy W (dy in y, dx in x); dW = dy^T x (into w) */
        int prod[3][7] = {{0, 1, R, out, in, in, in}, {0, 0, R, in, out, out, in}, {1, 0, out, in, R, out, in}};
        for (int p = 0; p < 3; p++) {
            int ta = prod[p][0], tb = prod[p][1], M = prod[p][2], N = prod[p][3], K = prod[p][4];
            const float *A = p == 0 ? x : y, *B = p == 0 ? w : p == 1 ? w : x;
            float *C = p == 0 ? y : p == 1 ? x : w;
            int lda = prod[p][5], ldb = prod[p][6], ldc = N;
            double t1 = dt_now();
            dt_status st = lp ? ops->gemm_lp(DT_BF16, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc)
                              : ops->sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc);
            if (st != DT_OK) {
                fprintf(stderr, "gemm_rate: %s\n", dt_last_error());
                exit(1);
            }
            *flops += 2.0 * M * N * (double)K;
            double dt = dt_now() - t1;
            if (dt < each[lp][s * 3 + p]) each[lp][s * 3 + p] = dt;
        }
    }
    return dt_now() - t0;
}

/* GFLOP/s of one thread issuing AVX-512 FMAs only (-f); 0 where there are none. The
 * loop is assembly: a compiler would merge chains that compute the same value. */
static double fma_ceiling(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (!__builtin_cpu_supports("avx512f")) return 0.0;
    const long iters = 20000000;   /* 14 FMAs of 16 lanes each */
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t = dt_now();
        __asm__ volatile("vxorps %%xmm0, %%xmm0, %%xmm0\n\t"
                         "vxorps %%xmm1, %%xmm1, %%xmm1\n\t"
                         "mov %0, %%rcx\n"
                         "1:\n\t"
                         "vfmadd231ps %%zmm1, %%zmm0, %%zmm2\n\t vfmadd231ps %%zmm1, %%zmm0, %%zmm3\n\t"
                         "vfmadd231ps %%zmm1, %%zmm0, %%zmm4\n\t vfmadd231ps %%zmm1, %%zmm0, %%zmm5\n\t"
                         "vfmadd231ps %%zmm1, %%zmm0, %%zmm6\n\t vfmadd231ps %%zmm1, %%zmm0, %%zmm7\n\t"
                         "vfmadd231ps %%zmm1, %%zmm0, %%zmm8\n\t vfmadd231ps %%zmm1, %%zmm0, %%zmm9\n\t"
                         "vfmadd231ps %%zmm1, %%zmm0, %%zmm10\n\t vfmadd231ps %%zmm1, %%zmm0, %%zmm11\n\t"
                         "vfmadd231ps %%zmm1, %%zmm0, %%zmm12\n\t vfmadd231ps %%zmm1, %%zmm0, %%zmm13\n\t"
                         "vfmadd231ps %%zmm1, %%zmm0, %%zmm14\n\t vfmadd231ps %%zmm1, %%zmm0, %%zmm15\n\t"
                         "dec %%rcx\n\t"
                         "jnz 1b\n\t"
                         "vzeroupper"
                         :
                         : "r"(iters)
                         : "rcx", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                           "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
        double dt = dt_now() - t;
        if (dt < best) best = dt;
    }
    return (double)iters * 14 * 32 / best / 1e9;
#else
    return 0.0;
#endif
}

int main(int argc, char **argv) {
    int threads = 0, reps = 5, verbose = 0, ceiling = 0;
    const char *want[8];
    int nwant = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-v")) verbose = 1;
        else if (!strcmp(argv[i], "-f")) ceiling = 1;
        else if (nwant < 8 && (!strcmp(argv[i], "gpt") || !strcmp(argv[i], "gpt2"))) want[nwant++] = argv[i];
        else {
            fprintf(stderr, "usage: gemm_rate [gpt|gpt2 ...] [-t THREADS] [-r REPEATS] [-v] [-f]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    dt_device_opts dev = {0};
    const dt_ops *ops = NULL;
    if (dt_device_opts_env(&dev) != DT_OK || !(ops = dt_ops_get_ex("cpu", &dev))) {
        fprintf(stderr, "gemm_rate: %s\n", dt_last_error());
        return 1;
    }
    if (threads > 0 && ops->set_threads(threads) != DT_OK) {
        fprintf(stderr, "gemm_rate: %s\n", dt_last_error());
        return 1;
    }
    if (ceiling) {
        double c = fma_ceiling();
        if (c > 0) printf("FMA ceiling: %.1f GFLOP/s on one core (AVX-512 FMAs only)\n", c);
        else printf("FMA ceiling: no AVX-512 F here\n");
    }
    printf("%-5s %-12s %10s %-12s %10s %7s\n", "model", "f32 kernel", "GFLOP/s", "bf16 kernel", "GFLOP/s", "ratio");
    for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
        const model *m = &models[mi];
        int chosen = !nwant;
        for (int i = 0; i < nwant; i++) chosen |= !strcmp(want[i], m->name);
        if (!chosen) continue;
        size_t big = 0;   /* the largest of any operand */
        for (int s = 0; s < 5; s++) {
            size_t in = (size_t)m->shapes[s][0], out = (size_t)m->shapes[s][1], r = (size_t)m->rows;
            size_t a = r * in > r * out ? r * in : r * out;
            a = a > in * out ? a : in * out;
            big = a > big ? a : big;
        }
        float *x = malloc(big * sizeof *x), *w = malloc(big * sizeof *w), *y = malloc(big * sizeof *y);
        if (!x || !w || !y) return 1;
        srand(1);
        for (size_t i = 0; i < big; i++) x[i] = (float)rand() / RAND_MAX - 0.5f, w[i] = x[i] * 0.1f, y[i] = x[i];
        ops->round_to(x, x, big, DT_BF16);
        ops->round_to(w, w, big, DT_BF16);
        ops->round_to(y, y, big, DT_BF16);
        double best[2] = {1e30, 1e30}, flops = 0;
        for (int i = 0; i < 15; i++) each[0][i] = each[1][i] = 1e30;
        for (int lp = 0; lp < 2; lp++) {
            run_set(ops, m, lp, x, w, y, &flops);   /* warm-up */
            for (int r = 0; r < reps; r++) {
                /* the outputs feed the next products: round them again so bf16 stays exact */
                ops->round_to(x, x, big, DT_BF16), ops->round_to(w, w, big, DT_BF16), ops->round_to(y, y, big, DT_BF16);
                double t = run_set(ops, m, lp, x, w, y, &flops);
                if (t < best[lp]) best[lp] = t;
            }
        }
        printf("%-5s %-12s %10.1f %-12s %10.1f %6.2fx\n", m->name, dt_ops_gemm_name(ops, DT_F32), flops / best[0] / 1e9,
               dt_ops_gemm_name(ops, DT_BF16), flops / best[1] / 1e9, best[0] / best[1]);
        static const char *what[3] = {"y = x W^T", "dx = dy W", "dW = dy^T x"};
        for (int i = 0; verbose && i < 15; i++) {
            int in = m->shapes[i / 3][0], out = m->shapes[i / 3][1], R = m->rows, p = i % 3;
            int M = p == 2 ? out : R, N = p == 0 ? out : in, K = p == 0 ? in : p == 1 ? out : R;
            double f = 2.0 * M * N * (double)K;
            printf("  %-11s %5d x %5d x %5d %10.1f %23.1f %6.2fx\n", what[p], M, N, K, f / each[0][i] / 1e9,
                   f / each[1][i] / 1e9, each[0][i] / each[1][i]);
        }
        free(x), free(w), free(y);
    }
    return 0;
}
