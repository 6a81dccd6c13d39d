/*
 * optim.h: optimizers (SGD, AdamW), learning-rate schedules and gradient
 * clipping, with PyTorch's semantics so a run can be compared with the peer
 * script step by step.
 *
 * An optimizer kind is one row of a table (dt_optim_def): its name, help line,
 * state arrays and their PyTorch names, defaults, argument check and step.
 * Everything that deals with optimizers reads the row: the trainer's --optim
 * lookup, `dtrain train --help`, and the checkpoints, which record the
 * optimizer by its row's name. Adding an optimizer is one row in optim.c (and
 * its enum value here) plus its fused update kernel in the dt_ops table.
 *
 * Optimizers update the model's flat parameter array with one fused kernel
 * from the dt_ops table; their state (momentum buffer, or AdamW's two moments,
 * plus the step count) lives in flat arrays of the same layout, exposed for
 * checkpoints. Weight decay applies to every parameter, as PyTorch does by
 * default, or to chosen runs of the array (dt_optim_set_decay_runs).
 */
#ifndef DT_OPTIM_H
#define DT_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "status.h"

/* ---- optimizer kinds: the rows ------------------------------------------------- */

/* One value per row of the table in optim.c (a _Static_assert ties the two). */
typedef enum { DT_OPTIM_SGD, DT_OPTIM_ADAMW, DT_OPTIM_COUNT } dt_optim_kind;

#define DT_OPTIM_MAX_STATE 2   /* state arrays of the row that keeps the most */

/* The hyper-parameters of every kind; a row reads those it names in hparams. */
typedef struct {
    dt_optim_kind kind;
    float lr;                 /* base learning rate (schedules scale from it) */
    float weight_decay;       /* SGD: L2 added to the gradient; AdamW: decoupled */
    /* DT_OPTIM_HP_MOMENTUM */
    float momentum, dampening;
    int   nesterov;
    /* DT_OPTIM_HP_BETAS, DT_OPTIM_HP_EPS */
    float beta1, beta2, eps;
} dt_optim_config;

/* Bits of dt_optim_def.hparams: the groups of fields beyond lr and weight_decay. */
#define DT_OPTIM_HP_MOMENTUM 1u   /* momentum, dampening, nesterov */
#define DT_OPTIM_HP_BETAS    2u   /* beta1, beta2 */
#define DT_OPTIM_HP_EPS      4u   /* eps */

/* What a row's step function is handed. */
typedef struct {
    float        *params;         /* (n), updated in place */
    const float  *grads;          /* (n) */
    float *const *state;          /* the state arrays of (n) floats: state[i] for i < nstate_of(config) */
    size_t        n;
    float         lr;             /* this step's learning rate (from the schedule) */
    float         grad_scale;     /* multiplies the gradient first (1 = none) */
    int64_t       steps_done;     /* steps taken before this one: 0 on the first */
    const float  *gate;           /* NULL, or a device float: 0 there and the kernel does nothing */
} dt_optim_step_args;

/* One optimizer kind. */
typedef struct {
    const char *name;             /* "sgd": --optim NAME, and the name a checkpoint records */
    const char *help;             /* one line for `dtrain train --help` */
    int         nstate;           /* state arrays (n floats each) it may keep, <= DT_OPTIM_MAX_STATE */
    const char *state_names[DT_OPTIM_MAX_STATE];  /* their names in PyTorch's optimizer state */
    unsigned    hparams;          /* DT_OPTIM_HP_* groups it reads */
    dt_optim_config defaults;     /* PyTorch's constructor defaults (lr set by the caller) */
    double      train_lr;         /* `dtrain train`'s learning rate when --lr is not given */
    double      train_weight_decay; /* and its weight decay when --weight-decay is not given */
    /* State arrays a configuration keeps (SGD without momentum keeps none); NULL: nstate. */
    int       (*nstate_of)(const dt_optim_config *c);
    /* PyTorch's argument checks beyond lr >= 0 and weight_decay >= 0 (done for every
     * row); DT_ERR_INVALID naming the field. */
    dt_status (*check)(const dt_optim_config *c);
    /* One update through the row's fused kernel of ops. */
    dt_status (*step)(const dt_ops *ops, const dt_optim_config *c, const dt_optim_step_args *a);
} dt_optim_def;

DT_API const dt_optim_def *dt_optim_def_of(dt_optim_kind kind);   /* the row; NULL if kind is not one */
DT_API const dt_optim_def *dt_optim_find(const char *name);       /* the row named name; NULL if none */
/* The row names, "sgd, adamw", into buf (always terminated); returns buf. */
DT_API const char         *dt_optim_names(char *buf, size_t n);
/* The row's defaults with learning rate lr (PyTorch's: torch.optim.SGD(params, lr)
 * has momentum 0; AdamW has betas (0.9, 0.999), eps 1e-8, weight decay 0.01). */
