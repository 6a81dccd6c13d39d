/*
 * checkpoint.h: model weights to and from safetensors files.
 *
 * The file holds the model's state_dict under PyTorch's names ("0.weight",
 * "1.running_mean", "1.num_batches_tracked" as I64) with no wrapper prefix, so
 * `model.load_state_dict(safetensors.torch.load_file(path))` works on the
 * equivalent nn.Sequential, and back. Files are written atomically (temporary
 * file, fsync, rename, fsync of the directory: docs/DESIGN.md rule 4) and verified on
 * load: a tensor that is missing, of another shape or dtype, or a truncated or
 * corrupt file gives an error naming the file and the first mismatched tensor.
 */
#ifndef DT_CHECKPOINT_H
#define DT_CHECKPOINT_H

#include "model.h"
#include "safetensors.h"
#include "status.h"

/* Write the model's state (parameters and buffers) to path, with metadata
 * key/value pairs (meta may be NULL; nmeta pairs as {k0, v0, k1, v1, ...}). */
DT_API dt_status dt_model_save(dt_model *m, const char *path, const char *const *meta, int nmeta);

/* Load weights saved by dt_model_save (or by PyTorch's safetensors) into m. A file
 * whose names or shapes do not match directly is read as Hugging Face's GPT-2 writes
 * it (transformers' GPT2Model / GPT2LMHeadModel): names without "transformer.",
 * Conv1D weights [in, out] transposed into nn.Linear's [out, in], the attn.bias and
 * attn.masked_bias buffers skipped, a tied weight under one of its names. path may
 * also be a sharded checkpoint's index (a name ending in .json, read with
 * dt_st_open_index) or a directory holding model.safetensors or, failing that,
 * model.safetensors.index.json; errors then name the file read. */
DT_API dt_status dt_model_load(dt_model *m, const char *path);

/* ---- building blocks (shared with the training checkpoints of ckpt.h) ---- */

/* Add each tensor of the model's state to w, in state_dict order (*nbytes: the file's
 * data region, their bytes end to end). Tensors in host memory are written from where
 * they are; those in device memory are copied first to one malloc'd host buffer *host
 * (NULL when none is): free it after the write. */
DT_API dt_status dt_model_state_add(dt_model *m, dt_st_writer *w, void **host, size_t *nbytes);
/* Check that f holds exactly the model's state (names, dtypes, shapes); the
 * error names label and the first mismatched tensor. Changes nothing. */
DT_API dt_status dt_model_state_check(dt_model *m, const dt_st_file *f, const char *label);
/* Copy f's tensors into the model (after dt_model_state_check). */
DT_API dt_status dt_model_state_copy(dt_model *m, const dt_st_file *f);

/* The same over a part of the state: all of it, or only the tensors outside the
 * parameter array (buffers and counters: a sharded checkpoint keeps the parameters in
 * its shard files, ckpt.h). */
typedef enum { DT_STATE_ALL, DT_STATE_BUFFERS } dt_state_part;
DT_API dt_status dt_model_state_add_part  (dt_model *m, dt_state_part part, dt_st_writer *w, void **host,
                                           size_t *nbytes);
DT_API dt_status dt_model_state_check_part(dt_model *m, dt_state_part part, const dt_st_file *f, const char *label);
DT_API dt_status dt_model_state_copy_part (dt_model *m, dt_state_part part, const dt_st_file *f);

#endif /* DT_CHECKPOINT_H */
