/*
 * dtrain.h: the public interface of libdtrain, one header to include.
 *
 *   status.h       errors: dt_status, dt_last_error() (and dt_api.h: DT_API, the
 *                  mark of every function libdtrain exports)
 *   dtype.h        element types (one table: sizes, names in each file format),
 *                  f16/bf16 conversions
 *   hash.h         XXH64 and the counter-based dt_hash_u64
 *   comm.h         communicators and collectives (tcp, mpi, nccl backends)
 *   launch_env.h   rank discovery from dtrun, torchrun, Open MPI, MPICH, Slurm
 *   ops.h          the compute interface (one table of kernels per device)
 *   mem.h          memory accounting: bytes held by category, now and at peak
 *   tensor.h       thin tensors over a device
 *   rng.h          counter-based random numbers (Philox4x32-10)
 *   nn.h           layers
 *   model.h        the model spec language, parameters, forward and backward
 *   optim.h        optimizer rows (SGD, AdamW), learning-rate schedules, clipping
 *   data.h         datasets (IDX, NPY, synthetic) and the prefetching loader
 *   sampler.h      the world-size-invariant sampler
 *   safetensors.h  safetensors files (and fileio.h: atomic writes)
 *   checkpoint.h   model weights to and from safetensors
 *   ddp.h          distributed data parallelism for one model
 *   shard.h        ZeRO sharding of optimizer state and gradients
 *   train.h        the training loop
 *   options.h      the train options as rows: defaults, flags, help, what a resume must match
 *   pipeline.h     pipeline schedules (GPipe, 1F1B) as per-stage action lists, and their check
 *   amp.h          mixed precision: --precision and --grad-dtype, the fp16 loss scaler
 */
#ifndef DTRAIN_H
#define DTRAIN_H

#include "status.h"
#include "dtype.h"
#include "hash.h"
#include "comm.h"
#include "launch_env.h"
#include "ops.h"
#include "mem.h"
#include "tensor.h"
#include "rng.h"
#include "nn.h"
#include "model.h"
#include "optim.h"
#include "data.h"
#include "sampler.h"
#include "safetensors.h"
#include "checkpoint.h"
#include "ddp.h"
#include "shard.h"
#include "train.h"
#include "options.h"
#include "pipeline.h"
#include "amp.h"

#endif /* DTRAIN_H */
