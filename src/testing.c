/*
 * testing.c: the planted-fault switch of testing.h. A plain variable: it is set
 * once by the program before any training thread starts, and only read after.
 */
#include "testing.h"

#include <string.h>

static dt_fault g_fault = DT_FAULT_NONE;

static const char *const fault_names[] = {
    [DT_FAULT_SAMPLER_EPOCH] = "sampler-epoch",
    [DT_FAULT_SKIP_ALLREDUCE] = "skip-allreduce",
    [DT_FAULT_LR_RANK1] = "lr-rank1",
};

dt_status dt_testing_set_fault(const char *name) {
    if (!name || !*name) {
        g_fault = DT_FAULT_NONE;
        return DT_OK;
    }
    for (size_t i = 1; i < sizeof fault_names / sizeof fault_names[0]; i++)
        if (!strcmp(name, fault_names[i])) {
            g_fault = (dt_fault)i;
            return DT_OK;
        }
    return dt_error(DT_ERR_INVALID, "planted fault '%s': expected sampler-epoch, skip-allreduce or lr-rank1", name);
}

dt_fault dt_testing_fault(void) { return g_fault; }

static int g_unverified;

void dt_testing_set_unverified(int on) { g_unverified = on != 0; }
int  dt_testing_unverified(void) { return g_unverified; }
