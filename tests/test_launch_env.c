/* test_launch_env.c: rank discovery under every launcher, precedence, and bad values
 * (launch_env.c). Each case starts from an environment with no launcher variable. */
#include "launch_env.h"
#include "tap.h"

static const char *const all_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT", "DT_JOB_ID", "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK", "OMPI_MCA_ess_base_jobid",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMIX_NAMESPACE", "PMI_JOBID",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
};

static void clean_env(void) {
    for (size_t i = 0; i < sizeof all_vars / sizeof all_vars[0]; i++) unsetenv(all_vars[i]);
}

/* setenv pairs: set("A", "1", "B", "2", NULL) */
static void set(const char *name, ...) {
    va_list ap;
    va_start(ap, name);
    for (const char *n = name; n; n = va_arg(ap, const char *)) setenv(n, va_arg(ap, const char *), 1);
    va_end(ap);
}

static void check_env(const dt_launch_env *e, const char *src, int rank, int size, int lr, int ls,
                      int nr, const char *addr, int port, const char *job) {
    is_str(e->source, src, "%s: source", src);
    is_int(e->rank, rank, "%s: rank", src);
    is_int(e->size, size, "%s: size", src);
    is_int(e->local_rank, lr, "%s: local rank", src);
    is_int(e->local_size, ls, "%s: local size", src);
    is_int(e->node_rank, nr, "%s: node rank", src);
    is_str(e->master_addr, addr, "%s: master addr", src);
    is_int(e->master_port, port, "%s: master port", src);
    is_str(e->job_id, job, "%s: job id", src);
}

/* Expect DT_ERR_INVALID whose message contains sub. */
static void bad(const char *what, const char *sub) {
    dt_launch_env e;
    dt_error_clear();
    is_int(dt_launch_env_discover(&e), DT_ERR_INVALID, "%s is rejected", what);
    like(dt_last_error(), sub, "%s: message names it", what);
}

