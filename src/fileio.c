/*
 * fileio.c: checked reads with 64-bit offsets, and atomic file writes
 * (see fileio.h for the sequence and why each step is there).
 */
#define _FILE_OFFSET_BITS 64 /* 64-bit off_t for files over 2 GiB on 32-bit hosts */
#include "config.h"

#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading --------------------------------------------------------------- */

dt_status dt_file_open_read(const char *path, int *fd, int64_t *size) {
    *fd = -1;
    *size = 0;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever;
     * the check below refuses anything but a regular file, then blocking reads resume */
    int d = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (d < 0) return dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(d, &st) != 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(d);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        close(d);
        return dt_error(DT_ERR_IO, "%s: not a regular file%s", path, S_ISDIR(st.st_mode) ? " (a directory)" : "");
    }
    int fl = fcntl(d, F_GETFL);
    if (fl < 0 || fcntl(d, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot set blocking reads: %s", path, strerror(errno));
        close(d);
        return s;
    }
    *fd = d;
    *size = (int64_t)st.st_size;
    return DT_OK;
}

dt_status dt_file_fopen_read(const char *path, FILE **out) {
    int fd;
    int64_t size;
    *out = NULL;
    DT_TRY(dt_file_open_read(path, &fd, &size));
    if (!(*out = fdopen(fd, "r"))) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    return DT_OK;
}

dt_status dt_file_pread(int fd, const char *path, void *buf, size_t n, int64_t off) {
    unsigned char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR) continue;
            return dt_error(DT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        }
        if (r == 0)
            return dt_error(DT_ERR_FORMAT, "%s: truncated: %zu bytes missing at offset %lld", path, n, (long long)off);
        p += r;
        n -= (size_t)r;
        off += r;
    }
    return DT_OK;
}

/* ---- atomic writing -------------------------------------------------------- */

struct dt_afile {
    char *path, *tmp;   /* tmp NULL: written in place (dt_afile_open_over) */
    int   fd;
    off_t at;           /* bytes written */
};

/* The process's umask without changing it (umask(2) can only set it, which would
 * race with other threads creating files): Linux reports it in /proc/self/status. */
static mode_t process_umask(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned m = 022;
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        found = sscanf(line, "Umask: %o", &m) == 1;
    if (f) fclose(f);
    if (!found) {            /* an old kernel: read it the racy way, once */
        mode_t old = umask(022);
        umask(old);
        m = old;
    }
    return (mode_t)(m & 0777);
}

dt_status dt_afile_open(const char *path, dt_afile **out) {
    *out = NULL;
    if (!path || !*path) return dt_error(DT_ERR_INVALID, "atomic write: empty path");
    dt_afile *f = calloc(1, sizeof *f);
    size_t n = strlen(path);
    if (f) {
        f->path = strdup(path);
        f->tmp = malloc(n + 16);
    }
    if (!f || !f->path || !f->tmp) {
        if (f) {
            free(f->path);
            free(f->tmp);
        }
        free(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    /* Beside the target, so the rename stays within one filesystem. */
    snprintf(f->tmp, n + 16, "%s.tmp.XXXXXX", path);
    f->fd = mkostemp(f->tmp, O_CLOEXEC);
    if (f->fd < 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot create a temporary file beside it: %s", path, strerror(errno));
        free(f->path);
        free(f->tmp);
        free(f);
        return s;
    }
    /* mkostemp made it 0600; give it the mode open(O_CREAT, 0666) would under the umask */
    if (fchmod(f->fd, 0666 & ~process_umask()) != 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot set the mode of %s: %s", path, f->tmp, strerror(errno));
        dt_afile_abort(f);
        return s;
    }
    *out = f;
    return DT_OK;
}

dt_status dt_afile_write(dt_afile *f, const void *buf, size_t n) {
    const unsigned char *p = buf;
    while (n) {
        ssize_t w = write(f->fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dt_error(DT_ERR_IO, "%s: write failed: %s", f->path, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
        f->at += (off_t)w;
    }
    return DT_OK;
}

void dt_afile_abort(dt_afile *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    unlink(f->tmp ? f->tmp : f->path);
    free(f->path);
    free(f->tmp);
    free(f);
}

dt_status dt_afile_commit(dt_afile *f) {
    if (!f->tmp && ftruncate(f->fd, f->at) != 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot cut it to %lld bytes: %s", f->path, (long long)f->at,
                               strerror(errno));
        dt_afile_abort(f);
        return s;
    }
    if (fsync(f->fd) != 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: fsync failed: %s", f->path, strerror(errno));
        dt_afile_abort(f);
        return s;
    }
    int rc = close(f->fd);
    f->fd = -1;
    if (rc != 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: close failed: %s", f->path, strerror(errno));
        dt_afile_abort(f);
        return s;
    }
    if (!f->tmp) {   /* in place: the directory's rename is the atomic step, not ours */
        free(f->path);
        free(f);
        return DT_OK;
    }
    if (rename(f->tmp, f->path) != 0) {
        dt_status s = dt_error(DT_ERR_IO, "%s: cannot rename %s over it: %s", f->path, f->tmp, strerror(errno));
        dt_afile_abort(f);
        return s;
    }
    /* The rename is durable only once the directory entry is on disk. */
    char *d = strdup(f->path);
    dt_status s = DT_OK;
    if (!d) s = dt_error(DT_ERR_NOMEM, "%s: out of memory", f->path);
    if (s == DT_OK) {
        int dfd = open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) s = dt_error(DT_ERR_IO, "%s: cannot open its directory to fsync: %s", f->path, strerror(errno));
        else {
            if (fsync(dfd) != 0 && errno != EINVAL)
                s = dt_error(DT_ERR_IO, "%s: fsync of its directory failed: %s", f->path, strerror(errno));
            close(dfd);
        }
    }
    free(d);
    free(f->path);
    free(f->tmp);
    free(f);
    return s;
}

dt_status dt_afile_open_over(const char *path, const char *from, dt_afile **out) {
    *out = NULL;
    /* a regular file only (a link or anything else stays where it is: a fresh file then) */
    struct stat st;
    if (!from || !path || !*path || lstat(from, &st) != 0 || !S_ISREG(st.st_mode) || rename(from, path) != 0)
        return dt_afile_open(path, out);
    dt_afile *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dt_error(DT_ERR_NOMEM, "%s: out of memory", path);
    }
    f->fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (f->fd < 0) {
        free(f->path);
        free(f);
        return dt_afile_open(path, out);
    }
    *out = f;
    return DT_OK;
}

dt_status dt_write_over(const char *path, const char *from, const void *buf, size_t n) {
    dt_afile *f;
    DT_TRY(dt_afile_open_over(path, from, &f));
    dt_status s = dt_afile_write(f, buf, n);
    if (s != DT_OK) {
        dt_afile_abort(f);
        return s;
    }
    return dt_afile_commit(f);
}

dt_status dt_write_atomic(const char *path, const void *buf, size_t n) { return dt_write_over(path, NULL, buf, n); }

