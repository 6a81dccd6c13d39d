/*
 * options.c: the rows of dt_train_opts (see options.h) and what is derived from them
 * in the library: the defaults and the text a checkpoint records.
 *
 * Ranges are those of a flag's value; the trainer checks what no range can say (a
 * name among the rows of another table, min_lr against lr, ...) and names the field.
 */
#include "options.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

#define F(name) offsetof(dt_train_opts, name)
#define BIG 9.2e18   /* INT64_MAX as a range's bound */

static const dt_opt_row rows[] = {
    /* ---- model and data ---- */
    {.field = "model", .flag = "--model", .arg = "SPEC", .type = DT_OPT_STR, .off = F(model), .def = "cnn",
     .where = DT_OPT_PLAN, .sec = DT_OPT_SEC_MODEL, .example = "mlp",
     .help = "preset (mlp, cnn, resnet, gpt, gpt2, llama, smollm-135m, llama-1b),\n"
             "a layer list such as 'flatten linear(256) relu linear(10)', or @FILE"},
    {.field = "data", .flag = "--data", .arg = "SPEC", .type = DT_OPT_STR, .off = F(data),
     .def = "/usr/share/datasets/fashion-mnist", .where = DT_OPT_RECORD | DT_OPT_PLAN | DT_OPT_CHECK,
     .sec = DT_OPT_SEC_MODEL, .example = "synthetic:64,1,4,4,3",
     .help = "a directory of IDX files (Fashion-MNIST layout) or of\n"
             "x_train.npy/y_train.npy/x_test.npy/y_test.npy; X,Y[,XT,YT]\n"
             "files; tokens:DIR (llm.c's train.bin and val.bin); or\n"
             "synthetic:N,C,H,W,CLASSES"},
    /* ---- schedule ---- */
    {.field = "epochs", .flag = "--epochs", .arg = "N", .type = DT_OPT_INT, .off = F(epochs), .def = "15", .lo = 1,
     .hi = 1e6, .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_SCHEDULE, .example = "2",
     .help = "passes over the training set"},
    {.field = "max_steps", .flag = "--steps", .arg = "N", .type = DT_OPT_I64, .off = F(max_steps), .def = "0",
     .lo = 0, .hi = BIG, .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_SCHEDULE, .example = "3",
     .help = "stop after N optimizer steps (0: no limit)"},
    {.field = "batch", .flag = "--batch", .arg = "N", .type = DT_OPT_I64, .off = F(batch), .def = "256", .lo = 1,
     .hi = 1 << 24, .where = DT_OPT_PLAN | DT_OPT_CHECK, .sec = DT_OPT_SEC_SCHEDULE, .example = "16",
     .help = "global batch, the same for every world size"},
    {.field = "micro_batches", .flag = "--micro-batches", .arg = "S", .type = DT_OPT_I64, .off = F(micro_batches),
     .def = "0", .lo = 1, .hi = 1 << 20, .where = DT_OPT_PLAN | DT_OPT_CHECK, .sec = DT_OPT_SEC_SCHEDULE, .shown = "",
     .example = "2",
     .help = "split of the global batch; a multiple of the world\n"
             "size (default: the world size). Runs with the same S\n"
             "give bitwise the same weights on 1, 2, 4, ... processes"},
    /* ---- optimizer ---- */
    {.field = "optim", .flag = "--optim", .arg = "NAME", .type = DT_OPT_STR, .off = F(optim), .def = "sgd",
     .where = DT_OPT_PLAN, .sec = DT_OPT_SEC_OPTIM, .example = "adamw",
     .help = "the optimizer, one of"},
    {.field = "lr", .flag = "--lr", .arg = "X", .type = DT_OPT_F64, .off = F(lr), .def = "0.05", .lo = 1e-30,
     .hi = 1e6, .sec = DT_OPT_SEC_OPTIM, .shown = "the optimizer's", .example = "0.02",
     .help = "base learning rate"},
    {.field = "momentum", .flag = "--momentum", .arg = "X", .type = DT_OPT_F64, .off = F(momentum), .def = "0.9",
     .lo = 0, .hi = 1, .sec = DT_OPT_SEC_OPTIM, .example = "0.5", .help = "SGD momentum"},
    {.field = "dampening", .flag = "--dampening", .arg = "X", .type = DT_OPT_F64, .off = F(dampening), .def = "0",
     .lo = 0, .hi = 1, .sec = DT_OPT_SEC_OPTIM, .example = "0.5", .help = "SGD dampening"},
    {.field = "nesterov", .flag = "--nesterov", .type = DT_OPT_ON, .off = F(nesterov), .sec = DT_OPT_SEC_OPTIM,
     .example = "1", .help = "Nesterov momentum"},
    {.field = "beta1", .field2 = "beta2", .flag = "--betas", .arg = "B1,B2", .type = DT_OPT_PAIR, .off = F(beta1),
     .off2 = F(beta2), .def = "0.9,0.999", .lo = 0, .hi = 0.999999999, .sec = DT_OPT_SEC_OPTIM,
     .example = "0.8,0.95", .help = "AdamW's moment decay rates"},
    {.field = "eps", .flag = "--eps", .arg = "X", .type = DT_OPT_F64, .off = F(eps), .def = "1e-08", .lo = 0,
     .hi = 1, .sec = DT_OPT_SEC_OPTIM, .shown = "1e-8", .example = "1e-06", .help = "AdamW's denominator term"},
    {.field = "weight_decay", .flag = "--weight-decay", .arg = "X", .type = DT_OPT_F64, .off = F(weight_decay),
     .def = "0.0005", .lo = 0, .hi = 1e6, .sec = DT_OPT_SEC_OPTIM, .shown = "the optimizer's", .example = "0.001",
     .help = "weight decay"},
    {.field = "schedule", .flag = "--schedule", .arg = "cosine|constant|step", .type = DT_OPT_STR,
     .off = F(schedule), .def = "cosine", .sec = DT_OPT_SEC_OPTIM, .example = "constant",
     .help = "the learning rate over the run"},
    {.field = "step_size", .flag = "--step-size", .arg = "N", .type = DT_OPT_I64, .off = F(step_size), .def = "0",
     .lo = 1, .hi = BIG, .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_OPTIM, .shown = "an epoch", .example = "2",
     .help = "step schedule: steps between decays"},
    {.field = "gamma", .flag = "--gamma", .arg = "X", .type = DT_OPT_F64, .off = F(gamma), .def = "0.1", .lo = 0,
     .hi = 1e6, .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_OPTIM, .example = "0.5",
     .help = "step schedule: the learning rate's factor at each decay"},
    {.field = "warmup", .flag = "--warmup", .arg = "N", .type = DT_OPT_I64, .off = F(warmup), .def = "0", .lo = 0,
     .hi = BIG, .where = DT_OPT_RECORD | DT_OPT_CHECK, .sec = DT_OPT_SEC_OPTIM, .example = "1",
     .help = "linear warm-up steps"},
    {.field = "min_lr", .flag = "--min-lr", .arg = "X", .type = DT_OPT_F64, .off = F(min_lr), .def = "0", .lo = 0,
     .hi = 1e6, .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_OPTIM, .example = "0.001",
     .help = "the learning rate the cosine schedule ends at"},
    {.field = "decay", .flag = "--decay", .arg = "all|matrices", .type = DT_OPT_STR, .off = F(decay), .def = "all",
     .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_OPTIM, .example = "matrices",
     .help = "weight decay on every parameter, or on matrices only (2 or\n"
             "more dimensions, as nanoGPT and llm.c)"},
    {.field = "clip", .flag = "--clip", .arg = "X", .type = DT_OPT_F64, .off = F(clip), .def = "0", .lo = 0,
     .hi = 1e30, .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_OPTIM, .example = "1",
     .help = "clip gradients to global norm X (0: off)"},
    {.field = "loss", .flag = "--loss", .arg = "ce|mse", .type = DT_OPT_STR, .off = F(loss), .def = "ce",
     .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_OPTIM, .example = "mse",
     .help = "ce: cross-entropy over the class labels; mse: mean squared\n"
             "error against one-hot targets (1 at the label's output,\n"
             "0 elsewhere), averaged over all batch x output elements\n"
             "as PyTorch's nn.MSELoss()(out, one_hot(y).float())"},
    /* (a model-and-data row, kept after loss: a resume names differences in row order) */
    {.field = "normalize", .flag = "--normalize", .arg = "auto|standard|unit|none", .type = DT_OPT_STR,
     .off = F(normalize), .def = "auto", .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_MODEL, .example = "unit",
     .help = "input normalisation: auto standardises\n"
             "u8 images with the training set's per-channel mean and\n"
             "std (after scaling to [0,1]) and keeps float data as\n"
             "stored; standard does so for every type; unit only scales\n"
             "u8 to [0,1]; none keeps every value as stored (u8 as\n"
             "0..255). --save records the mean and std"},
    {.field = "label_smoothing", .flag = "--label-smoothing", .arg = "X", .type = DT_OPT_F64,
     .off = F(label_smoothing), .def = "0", .lo = 0, .hi = 0.999999, .where = DT_OPT_RECORD,
     .sec = DT_OPT_SEC_OPTIM, .example = "0.1", .help = "cross-entropy only"},
    {.field = "precision", .flag = "--precision", .arg = "fp32|bf16|fp16", .type = DT_OPT_STR, .off = F(precision),
     .def = "fp32", .where = DT_OPT_RECORD | DT_OPT_PLAN, .sec = DT_OPT_SEC_OPTIM, .example = "bf16",
     .help = "mixed precision as torch.autocast: the inputs of\n"
             "matrix products and convolutions rounded to bf16/fp16,\n"
             "f32 accumulation; norms, softmax, losses, weights and\n"
             "optimizer state f32. fp16 adds dynamic loss scaling as\n"
             "GradScaler (2^16 at first, x0.5 and the step skipped on\n"
             "inf/NaN on any rank, x2 after 2000 good steps)"},
    {.field = "grad_dtype", .flag = "--grad-dtype", .arg = "f32|bf16", .type = DT_OPT_STR, .off = F(grad_dtype),
     .def = "f32", .where = DT_OPT_RECORD, .sec = DT_OPT_SEC_OPTIM, .example = "bf16",
     .help = "all-reduce gradients in bf16 (half the bytes; every\n"
             "sum rounded to bf16, still bitwise world-size invariant)"},
    /* ---- run ---- */
    {.field = "seed", .flag = "--seed", .arg = "N", .type = DT_OPT_U64, .off = F(seed), .def = "0", .lo = 0,
     .hi = BIG, .sec = DT_OPT_SEC_RUN, .example = "7", .help = "initialisation, data order and dropout"},
    {.field = "eval", .flag = "--no-eval", .type = DT_OPT_OFF, .off = F(eval), .def = "1",
     .where = DT_OPT_PLAN | DT_OPT_CHECK, .sec = DT_OPT_SEC_RUN, .example = "0",
     .help = "skip the test-set evaluation after each epoch"},
    {.field = "eval_every", .flag = "--eval-every", .arg = "N", .type = DT_OPT_I64, .off = F(eval_every),
     .def = "0", .lo = 0, .hi = BIG, .sec = DT_OPT_SEC_RUN, .example = "2",
     .help = "also evaluate every N steps (0: after each epoch only)"},
    {.field = "eval_batches", .flag = "--eval-batches", .arg = "K", .type = DT_OPT_I64, .off = F(eval_batches),
     .def = "20", .lo = 1, .hi = 1 << 30, .sec = DT_OPT_SEC_RUN, .example = "2",
     .help = "token data: evaluate on K global batches of fixed windows"},
    {.field = "init_weights", .flag = "--init", .arg = "FILE", .type = DT_OPT_STR, .off = F(init_weights),
     .sec = DT_OPT_SEC_RUN, .example = "w.safetensors",
     .help = "start from the weights in FILE (safetensors with PyTorch\n"
             "names, e.g. a state_dict saved from PyTorch; for a gpt\n"
             "also Hugging Face's GPT-2 names and Conv1D layout); a\n"
             "sharded checkpoint: its index JSON or its directory"},
    {.field = "log_every", .flag = "--log-every", .arg = "N", .type = DT_OPT_INT, .off = F(log_every), .def = "50",
     .lo = 0, .hi = 1 << 30, .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_RUN, .example = "1",
     .help = "progress every N steps"},
    {.field = "rank_stats_every", .flag = "--rank-stats", .arg = "K", .type = DT_OPT_INT,
     .off = F(rank_stats_every), .def = "0", .lo = 0, .hi = 1 << 30, .sec = DT_OPT_SEC_RUN, .example = "1",
     .help = "per-rank step/data/compute/comm times, memory and samples\n"
             "every K steps (0: after each epoch, when distributed)"},
    {.field = "trace", .flag = "--trace", .arg = "FILE", .type = DT_OPT_STR, .off = F(trace),
     .sec = DT_OPT_SEC_RUN, .example = "t.json",
     .help = "write a timeline of every rank's steps (data wait, forward\n"
             "and backward, gradient sums, optimizer) and collectives to\n"
             "FILE as Chrome trace-event JSON (Perfetto, chrome://tracing)"},
    {.field = "trace_steps", .flag = "--trace-steps", .arg = "A:B", .type = DT_OPT_STR, .off = F(trace_steps),
     .sec = DT_OPT_SEC_RUN, .shown = "every step", .example = "2:3",
     .help = "--trace: only steps A to B (1-based, both included; A: from\n"
             "step A to the end)"},
    {.field = "adapt_threads", .flag = "--fixed-threads", .type = DT_OPT_OFF, .off = F(adapt_threads), .def = "1",
     .sec = DT_OPT_SEC_RUN, .example = "0",
     .help = "keep the compute threads at --threads; by default a CPU\n"
             "run uses fewer while other work takes its cores (its\n"
             "CPU time says so and fewer threads step faster) and\n"
             "more again once cores are idle; the bits are the same"},
    {.field = "recompute", .flag = "--recompute", .type = DT_OPT_ON, .off = F(recompute),
     .where = DT_OPT_PLAN, .sec = DT_OPT_SEC_RUN, .example = "1",
     .help = "keep only the inputs of residual blocks from forward to\n"
             "backward and run each block's forward again in backward\n"
             "(activation checkpointing: less memory, the same weights)"},
    {.field = "max_memory", .flag = "--max-memory", .arg = "SIZE", .type = DT_OPT_SIZE, .off = F(max_memory),
     .def = "0", .lo = 1, .hi = BIG, .where = DT_OPT_PLAN, .sec = DT_OPT_SEC_RUN, .shown = "none", .example = "1G",
     .help = "cap each rank's memory as --rank-stats counts it (bytes,\n"
             "or with K, M, G), as a device of that size would: going\n"
             "over it stops the run, saying what was held; --stages\n"
             "auto then cuts by parameters where the work's cut\n"
             "would not fit and that one does"},
    /* ---- checkpoints ---- */
    {.field = "ckpt_dir", .flag = "--checkpoint-dir", .arg = "DIR", .type = DT_OPT_STR, .off = F(ckpt_dir),
     .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_CKPT, .example = "ck",
     .help = "write checkpoints into DIR (at the end, and see below)"},
    {.field = "ckpt_every", .flag = "--checkpoint-every", .arg = "N", .type = DT_OPT_I64, .off = F(ckpt_every),
     .def = "0", .lo = 0, .hi = BIG, .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_CKPT, .shown = "0: only at the end",
     .example = "1", .help = "also every N steps"},
    {.field = "ckpt_keep", .flag = "--keep", .arg = "K", .type = DT_OPT_INT, .off = F(ckpt_keep), .def = "3",
     .lo = 0, .hi = 1 << 30, .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_CKPT, .example = "1",
     .help = "keep the newest K checkpoints (0: all)"},
    {.field = "snapshot_every", .flag = "--snapshot-every", .arg = "K", .type = DT_OPT_I64, .off = F(snapshot_every),
     .def = "-1", .lo = -1, .hi = BIG, .sec = DT_OPT_SEC_CKPT, .shown = "-1: --checkpoint-every, else 50", .example = "10",
     .help = "in an elastic job (dtrun --nnodes MIN:MAX) keep the state\n"
             "in each node's memory every K steps, each shard also on\n"
             "another node, and resume a membership change from it when\n"
             "it is at least as new as the newest checkpoint (0: never)"},
    {.field = "snapshot_dir", .flag = "--snapshot-dir", .arg = "DIR", .type = DT_OPT_STR, .off = F(snapshot_dir),
     .sec = DT_OPT_SEC_CKPT, .shown = "DT_SNAPSHOT_DIR", .example = "/dev/shm/snap",
     .help = "keep the snapshots in DIR, a directory in memory that this\n"
             "node's ranks share (dtrun --nnodes MIN:MAX makes one and\n"
             "sets DT_SNAPSHOT_DIR)"},
    {.field = "resume", .flag = "--resume", .arg = "auto|PATH", .type = DT_OPT_STR, .off = F(resume),
     .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_CKPT, .example = "auto",
     .help = "auto: continue from the newest valid checkpoint in\n"
             "--checkpoint-dir (start fresh if there is none); PATH: a\n"
             "checkpoint directory or one step-* directory in it; the\n"
             "model, data and hyper-parameters must be the recorded ones"},
    {.field = "resume_override", .flag = "--resume-override", .type = DT_OPT_ON, .off = F(resume_override),
     .sec = DT_OPT_SEC_CKPT, .example = "1", .help = "resume although they differ (the changes are printed)"},
    {.field = "stop_at", .flag = "--stop-at", .arg = "N", .type = DT_OPT_I64, .off = F(stop_at), .def = "0",
     .lo = 1, .hi = BIG, .where = DT_OPT_CHECK, .sec = DT_OPT_SEC_CKPT, .shown = "", .example = "1",
     .help = "stop after global step N with a checkpoint, as an\n"
             "interruption would (for time-limited jobs)"},
    /* ---- distributed ---- */
    {.field = "lr_scale", .flag = "--lr-scale", .arg = "none|linear|sqrt", .type = DT_OPT_STR, .off = F(lr_scale),
     .def = "none", .where = DT_OPT_PER_WORLD, .sec = DT_OPT_SEC_DIST, .example = "linear",
     .help = "multiply --lr by W or sqrt(W) (with --warmup),\n"
             "for a global batch that grows with the world size"},
    {.field = "bucket_mb", .flag = "--bucket-mb", .arg = "X", .type = DT_OPT_F64, .off = F(bucket_mb), .def = "25",
     .lo = 1e-6, .hi = 1e6, .sec = DT_OPT_SEC_DIST, .example = "1",
     .help = "gradient bucket size in MiB (the first bucket is 1)"},
    {.field = "overlap", .flag = "--no-overlap", .type = DT_OPT_OFF, .off = F(overlap), .def = "1",
     .sec = DT_OPT_SEC_DIST, .example = "0", .help = "all-reduce gradients after backward, not during it"},
    {.field = "sync_bn", .flag = "--sync-bn", .type = DT_OPT_ON, .off = F(sync_bn), .sec = DT_OPT_SEC_DIST,
     .example = "1", .help = "batchnorm statistics over all ranks (synchronised BN)"},
    {.field = "shard", .flag = "--shard", .arg = "none|optim|grads|params", .type = DT_OPT_STR, .off = F(shard),
     .def = "none", .where = DT_OPT_PLAN, .sec = DT_OPT_SEC_DIST, .example = "optim",
     .help = "ZeRO sharding: optim keeps 1/W of the optimizer\n"
             "state per rank and all-gathers the updated parameters; grads\n"
             "also reduce-scatters the gradients; params (FSDP) keeps 1/W\n"
             "of parameters and gradients too, gathering each layer's\n"
             "parameters just before it runs. Same weights as none"},
    {.field = "shard_unit_mb", .flag = "--shard-unit-mb", .arg = "X", .type = DT_OPT_F64, .off = F(shard_unit_mb),
     .def = "1", .lo = 1e-6, .hi = 1e6, .sec = DT_OPT_SEC_DIST, .example = "0.5",
     .help = "--shard params gathers consecutive layers in units of at\n"
             "least X MiB of parameters (FSDP's wrapping)"},
    {.field = "pipeline", .flag = "--pipeline", .arg = "P", .type = DT_OPT_INT, .off = F(pipeline), .def = "1",
     .lo = 1, .hi = 1024, .where = DT_OPT_LAYOUT | DT_OPT_PLAN, .sec = DT_OPT_SEC_DIST, .example = "2",
     .help = "cut the model's top-level modules into P stages on P\n"
             "ranks (pipeline parallelism); the world is P x replicas,\n"
             "rank r runs stage r % P. Same weights as one process"},
    {.field = "pipeline_schedule", .flag = "--pipeline-schedule", .arg = "1f1b|gpipe|interleaved", .type = DT_OPT_STR,
     .off = F(pipeline_schedule), .def = "1f1b", .where = DT_OPT_LAYOUT | DT_OPT_PLAN, .sec = DT_OPT_SEC_DIST,
     .example = "gpipe",
     .help = "--pipeline: the order of each stage's forwards and\n"
             "backwards (1f1b holds at most P micro-batches' inputs,\n"
             "gpipe all of them; interleaved runs V chunks a stage)"},
    {.field = "virtual_stages", .flag = "--virtual-stages", .arg = "V", .type = DT_OPT_INT, .off = F(virtual_stages),
     .def = "1", .lo = 1, .hi = 64, .where = DT_OPT_LAYOUT | DT_OPT_PLAN, .sec = DT_OPT_SEC_DIST, .example = "2",
     .help = "--pipeline-schedule interleaved: cut the model into\n"
             "P x V chunks, stage s running chunks s, s + P, ...\n"
             "(the bubble shrinks V times)"},
    {.field = "stages", .flag = "--stages", .arg = "auto|params|A-B,C-D,...", .type = DT_OPT_STR, .off = F(stages),
     .def = "auto", .where = DT_OPT_LAYOUT | DT_OPT_PLAN, .sec = DT_OPT_SEC_DIST, .example = "0-1,2-3",
     .help = "--pipeline: the top-level modules of each stage, by\n"
             "index (auto: balanced by their compute; params: by\n"
             "the parameters each stage owns, for memory)"},
    {.field = "schedule_dump", .flag = "--schedule-dump", .type = DT_OPT_ON, .off = F(schedule_dump),
     .where = DT_OPT_LAYOUT, .sec = DT_OPT_SEC_DIST, .example = "1", .help = "--pipeline: print each stage's actions at the start"},
    {.field = "backward_prefetch", .flag = "--backward-prefetch", .arg = "pre|post", .type = DT_OPT_STR,
     .off = F(backward_prefetch), .def = "pre", .where = DT_OPT_PLAN, .sec = DT_OPT_SEC_DIST, .example = "post",
     .help = "--shard params: backward gathers the next unit\n"
             "while the current one runs (pre: three units beyond the\n"
             "shard at most) or after it (post: two, less overlap)"},
};

