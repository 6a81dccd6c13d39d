/*
 * mpi_boot.h: the tcp backend's rendezvous through MPI, for `mpirun -np N prog` with no
 * MASTER_ADDR / MASTER_PORT (the laptop path of docs/DESIGN.md).
 *
 * mpirun says who is rank 0 but not where it listens. When this build links MPI and
 * the launcher is that MPI's own, rank 0 starts the tcp backend's store on a port the
 * kernel picks (no bind-release-rebind race) and MPI carries one line from rank 0 to
 * every rank (MPI_Bcast over MPI_COMM_WORLD). MPI is used for nothing else: it is
 * initialised for the exchange and finalised right after it (unless an mpi
 * communicator lives in the process or the program initialised MPI itself), so a job
 * on the tcp backend exits as Open MPI expects, and a later failure of one rank is
 * still seen by the others as a closed connection. MPI cannot be initialised twice in
 * a process: a communicator with backend "mpi" created after this exchange fails with
 * a clear error.
 *
 * Implemented in mpi.c, the one file that includes mpi.h: call these only in a build with
 * MPI (DT_HAVE_MPI).
 */
#ifndef DT_MPI_BOOT_H
#define DT_MPI_BOOT_H

#include <stddef.h>
#include "status.h"

/* The longest line the exchange carries, NUL included. */
#define DT_MPI_BOOT_LINE 1024

/* 1 when a process whose launch environment came from `source` (launch_env.h:
 * "openmpi", "mpich", ...) was started by the launcher of the MPI library this build
 * links, so MPI_Init joins the launcher's job instead of starting a world of one. */
int dt_mpi_boot_available(const char *source);

/* Collective over MPI_COMM_WORLD, which must have `size` ranks with this process as
 * `rank`. Rank 0 calls publish(ctx, line, DT_MPI_BOOT_LINE) to fill line; every rank
 * returns with rank 0's line in `line` (DT_MPI_BOOT_LINE bytes). When publish fails,
 * every rank fails with its message, so no rank waits for a store that never came. */
dt_status dt_mpi_boot(int rank, int size, dt_status (*publish)(void *ctx, char *line, size_t n), void *ctx,
                      char *line);

#endif /* DT_MPI_BOOT_H */
