/*
 * testing.h: the one hook through which a test plants a bug in the trainer.
 *
 * `dtrain check` claims to catch the classic data-parallel bugs, and a test must
 * be able to prove it (tests/check_planted.sh). So the trainer can be told to
 * misbehave in a few known ways. The switch lives here, in a private header that
 * is not installed: no public option struct carries it and the library reads no
 * environment variable for it. The dtrain program sets it only when its hidden
 * flag --testing-fault asks. It is process-wide and off by default; set it
 * before training starts.
 */
#ifndef DT_TESTING_H
#define DT_TESTING_H

#include "status.h"

typedef enum {
    DT_FAULT_NONE = 0,
    DT_FAULT_SAMPLER_EPOCH,    /* "sampler-epoch": the sampler is never told the epoch */
    DT_FAULT_SKIP_ALLREDUCE,   /* "skip-allreduce": gradients are not all-reduced */
    DT_FAULT_LR_RANK1,         /* "lr-rank1": rank 1 steps with twice the learning rate */
    DT_FAULT_GRAD_INF,         /* "grad-inf:N": at global step N (1-based) the last rank finds an
                                * inf in its summed gradient (a planted fp16 overflow) */
    DT_FAULT_THREADS_FLIP,     /* "threads-flip": the thread tuner (tuner.h) sets another count at
                                * every step, 1 to N in turn; not a bug: the bits must not change */
    DT_FAULT_SEAL_FLIP,        /* "seal-flip:N": with --secure-transport, the last rank flips a bit of
                                * the Nth record it seals on each connection, after sealing it (an
                                * attacker on the wire): its peers must refuse it, naming the rank */
} dt_fault;

/* Plant the fault with this name (NULL or "": none). DT_ERR_INVALID listing the
 * names for an unknown one. */
dt_status dt_testing_set_fault(const char *name);
/* The planted fault, DT_FAULT_NONE unless a test set one. */
dt_fault  dt_testing_fault(void);
/* The step a fault with a step names ("grad-inf:N": N; "seal-flip:N": the record), 0 for
 * the others. */
long long dt_testing_fault_step(void);

/* The checkpoint fuzz target (tests/fuzz/fuzz_ckpt.c) feeds files whose checksums it
 * cannot forge; with this on, a checkpoint's checksum is still computed but a
 * mismatch is let through, so the metadata checks behind it are reached. No program
 * sets it. */
void      dt_testing_set_unverified(int on);
int       dt_testing_unverified(void);

#endif /* DT_TESTING_H */
