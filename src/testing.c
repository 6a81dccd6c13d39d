/*
 * testing.c: the planted-fault switch of testing.h. A plain variable: it is set
 * once by the program before any training thread starts, and only read after.
 */
#include "testing.h"

#include <stdlib.h>
#include <string.h>

static dt_fault g_fault = DT_FAULT_NONE;
static long long g_fault_step;

static const char *const fault_names[] = {
    [DT_FAULT_SAMPLER_EPOCH] = "sampler-epoch",
    [DT_FAULT_SKIP_ALLREDUCE] = "skip-allreduce",
    [DT_FAULT_LR_RANK1] = "lr-rank1",
    [DT_FAULT_GRAD_INF] = "grad-inf",     /* takes ":N", the step */
    [DT_FAULT_THREADS_FLIP] = "threads-flip",
    [DT_FAULT_SEAL_FLIP] = "seal-flip",   /* takes ":N", the record */
};

dt_status dt_testing_set_fault(const char *name) {
    g_fault = DT_FAULT_NONE;
    g_fault_step = 0;
    if (!name || !*name) return DT_OK;
    size_t len = strcspn(name, ":");
    for (size_t i = 1; i < sizeof fault_names / sizeof fault_names[0]; i++) {
        if (strlen(fault_names[i]) != len || strncmp(name, fault_names[i], len) != 0) continue;
        int wants_step = i == DT_FAULT_GRAD_INF || i == DT_FAULT_SEAL_FLIP;
        if (wants_step) {
            char *end = NULL;
            long long n = name[len] == ':' ? strtoll(name + len + 1, &end, 10) : 0;
            if (n < 1 || !end || *end) break;
            g_fault_step = n;
        } else if (name[len]) {
            break;
        }
        g_fault = (dt_fault)i;
        return DT_OK;
    }
    return dt_error(DT_ERR_INVALID, "planted fault '%s': expected sampler-epoch, skip-allreduce, lr-rank1, "
                    "grad-inf:STEP, threads-flip or seal-flip:RECORD", name);
}

dt_fault  dt_testing_fault(void) { return g_fault; }
long long dt_testing_fault_step(void) { return g_fault_step; }

static int g_unverified;

void dt_testing_set_unverified(int on) { g_unverified = on != 0; }
int  dt_testing_unverified(void) { return g_unverified; }
