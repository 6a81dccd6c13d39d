/*
 * shard_impl.h: what shard.c (the modes, ZeRO-1/2 and what every mode shares) and
 * shard_params.c (ZeRO-3: units gathered before their layers run) share; not installed.
 */
#ifndef DT_SHARD_IMPL_H
#define DT_SHARD_IMPL_H

#include "shard.h"

/* A sharding mode's row (shard.c): what it splits over the ranks. Every consumer reads
 * these columns; none compares the mode itself. */
typedef struct {
    const char   *name;
    unsigned char optim;     /* the optimizer state: each rank updates its shard */
    unsigned char grads;     /* the summed gradient: each rank receives its shard only */
    unsigned char params;    /* the parameters: each rank keeps its shard, units gathered to run */
} dt_shard_mode_row_;
extern const dt_shard_mode_row_ dt_shard_modes_[DT_SHARD_COUNT];

/* Units: runs of consecutive layers holding at least unit_floats parameters (the last
 * one whatever is left), gathered and dropped as one, as FSDP wraps modules.
 * While unit u runs, unit u + 1 (forward) or u - 1 (backward) is gathered on the
 * communicator's worker thread; the last unit stays from its forward to its backward. */

enum { U_DROPPED, U_FLIGHT, U_HERE };

struct shard_unit {
    int       first, last;    /* layers [first, last] */
    int       r0, nr;         /* parameter ranges rlo/rhi[r0 .. r0 + nr) */
    int       state;
    int       made;           /* here, and the model's copies derived from it made (unit_need) */
    int       nwork, cap;     /* broadcasts in flight */
    dt_work **work;
    size_t    held;           /* bytes of parameters it brought that this rank does not own */
    /* pool: its runs of back-to-back ranges q0 .. q0 + nq (qlo/qhi/qpos), gathered into
     * a slot of the pool at qpos; own: all in this rank's shard, read where they lie */
    int       q0, nq, own;
    float    *slot;
    float    *gslot;          /* its layers' gradients (a slot of the same pool) */
    int       gpend;          /* sums in flight from gslot */
    int       gdone;          /* its backward is over: gslot goes once gpend is 0 */
};

struct dt_shard {
    dt_model     *model;
    const dt_ops *ops;
    dt_comm      *comm;
    dt_shard_mode mode;
    int           world, rank;
    int           scatter;    /* optim: gradients reduce-scattered as with grads (dt_shard_scatter_sums) */
    size_t        base;       /* the first parameter sharded (dt_shard_init_range; else 0) */
    size_t        n;          /* parameters sharded: [base, base + n) */
    size_t        per;        /* floats per shard (a multiple of DT_SUM_CHUNK); n with none */
    size_t        lo, len;    /* this rank's range of [base, base + n) */
    int           stage;      /* collectives through host: host holds world*per floats */
    float        *host;
    double       *dparts;     /* device: the chunk sums of the range the norm needs */
    double       *parts;      /* host: every chunk sum of the padded array */
    /* params mode */
    int           full;       /* every rank holds the whole parameter array: layer hooks pause */
    size_t       *rlo, *rhi;  /* the parameter ranges the layers read, unit by unit */
    int           nranges;
    unsigned char *rcnt;      /* 1: range r's bytes are in its unit's `held` (a range two
                               * gathered units share, a tied embedding, counts once) */
    size_t        unit_floats; /* a unit holds at least this many parameters */
    int           post;       /* backward prefetch after a unit's backward (DT_PREFETCH_POST) */
    int           nunits;
    struct shard_unit *units;
    int          *lunit;      /* layer -> unit */
    /* gradient sums in flight, oldest first: [lo, hi) of the flat array (unit -1) or of
     * unit's gradient slot at base + lo */
    struct { dt_work *work; size_t lo, hi; int unit; float *base; } *pend;
    size_t        full_held;  /* gather_root: bytes of parameters beyond the shard */
    size_t        grads_gone; /* release_grads: bytes of this rank's gradient given back */
    int           npend, pend_cap;
    size_t        pend_floats;
    int          *lr0;        /* layer i's ranges: rlo/rhi[lr0[i] .. lr0[i + 1]) */
    /* host memory: the model's arrays in nblk blocks of blk_floats (ops page_block);
     * a gradient block outside the shard that one layer fills goes back whole once
     * every gradient in it is summed: blk_need floats (0: not such a block), blk_dead
     * summed so far in this pass */
    size_t       *blk_need, *blk_dead;
    size_t        nblk, blk_floats;
    /* params with a pool (host memory, no staging): a unit is gathered into one of the
     * pool's slots of slot_floats each, its layers read it there (model views), and the
     * slot is reused by the next unit: the same pages every step, none given back and
     * faulted in again. The flat array outside the shard stays untouched. */
    int           pool;
    size_t       *qlo, *qhi, *qpos;  /* the units' runs: flat [qlo, qhi) at slot + qpos */
    int          *rrun;              /* range -> its run */
    int          *lrun;              /* layer -> the run its ranges were gathered in (-1: none) */
    int          *glrun;             /* layer -> the run its gradient is written in: the last
                                      * that holds its ranges (a tied weight's two uses in one
                                      * unit add into one gradient) */
    size_t        slot_floats;
    float       **slots;
    unsigned char *slot_used;
    int           nslots, slot_cap;
    /* a layer whose tensors no other unit shares (lgrad) writes its gradient into a slot
     * its unit takes from the same pool (ngrad of them taken, two at most); the sum goes
     * to the flat array's shard */
    unsigned char *lgrad;
    int           ngrad;
    int           cur;       /* the layer backward runs */
};

/* the optimizer state is split: every mode but none, on several ranks */
static inline int distributed(const dt_shard *s) { return s->world > 1 && dt_shard_modes_[s->mode].optim; }
/* only this rank's shard of the gradient holds the global sum */
static inline int grads_sharded(const dt_shard *s) { return s->world > 1 && (dt_shard_modes_[s->mode].grads || s->scatter); }
/* each rank keeps its shard of the parameters only */
static inline int params_sharded(const dt_shard *s) { return s->world > 1 && dt_shard_modes_[s->mode].params; }
/* the device takes memory back when it is discarded: host memory, or a GPU whose
 * allocations are sparse (ops page_block) */
static inline int gives_back(const dt_shard *s) { return s->ops->host_memory || s->ops->page_block; }

/* shard_params.c: settle the gradient sums in flight (all of them with force); free
 * what params mode holds (units, pool, views). */
dt_status dt_shard_grads_settle_(dt_shard *s, int force);
void      dt_shard_params_free_(dt_shard *s);

#endif /* DT_SHARD_IMPL_H */
