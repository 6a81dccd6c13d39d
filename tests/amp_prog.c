/* amp_prog.c: the trainer's loss-scaling decisions on a given sequence of found-inf
 * flags, for tests/torch_amp.sh to hold against PyTorch's GradScaler.
 *
 * stdin: "INIT_SCALE GROWTH_INTERVAL", then one flag (0 or 1) per line. For each step the
 * gradient of a one-weight model is finite, or holds an inf when the flag is 1; the
 * trainer's fp16 check (dt_amp_check: nonfinite, the scaler's update) decides. stdout,
 * one line per step: "SKIP UNSCALE SCALE TRACKER" — whether the step is skipped, the
 * factor that unscales its gradient, and the scaler after the update (the f32 values as
 * their bits in hex). */
#include "amp.h"
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static unsigned bits(float f) {
    unsigned u;
    memcpy(&u, &f, sizeof u);
    return u;
}

int main(void) {
    double init = 0.0;
    int interval = 0;
    if (scanf("%lf %d", &init, &interval) != 2 || !(init > 0.0) || interval < 1) {
        fprintf(stderr, "amp_prog: expected 'INIT_SCALE GROWTH_INTERVAL' first\n");
        return 2;
    }
    const dt_ops *ops = dt_ops_cpu();
    static const dt_shape in = {1, {1, 0, 0}};
    dt_model *m = NULL;
    dt_amp *a = NULL;
    dt_scaler_opts o;
    dt_scaler_opts_default(&o);
    o.init_scale = init;
    o.growth_interval = interval;
    if (dt_model_build("linear(1)", &in, ops, 0, 1, &m) != DT_OK || dt_amp_init("fp16", NULL, m, NULL, &a) != DT_OK ||
        dt_amp_set_scaler(a, &o) != DT_OK) {
        fprintf(stderr, "amp_prog: %s\n", dt_last_error());
        return 1;
    }
    float *g = dt_model_grads(m);
    size_t n = dt_model_nparams(m);
    int flag;
    for (long long step = 0; scanf("%d", &flag) == 1; step++) {
        for (size_t i = 0; i < n; i++) g[i] = 0.25f;
        if (flag) g[n - 1] = INFINITY;
        int skip = 0;
        float unscale = 0.0f;
        if (dt_amp_check(a, step, g, n, &skip, &unscale) != DT_OK) {
            fprintf(stderr, "amp_prog: %s\n", dt_last_error());
            return 1;
        }
        char text[96];
        long tracker = 0;
        dt_amp_scaler_text(a, text, sizeof text);
        sscanf(text, "%*s %ld", &tracker);
        printf("%d %08x %08x %ld\n", skip, bits(unscale), bits((float)dt_amp_scale(a)), tracker);
    }
    dt_amp_free(a);
    dt_model_free(m);
    return 0;
}