DT_API dt_optim_config     dt_optim_defaults(dt_optim_kind kind, float lr);
/* The state arrays (n floats each) an optimizer of this configuration keeps (its row's
 * nstate_of): what dt_optim_init allocates, for memory plans. */
DT_API int                 dt_optim_nstate_of(const dt_optim_config *c);

/* A hyper-parameter field, for code that stores configurations by name
 * (checkpoints write "dtrain.optim.<name>" for each one, in this order). */
typedef struct {
    const char *name;             /* "lr", "momentum", "nesterov", ... */
    size_t      offset;           /* offsetof(dt_optim_config, field) */
    int         is_int;           /* 1: an int field, 0: a float field */
} dt_optim_hparam;

DT_API const dt_optim_hparam *dt_optim_hparams(int *count);

/* ---- optimizers ------------------------------------------------------------------ */

typedef struct dt_optim dt_optim;

/* An optimizer over n parameters with state allocated from ops. Checks the
 * hyper-parameters as PyTorch does (the row's check). */
DT_API dt_status dt_optim_init(const dt_optim_config *cfg, const dt_ops *ops, size_t n, dt_optim **out);
DT_API void      dt_optim_free(dt_optim *o);
/* Weight decay on some parameters only (nanoGPT and llm.c decay the matrices, not the
 * biases and norms): the flat array is cut into nruns runs [bounds[i], bounds[i+1])
 * (bounds[0] = 0, bounds[nruns] = n), run i decayed when decay[i]; steps then update
 * run by run, the others with weight decay 0. nruns 0: every parameter (the default). */
DT_API dt_status dt_optim_set_decay_runs(dt_optim *o, const size_t *bounds, const unsigned char *decay, size_t nruns);
/* One step: params (n) -= update(grads (n) * grad_scale) at learning rate lr. */
DT_API dt_status dt_optim_step(dt_optim *o, float *params, const float *grads, float lr, float grad_scale);

/* State for checkpoints: nstate flat device arrays of n floats (SGD with
 * momentum: momentum_buffer; AdamW: exp_avg, exp_avg_sq; SGD without momentum:
 * none), their PyTorch names, and the number of steps taken. */
DT_API const dt_optim_def *dt_optim_def_in(const dt_optim *o);   /* the optimizer's row */
DT_API int         dt_optim_nstate(const dt_optim *o);
DT_API float      *dt_optim_state(dt_optim *o, int i);
DT_API const char *dt_optim_state_name(const dt_optim *o, int i);
DT_API size_t      dt_optim_size(const dt_optim *o);
DT_API int64_t     dt_optim_steps(const dt_optim *o);
DT_API void        dt_optim_set_steps(dt_optim *o, int64_t steps);   /* after loading the state arrays */
/* A device float every later step reads first (ops.h step_checks' out[2]): where it is 0
 * the update kernels leave everything as it was (the caller, which learns so at the end
 * of the step, stops; the step count still moves). NULL: none (the default). */
DT_API void        dt_optim_set_gate(dt_optim *o, const float *gate);
DT_API const dt_optim_config *dt_optim_config_of(const dt_optim *o);

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
DT_API float     dt_schedule_lr(const dt_schedule *s, int64_t step);
/* Check a schedule's fields; DT_ERR_INVALID names the bad one. */
DT_API dt_status dt_schedule_check(const dt_schedule *s);

/* ---- clipping ------------------------------------------------------------------ */

/* Clip grads (n) to a global L2 norm of at most max_norm as
 * torch.nn.utils.clip_grad_norm_ (scale by max_norm / (norm + 1e-6) when that is
 * below 1); *norm receives the norm before clipping. max_norm <= 0 only
 * measures. The norm comes from the ops' deterministic sum of squares. */
DT_API dt_status dt_clip_grad_norm(const dt_ops *ops, float *grads, size_t n, float max_norm, float *norm);
/* The same for gradients that are `unscale` (a power of two, 1/the loss scale) times too
 * large, as GradScaler's unscale_ followed by clip_grad_norm_: the norm is measured on
 * grads and multiplied by unscale (exact), the clipping factor comes from that true norm,
 * and the unscaling itself is left to the optimizer step (its grad_scale). */
DT_API dt_status dt_clip_grad_norm_scaled(const dt_ops *ops, float *grads, size_t n, float max_norm, float unscale,
                                          float *norm);

#endif /* DT_OPTIM_H */
