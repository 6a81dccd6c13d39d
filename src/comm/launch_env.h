/*
 * launch_env.h: who am I in this job? Rank discovery from the launcher's environment.
 *
 * Precedence (first source that defines a rank wins, docs/DESIGN.md "Interfaces"):
 *   1. dtrain / torchrun: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 *      NODE_RANK (or GROUP_RANK), MASTER_ADDR, MASTER_PORT
 *   2. Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *      (its OMPI_COMM_WORLD_NODE_RANK is *not* a node index and is ignored)
 *   3. MPICH / Hydra: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
 *   4. Slurm: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
 *      SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (compressed), SLURM_JOB_ID
 * MASTER_ADDR/MASTER_PORT, when set, override any launcher's guess; under Slurm the
 * master defaults to the first host of the node list and the port is derived from
 * the job id (20000 + SLURM_JOB_ID % 20000), so every task finds the same one unaided.
 * (That guess applies whenever a Slurm node list is set, also under mpirun in a Slurm
 * job.) Otherwise, without MASTER_ADDR, the master stays unknown ("", 0). Open MPI and
 * MPICH give no node index: node_rank stays -1 and the comm layer numbers nodes from
 * the ranks' host names.
 */
#ifndef DT_LAUNCH_ENV_H
#define DT_LAUNCH_ENV_H

#include <stddef.h>
#include "status.h"

typedef struct {
    int  rank, size;              /* -1 when the environment does not say */
    int  local_rank, local_size;  /* -1 when unknown */
    int  node_rank;               /* -1 when unknown */
    char master_addr[256];        /* "" when unknown */
    int  master_port;             /* 0 when unknown */
    char job_id[128];             /* DT_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID, ...; "" when none */
    char source[32];              /* "dtrain", "openmpi", "mpich", "slurm" or "none" */
} dt_launch_env;

/* Fill *env from the process environment. Malformed values (RANK=abc, RANK >= WORLD_SIZE)
 * give DT_ERR_INVALID naming the variable. */
DT_API dt_status dt_launch_env_discover(dt_launch_env *env);

/* Expand a Slurm compressed host list ("node[01-03,7],gpu5") into hosts.
 * On success *hosts is a malloc'd array of *n malloc'd strings; free with dt_hostlist_free. */
DT_API dt_status dt_hostlist_expand(const char *list, char ***hosts, size_t *n);
DT_API void      dt_hostlist_free(char **hosts, size_t n);

#endif /* DT_LAUNCH_ENV_H */
