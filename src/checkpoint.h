/*
 * checkpoint.h: model weights to and from safetensors files.
 *
 * The file holds the model's state_dict under PyTorch's names ("0.weight",
 * "1.running_mean", "1.num_batches_tracked" as I64) with no wrapper prefix, so
 * `model.load_state_dict(safetensors.torch.load_file(path))` works on the
 * equivalent nn.Sequential, and back. Files are written atomically (temporary
 * file, fsync, rename, fsync of the directory: DESIGN.md rule 4) and verified on
 * load: a tensor that is missing, of another shape or dtype, or a truncated or
 * corrupt file gives an error naming the file and the first mismatched tensor.
 */
#ifndef DT_CHECKPOINT_H
#define DT_CHECKPOINT_H

#include "model.h"
#include "status.h"

/* Write the model's state (parameters and buffers) to path, with metadata
 * key/value pairs (meta may be NULL; nmeta pairs as {k0, v0, k1, v1, ...}). */
dt_status dt_model_save(dt_model *m, const char *path, const char *const *meta, int nmeta);

/* Load weights saved by dt_model_save (or by PyTorch's safetensors) into m. */
dt_status dt_model_load(dt_model *m, const char *path);

#endif /* DT_CHECKPOINT_H */
