/*
 * allreduce.c: the smallest program over libdtrain — every rank contributes its
 * rank number and all of them receive the sum. Build against an installed dtrain:
 *
 *   cc allreduce.c $(pkg-config --cflags --libs dtrain) -o allreduce
 *   dtrun -n 4 ./allreduce
 */
#include <stdio.h>
#include <dtrain.h>   /* pkg-config adds -I$(includedir)/dtrain */

int main(void) {
    dt_comm_opts o;
    dt_comm *c;
    dt_comm_opts_default(&o);   /* backend from $DT_BACKEND (tcp), rank and size from the launcher */
    if (dt_comm_init(&o, &c) != DT_OK) {
        fprintf(stderr, "allreduce: %s\n", dt_last_error());
        return 1;
    }
    float x[4];
    for (int i = 0; i < 4; i++) x[i] = (float)dt_comm_rank(c);
    dt_status s = dt_allreduce(c, x, x, 4, DT_F32, DT_SUM);
    if (s != DT_OK) {
        fprintf(stderr, "allreduce: %s\n", dt_last_error());
        dt_comm_destroy(c);
        return 1;
    }
    int n = dt_comm_size(c);
    printf("rank %d of %d: sum of ranks = %g (expected %d)\n", dt_comm_rank(c), n, x[0], n * (n - 1) / 2);
    dt_comm_destroy(c);
    return x[0] == (float)(n * (n - 1) / 2) ? 0 : 1;
}
