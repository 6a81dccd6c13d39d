/*
 * shm_name.h: names of dtrain's shared-memory segments, which say who made them, and the
 * sweep that removes the segments of dead processes.
 *
 * A segment is named /dtrain-PID-START-PIDNS-TAG: the creator's process id, its start
 * time (clock ticks after boot, field 22 of /proc/PID/stat) and the inode number of its
 * pid namespace (/proc/self/ns/pid), then a tag unique within the process. The tcp
 * backend unlinks a ring as soon as both sides have mapped it, so only a process killed
 * in between (SIGKILL, the OOM killer) leaves one behind; dtrun sweeps after its ranks
 * have exited, and the first rank of a job on each host sweeps at start.
 *
 * The rule: a segment is removed only when its pid namespace is the sweeper's own and no
 * process with its pid and start time is alive there. A segment from another pid
 * namespace (a container sharing /dev/shm) is never touched, since its pid means nothing
 * here; a pid that was reused since is told apart by its start time. /dev/shm is a tmpfs,
 * emptied at boot, so the boot id need not be part of the name: should a /dev/shm survive
 * a reboot, a leftover's creator is dead and its start time no longer matches, so it is
 * removed (or, if a process of the new boot happens to have the same pid and start time,
 * kept, which is safe). Segments of other users cannot be removed (sticky /dev/shm) and
 * are left to their owners' jobs.
 *
 * No dependency on the rest of libdtrain: dtrun compiles this file too.
 */
#ifndef DT_SHM_NAME_H
#define DT_SHM_NAME_H

#include <stddef.h>

#define DT_SHM_NAME_MAX 96      /* bytes of a name, with its NUL */

/* A fresh name for this process ("/dtrain-PID-START-PIDNS-TAG"); 0, or -1 when it does not fit. */
int dt_shm_name_make(char *buf, size_t n, const char *tag);
/* 1 when name (with or without the leading '/') has the form dt_shm_name_make writes. */
int dt_shm_name_ours(const char *name);
/* A directory /dev/shm/dtrain-PID-START-PIDNS-TAG of this process (mode 0700; a node's
 * snapshots, made by dtrun) into path (n bytes); 0, or an errno value. */
int dt_shm_dir_make(char *path, size_t n, const char *tag);
/* Remove such a directory and what it holds; 0, or -1 (a path of another form is never touched). */
int dt_shm_dir_remove(const char *path);
/* Remove the segments in /dev/shm whose creator is dead (see the rule above), and the
 * directories dt_shm_dir_make made; returns how many. */
int dt_shm_sweep(void);

#endif /* DT_SHM_NAME_H */