#define NROWS ((int)(sizeof rows / sizeof rows[0]))

static const struct { const char *name, *intro; } sections[DT_OPT_NSEC] = {
    [DT_OPT_SEC_MODEL] = {"Model and data", ""},
    [DT_OPT_SEC_SCHEDULE] = {"Schedule", ""},
    [DT_OPT_SEC_OPTIM] = {"Optimizer", ""},
    [DT_OPT_SEC_RUN] = {"Run", ""},
    [DT_OPT_SEC_CKPT] = {"Checkpoints",
                         "(a directory per step: model.safetensors + train_state.safetensors,\n"
                         "written atomically; a resumed run is bitwise the uninterrupted one,\n"
                         "also on another world size)"},
    [DT_OPT_SEC_DIST] = {"Distributed (when started by a launcher)", ""},
};

const dt_opt_row *dt_train_options(int *n) {
    if (n) *n = NROWS;
    return rows;
}

const dt_opt_row *dt_train_option_field(const char *field) {
    for (int i = 0; i < NROWS; i++)
        if (!strcmp(rows[i].field, field) || (rows[i].field2 && !strcmp(rows[i].field2, field))) return &rows[i];
    return NULL;
}

const dt_opt_row *dt_train_option_flag(const char *flag) {
    for (int i = 0; i < NROWS; i++)
        if (!strcmp(rows[i].flag, flag)) return &rows[i];
    return NULL;
}

