/*
 * shm_name.c: segment names that identify their creator, and the sweep of dead
 * creators' segments (see shm_name.h for the rule).
 */
#include "config.h"
#include "shm_name.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm"

/* Start time of process pid (clock ticks after boot), or 0 when /proc does not say. */
static unsigned long long start_time(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    /* the command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')' */
    const char *p = strrchr(buf, ')');
    unsigned long long t = 0;
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                     &t) != 1)
        return 0;
    return t;
}

/* Inode number of this process's pid namespace, or 0 when unknown. */
static unsigned long long pid_ns(void) {
    char link[64];
    ssize_t n = readlink("/proc/self/ns/pid", link, sizeof link - 1);
    if (n <= 0) return 0;
    link[n] = '\0';
    unsigned long long ino = 0;
    if (sscanf(link, "pid:[%llu]", &ino) != 1) return 0;
    return ino;
}

int dt_shm_name_make(char *buf, size_t n, const char *tag) {
    int pid = (int)getpid();
    int k = snprintf(buf, n, "/dtrain-%d-%llu-%llu-%s", pid, start_time(pid), pid_ns(), tag);
    return k > 0 && (size_t)k < n && (size_t)k < DT_SHM_NAME_MAX ? 0 : -1;
}

/* Parse "dtrain-PID-START-PIDNS-TAG"; 0 on success. */
static int parse(const char *name, int *pid, unsigned long long *start, unsigned long long *ns) {
    if (*name == '/') name++;
    int used = 0;
    if (sscanf(name, "dtrain-%d-%llu-%llu-%n", pid, start, ns, &used) != 3 || used == 0 || !name[used] || *pid <= 0)
        return -1;
    for (const char *p = name + strlen("dtrain-"); p < name + used; p++)
        if (!(*p == '-' || (*p >= '0' && *p <= '9'))) return -1;   /* no signs, no spaces */
    return 0;
}

int dt_shm_name_ours(const char *name) {
    int pid;
    unsigned long long start, ns;
    return parse(name, &pid, &start, &ns) == 0;
}

/* The creator is alive: a process with its pid exists (kill(0) does not say ESRCH; a
 * zombie counts, it is reaped soon) and, where /proc tells, started when the creator did. */
static int creator_alive(int pid, unsigned long long start) {
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    unsigned long long now = start_time(pid);
    return now == 0 || start == 0 || now == start;
}

/* Remove directory name under dfd and what it holds, at most 3 levels below it (a node's
 * snapshots: step-* directories of files, and their temporary ones). 0, or -1. */
static int rm_dir_at(int dfd, const char *name, int depth) {
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -1;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(fd, e->d_name, 0) != 0 && errno == EISDIR && depth < 3) rm_dir_at(fd, e->d_name, depth + 1);
    }
    closedir(d);
    return unlinkat(dfd, name, AT_REMOVEDIR);
}

int dt_shm_dir_make(char *path, size_t n, const char *tag) {
    char name[DT_SHM_NAME_MAX];
    if (dt_shm_name_make(name, sizeof name, tag) != 0) return ENAMETOOLONG;
    int k = snprintf(path, n, "%s%s", SHM_DIR, name);
    if (k < 0 || (size_t)k >= n) return ENAMETOOLONG;
    return mkdir(path, 0700) == 0 ? 0 : errno;
}

int dt_shm_dir_remove(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash || strncmp(path, SHM_DIR "/", strlen(SHM_DIR) + 1) != 0 || !dt_shm_name_ours(slash + 1)) return -1;
    int dfd = open(SHM_DIR, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -1;
    int rc = rm_dir_at(dfd, slash + 1, 0);
    close(dfd);
    return rc;
}

int dt_shm_sweep(void) {
    unsigned long long my_ns = pid_ns();
    if (!my_ns) return 0;                       /* cannot tell namespaces apart: touch nothing */
    DIR *d = opendir(SHM_DIR);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int pid;
        unsigned long long start, ns;
        if (strncmp(e->d_name, "dtrain-", 7) != 0 || parse(e->d_name, &pid, &start, &ns) != 0) continue;
        if (ns != my_ns || creator_alive(pid, start)) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0 || (errno == EISDIR && rm_dir_at(dirfd(d), e->d_name, 0) == 0))
            removed++;
    }
    closedir(d);
    return removed;
}
