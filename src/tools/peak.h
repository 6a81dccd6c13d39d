/*
 * peak.h: one process's GEMM peak, the denominator of MFU (model FLOPs utilisation).
 *
 * MFU = tokens/s x the model's FLOPs per token / (the peak x the processes). The peak is
 * the best rate of 1024^3 products in the run's precision (sgemm for fp32, the 16-bit
 * GEMM for bf16/fp16), on the run's thread count, over at least a second and 3 products
 * (about 150 on 2 Zen 5 cores; a GPU needs larger products to reach its peak). A rate taken at one start moves from
 * run to run with what else the machine does; so it is measured once per machine and
 * kept in a cache file, a line per (CPU model, kernel, precision, threads) with its
 * date (a GPU's peak is measured at every start: its model is not in the key):
 *   $DT_PEAK_CACHE (a file; "off": no cache), else $XDG_CACHE_HOME/dtrain/peak, else
 *   $HOME/.cache/dtrain/peak.
 * A run that goes faster than the peak proves the peak low: its rate becomes the peak
 * (the cache's line too), so MFU is never above 100%. --peak-gflops gives the figure
 * instead and touches no cache.
 */
#ifndef DT_TOOLS_PEAK_H
#define DT_TOOLS_PEAK_H

#include "ops.h"

typedef struct {
    double gflops;          /* one process's peak; 0: none (could not measure) */
    char   key[256];        /* "cpu=AMD EPYC ...;gemm=avx512;precision=fp32;threads=2" */
    char   path[1024];      /* the cache file, "" without one */
    char   source[64];      /* "measured now", "measured 2026-12-04" (cached), "--peak-gflops" */
    int    given;           /* 1: --peak-gflops */
    int    raised;          /* dt_peak_raise raised it since the last dt_peak_keep */
} dt_peak;

/* The peak of ops's GEMM in precision dtype (DT_F32, DT_BF16, DT_F16) on `threads`
 * threads: from the cache, else measured (and cached). A cache that cannot be read or
 * written is not an error (measured, and a warning when it cannot be written). */
void dt_peak_get(const dt_ops *ops, int dtype, int threads, dt_peak *p);
/* A run reached `gflops` per process, above p->gflops: it is the peak from now on. */
void dt_peak_raise(dt_peak *p, double gflops);
/* At the end of a run: a raised peak goes into the cache (not a given one). */
void dt_peak_keep(dt_peak *p);
/* One cache line (len bytes, no newline) "<gflops> <YYYY-MM-DD> <key>": 1 with its rate,
 * date and key (a pointer into line, klen bytes) when it parses, else 0. */
int  dt_peak_parse_line(const char *line, size_t len, double *g, char date[11], const char **key, size_t *klen);

#endif /* DT_TOOLS_PEAK_H */