int main(void) {
    dt_launch_env e;

    /* nothing set */
    clean_env();
    is_int(dt_launch_env_discover(&e), DT_OK, "empty environment is fine");
    check_env(&e, "none", -1, -1, -1, -1, -1, "", 0, "");

    /* dtrain / torchrun */
    clean_env();
    set("RANK", "3", "WORLD_SIZE", "8", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "2",
        "NODE_RANK", "1", "MASTER_ADDR", "10.0.0.1", "MASTER_PORT", "29500",
        "DT_JOB_ID", "job42", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "dtrain variables");
    check_env(&e, "dtrain", 3, 8, 1, 2, 1, "10.0.0.1", 29500, "job42");

    /* torchrun: GROUP_RANK instead of NODE_RANK, TORCHELASTIC_RUN_ID */
    clean_env();
    set("RANK", "0", "WORLD_SIZE", "4", "LOCAL_RANK", "0", "LOCAL_WORLD_SIZE", "2",
        "GROUP_RANK", "0", "MASTER_ADDR", "host1", "MASTER_PORT", "1234",
        "TORCHELASTIC_RUN_ID", "tr-run", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "torchrun variables");
    check_env(&e, "dtrain", 0, 4, 0, 2, 0, "host1", 1234, "tr-run");

    /* dtrain wins over Open MPI and Slurm; Slurm's job id still found */
    clean_env();
    set("RANK", "1", "WORLD_SIZE", "2", "OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "4",
        "SLURM_PROCID", "5", "SLURM_NTASKS", "8", "SLURM_JOB_ID", "777", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "dtrain over others");
    check_env(&e, "dtrain", 1, 2, -1, -1, -1, "", 20777, "777");

    /* Open MPI: NODE_RANK ignored (it counts ranks within a node) */
    clean_env();
    set("OMPI_COMM_WORLD_RANK", "5", "OMPI_COMM_WORLD_SIZE", "6", "OMPI_COMM_WORLD_LOCAL_RANK", "2",
        "OMPI_COMM_WORLD_LOCAL_SIZE", "3", "OMPI_COMM_WORLD_NODE_RANK", "2",
        "OMPI_MCA_ess_base_jobid", "3456789", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "Open MPI variables");
    check_env(&e, "openmpi", 5, 6, 2, 3, -1, "", 0, "3456789");

    /* Open MPI wins over MPICH and Slurm */
    clean_env();
    set("OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "PMI_RANK", "0", "PMI_SIZE", "2",
        "SLURM_PROCID", "0", "SLURM_NTASKS", "2", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "Open MPI over MPICH/Slurm");
    is_str(e.source, "openmpi", "Open MPI chosen");
    is_int(e.rank, 1, "Open MPI rank");

    /* MPICH / Hydra */
    clean_env();
    set("PMI_RANK", "2", "PMI_SIZE", "4", "MPI_LOCALRANKID", "0", "MPI_LOCALNRANKS", "2",
        "MASTER_ADDR", "m", "MASTER_PORT", "4000", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "MPICH variables");
    check_env(&e, "mpich", 2, 4, 0, 2, -1, "m", 4000, "");

    /* MPICH wins over Slurm */
    clean_env();
    set("PMI_RANK", "0", "PMI_SIZE", "1", "SLURM_PROCID", "3", "SLURM_NTASKS", "4", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "MPICH over Slurm");
    is_str(e.source, "mpich", "MPICH chosen");

    /* Slurm: master from the step node list, port from the job id, local size from
     * SLURM_STEP_TASKS_PER_NODE ("2(x2),1": nodes 0,1 have 2 tasks, node 2 has 1) */
    clean_env();
    set("SLURM_PROCID", "4", "SLURM_NTASKS", "5", "SLURM_LOCALID", "0", "SLURM_NODEID", "2",
        "SLURM_STEP_NODELIST", "gpu[07-09]", "SLURM_JOB_NODELIST", "gpu[01-09]",
        "SLURM_JOB_ID", "123456", "SLURM_STEP_TASKS_PER_NODE", "2(x2),1", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "Slurm variables");
    check_env(&e, "slurm", 4, 5, 0, 1, 2, "gpu07", 23456, "123456");

    /* Slurm: job node list when no step list; SLURM_NPROCS; node 1 of "2(x2),1" */
    clean_env();
    set("SLURM_PROCID", "3", "SLURM_NPROCS", "5", "SLURM_LOCALID", "1", "SLURM_NODEID", "1",
        "SLURM_JOB_NODELIST", "a[3-4],b", "SLURM_JOB_ID", "40000",
        "SLURM_TASKS_PER_NODE", "2(x2),1", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "Slurm job node list");
    check_env(&e, "slurm", 3, 5, 1, 2, 1, "a3", 20000, "40000");

    /* Slurm with MASTER_ADDR/MASTER_PORT and DT_JOB_ID overriding */
    clean_env();
    set("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_NODEID", "0",
        "SLURM_JOB_NODELIST", "n[1-2]", "SLURM_JOB_ID", "99", "MASTER_ADDR", "login1",
        "MASTER_PORT", "5555", "DT_JOB_ID", "mine", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "Slurm with overrides");
    check_env(&e, "slurm", 0, 2, -1, -1, 0, "login1", 5555, "mine");

    /* mpirun inside a Slurm job: ranks from Open MPI, master guessed from Slurm */
    clean_env();
    set("OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "4", "SLURM_PROCID", "0", "SLURM_NTASKS", "2",
        "SLURM_JOB_NODELIST", "cn[100-101]", "SLURM_JOB_ID", "20005", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "Open MPI inside Slurm");
    check_env(&e, "openmpi", 1, 4, -1, -1, -1, "cn100", 20005, "20005");

    /* PMIx namespace as a job id */
    clean_env();
    set("PMI_RANK", "0", "PMI_SIZE", "1", "PMIX_NAMESPACE", "ns7", NULL);
    is_int(dt_launch_env_discover(&e), DT_OK, "PMIx namespace");
    is_str(e.job_id, "ns7", "PMIx namespace is the job id");

    /* bad values */
    clean_env(); set("RANK", "abc", "WORLD_SIZE", "2", NULL);      bad("RANK=abc", "RANK='abc'");
    clean_env(); set("RANK", "-1", "WORLD_SIZE", "2", NULL);       bad("RANK=-1", "RANK='-1'");
    clean_env(); set("RANK", "2", "WORLD_SIZE", "2", NULL);        bad("RANK >= WORLD_SIZE", "RANK='2': expected an integer in 0..1");
    clean_env(); set("RANK", "1x", "WORLD_SIZE", "2", NULL);       bad("RANK=1x", "RANK='1x'");
    clean_env(); set("RANK", "", "WORLD_SIZE", "2", NULL);         bad("RANK empty", "RANK=''");
    clean_env(); set("RANK", "0", NULL);                           bad("RANK without WORLD_SIZE", "WORLD_SIZE is not set");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "0", NULL);        bad("WORLD_SIZE=0", "WORLD_SIZE='0'");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "99999999999", NULL); bad("WORLD_SIZE huge", "WORLD_SIZE='99999999999'");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "4", "LOCAL_RANK", "2", "LOCAL_WORLD_SIZE", "2", NULL);
    bad("LOCAL_RANK >= LOCAL_WORLD_SIZE", "LOCAL_RANK='2'");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "2", "LOCAL_WORLD_SIZE", "3", NULL);
    bad("LOCAL_WORLD_SIZE > WORLD_SIZE", "LOCAL_WORLD_SIZE='3'");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "2", "NODE_RANK", "x", NULL); bad("NODE_RANK=x", "NODE_RANK='x'");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "99999", NULL);
    bad("MASTER_PORT=99999", "MASTER_PORT='99999': expected an integer in 1..65535");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "0", NULL); bad("MASTER_PORT=0", "MASTER_PORT='0'");
    clean_env(); set("RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "http", NULL); bad("MASTER_PORT=http", "MASTER_PORT='http'");
    clean_env(); set("OMPI_COMM_WORLD_RANK", "4", "OMPI_COMM_WORLD_SIZE", "4", NULL);
    bad("OMPI rank >= size", "OMPI_COMM_WORLD_RANK='4'");
    clean_env(); set("OMPI_COMM_WORLD_RANK", "0", NULL); bad("OMPI without size", "OMPI_COMM_WORLD_SIZE is not set");
    clean_env(); set("PMI_RANK", "z", "PMI_SIZE", "2", NULL); bad("PMI_RANK=z", "PMI_RANK='z'");
    clean_env(); set("PMI_RANK", "0", "PMI_SIZE", "2", "MPI_LOCALRANKID", "-3", NULL); bad("MPI_LOCALRANKID=-3", "MPI_LOCALRANKID='-3'");
    clean_env(); set("SLURM_PROCID", "0", NULL); bad("Slurm without SLURM_NTASKS", "SLURM_NTASKS (or SLURM_NPROCS) is not set");
    clean_env(); set("SLURM_PROCID", "0", "SLURM_NTASKS", "two", NULL); bad("SLURM_NTASKS=two", "SLURM_NTASKS='two'");
    clean_env(); set("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_NODEID", "-1", NULL); bad("SLURM_NODEID=-1", "SLURM_NODEID='-1'");
    clean_env(); set("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_JOB_NODELIST", "n[2-1]", NULL);
    bad("bad SLURM_JOB_NODELIST", "SLURM_JOB_NODELIST: host list 'n[2-1]': reversed range");
    clean_env(); set("SLURM_PROCID", "0", "SLURM_NTASKS", "2", "SLURM_STEP_NODELIST", "n[1", NULL);
    bad("bad SLURM_STEP_NODELIST", "SLURM_STEP_NODELIST: host list 'n[1': unbalanced");

    /* too long a master address */
    clean_env();
    char longaddr[400];
    memset(longaddr, 'a', sizeof longaddr - 1);
    longaddr[sizeof longaddr - 1] = '\0';
    set("RANK", "0", "WORLD_SIZE", "1", "MASTER_ADDR", longaddr, NULL);
    bad("MASTER_ADDR too long", "MASTER_ADDR: value of 399 characters is too long");

    is_int(dt_launch_env_discover(NULL), DT_ERR_INVALID, "NULL env is rejected");
    return done_testing();
}
