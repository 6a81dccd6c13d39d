/*
 * optim.h: optimizers (SGD, AdamW), learning-rate schedules and gradient
 * clipping, with PyTorch's semantics so a run can be compared with the peer
 * script step by step.
 *
 * Optimizers update the model's flat parameter array with one fused kernel
 * from the dt_ops table; their state (momentum buffer, or AdamW's two moments,
 * plus the step count) lives in flat arrays of the same layout, exposed for
 * checkpoints. Weight decay applies to every parameter, as PyTorch does by
 * default.
 */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "status.h"

/* ---- optimizers ------------------------------------------------------------ */

typedef enum { DT_OPTIM_SGD, DT_OPTIM_ADAMW } dt_optim_kind;

typedef struct {
    dt_optim_kind kind;
    float lr;                 /* base learning rate (schedules scale from it) */
    float weight_decay;       /* SGD: L2 added to the gradient; AdamW: decoupled */
    /* SGD */
    float momentum, dampening;
    int   nesterov;
    /* AdamW */
    float beta1, beta2, eps;
} dt_optim_config;

/* PyTorch's defaults: SGD(lr) with momentum 0; AdamW(lr, betas (0.9, 0.999), eps 1e-8, wd 0.01). */
dt_optim_config dt_optim_sgd_defaults(float lr);
dt_optim_config dt_optim_adamw_defaults(float lr);

typedef struct dt_optim dt_optim;

/* An optimizer over n parameters with state allocated from ops. Checks the
 * hyper-parameters as PyTorch does (nesterov needs momentum > 0 and dampening 0). */
dt_status dt_optim_init(const dt_optim_config *cfg, const dt_ops *ops, size_t n, dt_optim **out);
void      dt_optim_free(dt_optim *o);
/* One step: params (n) -= update(grads (n) * grad_scale) at learning rate lr. */
dt_status dt_optim_step(dt_optim *o, float *params, const float *grads, float lr, float grad_scale);

/* State for checkpoints: nstate flat device arrays of n floats (SGD with
 * momentum: momentum_buffer; AdamW: exp_avg, exp_avg_sq; SGD without momentum:
 * none), their PyTorch names, and the number of steps taken. */
int         dt_optim_nstate(const dt_optim *o);
float      *dt_optim_state(dt_optim *o, int i);
const char *dt_optim_state_name(const dt_optim *o, int i);
size_t      dt_optim_size(const dt_optim *o);
int64_t     dt_optim_steps(const dt_optim *o);
void        dt_optim_set_steps(dt_optim *o, int64_t steps);   /* after loading the state arrays */
const dt_optim_config *dt_optim_config_of(const dt_optim *o);

/* ---- learning-rate schedules ------------------------------------------------ */

typedef enum { DT_SCHED_CONSTANT, DT_SCHED_STEP, DT_SCHED_COSINE } dt_sched_kind;

typedef struct {
    dt_sched_kind kind;
    float   base_lr;
    int64_t step_size;        /* step: multiply by gamma every step_size iterations */
    float   gamma;
    int64_t total_steps;      /* cosine: reaches min_lr after this many iterations */
    float   min_lr;           /* cosine: eta_min (default 0) */
    int64_t warmup_steps;     /* linear warm-up before the schedule (0 = none) */
} dt_schedule;

/* Learning rate for iteration `step` (0-based: the lr used by the step-th update).
 *   constant: base;  step: base * gamma^floor(t / step_size)
 *   cosine:   min + (base - min) * (1 + cos(pi * t / T)) / 2, t clamped to T
 *             (CosineAnnealingLR stepped once per iteration)
 *   warm-up:  for step < W, base * (step + 1) / W; afterwards the schedule runs
 *             with t = step - W (and T = total_steps - W for cosine). */
float     dt_schedule_lr(const dt_schedule *s, int64_t step);
/* Check a schedule's fields; DT_ERR_INVALID names the bad one. */
dt_status dt_schedule_check(const dt_schedule *s);

/* ---- clipping ------------------------------------------------------------------ */

/* Clip grads (n) to a global L2 norm of at most max_norm as
 * torch.nn.utils.clip_grad_norm_ (scale by max_norm / (norm + 1e-6) when that is
 * below 1); *norm receives the norm before clipping. max_norm <= 0 only
 * measures. The norm comes from the ops' deterministic sum of squares. */
dt_status dt_clip_grad_norm(const dt_ops *ops, float *grads, size_t n, float max_norm, float *norm);

#endif /* DT_OPTIM_H */