const char *dt_opt_section_name(dt_opt_section sec) {
    return (unsigned)sec < DT_OPT_NSEC ? sections[sec].name : "?";
}

const char *dt_opt_section_intro(dt_opt_section sec) {
    return (unsigned)sec < DT_OPT_NSEC ? sections[sec].intro : "";
}

void dt_opt_set_default(const dt_opt_row *r, void *base) {
    char *p = (char *)base + r->off;
    const char *d = r->def;
    switch (r->type) {
    case DT_OPT_STR: *(const char **)p = d; break;
    case DT_OPT_INT: case DT_OPT_ON: case DT_OPT_OFF: *(int *)p = d ? atoi(d) : 0; break;
    case DT_OPT_I64: *(int64_t *)p = d ? strtoll(d, NULL, 10) : 0; break;
    case DT_OPT_U64: *(uint64_t *)p = d ? strtoull(d, NULL, 10) : 0; break;
    case DT_OPT_SIZE: *(size_t *)p = d ? (size_t)strtoull(d, NULL, 10) : 0; break;
    case DT_OPT_F64: *(double *)p = d ? strtod(d, NULL) : 0.0; break;
    case DT_OPT_PAIR: {
        char *end = NULL;
        *(double *)p = d ? strtod(d, &end) : 0.0;
        *(double *)((char *)base + r->off2) = end && *end == ',' ? strtod(end + 1, NULL) : 0.0;
        break;
    }
    }
}

const char *dt_opt_text(const dt_opt_row *r, const void *base, char *buf, size_t n) {
    const char *p = (const char *)base + r->off;
    switch (r->type) {
    case DT_OPT_STR: return *(const char *const *)p ? *(const char *const *)p : "";
    case DT_OPT_INT: case DT_OPT_ON: case DT_OPT_OFF: snprintf(buf, n, "%d", *(const int *)p); break;
    case DT_OPT_I64: snprintf(buf, n, "%lld", (long long)*(const int64_t *)p); break;
    case DT_OPT_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case DT_OPT_SIZE: snprintf(buf, n, "%zu", *(const size_t *)p); break;
    case DT_OPT_F64: snprintf(buf, n, "%.9g", *(const double *)p); break;
    case DT_OPT_PAIR:
        snprintf(buf, n, "%.9g,%.9g", *(const double *)p, *(const double *)((const char *)base + r->off2));
        break;
    }
    return buf;
}

void dt_train_opts_default(dt_train_opts *o) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < NROWS; i++) dt_opt_set_default(&rows[i], o);
}
