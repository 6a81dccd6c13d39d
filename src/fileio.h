/*
 * fileio.h: checked file reading and atomic file writing, shared by the
 * dataset readers, safetensors and checkpoints.
 *
 * Atomic writes keep docs/DESIGN.md rule 4: the bytes go to a temporary file in
 * the same directory (so the rename cannot cross filesystems), which is
 * fsynced, renamed over the target, and then the directory is fsynced so the
 * rename itself survives a crash. At every moment the target is either the
 * old file or the complete new one.
 */
#ifndef DT_FILEIO_H
#define DT_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef struct dt_afile dt_afile;

/* ---- reading -------------------------------------------------------------- */
/* Open a regular file read-only; *size is its length. DT_ERR_IO naming path. */
DT_API dt_status dt_file_open_read(const char *path, int *fd, int64_t *size);
/* The same as a stdio stream (a FIFO or device is refused, never waited on). */
DT_API dt_status dt_file_fopen_read(const char *path, FILE **out);
/* Exactly n bytes at offset off (64-bit); a short read is DT_ERR_FORMAT (truncated). */
DT_API dt_status dt_file_pread(int fd, const char *path, void *buf, size_t n, int64_t off);

/* ---- atomic writing ------------------------------------------------------- */
/* Start writing path: the bytes go to path.tmp.XXXXXX beside it. */
DT_API dt_status dt_afile_open(const char *path, dt_afile **out);
DT_API dt_status dt_afile_write(dt_afile *f, const void *buf, size_t n);
/* fsync, rename over path, fsync the directory; frees f whatever happens. */
DT_API dt_status dt_afile_commit(dt_afile *f);
/* Drop the temporary file; path is left as it was. */
DT_API void      dt_afile_abort(dt_afile *f);
/* The whole of it in one call. */
DT_API dt_status dt_write_atomic(const char *path, const void *buf, size_t n);

/* Writing over a file whose memory is reused: for a path in a directory nobody reads
 * until the whole directory is renamed into place (a checkpoint's temporary directory,
 * where the rename is the atomic step). When `from` exists it is moved to path and
 * overwritten in place (its pages, on tmpfs its memory, are reused: no fresh pages to
 * clear, none to free); the commit cuts it to the bytes written and fsyncs it, with no
 * rename. When `from` is NULL or missing, the same as dt_afile_open. */
DT_API dt_status dt_afile_open_over(const char *path, const char *from, dt_afile **out);
DT_API dt_status dt_write_over(const char *path, const char *from, const void *buf, size_t n);

#endif /* DT_FILEIO_H */
