/* test_model.c: the model spec language (presets, files, every error with its
 * message), shape inference, PyTorch parameter names/shapes/counts, the
 * summary table, the registry and the model hooks, on the CPU backend. */
#include "model.h"
#include "rng.h"
#include "tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const dt_shape MNIST = { 3, { 1, 28, 28 } };

/* Parse + infer for an input; returns the status and leaves the spec freed. */
static dt_status try_spec(const char *text, const dt_shape *in) {
    dt_spec s;
    dt_error_clear();
    dt_status st = dt_spec_parse(text, &s);
    if (st != DT_OK) return st;
    st = dt_spec_infer(&s, in);
    dt_spec_free(&s);
    return st;
}

static void expect_error(const char *text, const dt_shape *in, dt_status want, const char *msg,
                         const char *what) {
    dt_status st = try_spec(text, in);
    is_int(st, want, "%s: status", what);
    like(dt_last_error(), msg, "%s: message", what);
}

static void test_parse(void) {
    dt_spec s;
    is_int(dt_spec_parse("mlp", &s), DT_OK, "mlp preset parses");
    is_int(s.n, 6, "mlp has 6 layers");
    is_int(s.layers[0].kind, DT_LAYER_FLATTEN, "mlp layer 0 is flatten");
    is_int(s.layers[1].kind, DT_LAYER_LINEAR, "mlp layer 1 is linear");
    is_int(dt_layer_arg(&s.layers[1], "out"), 1024, "mlp layer 1 has 1024 outputs");
    is_int(dt_spec_infer(&s, &MNIST), DT_OK, "mlp fits (1, 28, 28)");
    is_int(s.nparams, 1863690, "mlp parameter count is PyTorch's 1,863,690");
    is_int(s.ntensors, 6, "mlp has 6 parameter tensors");
    dt_spec_free(&s);

    is_int(dt_spec_parse("cnn", &s), DT_OK, "cnn preset parses");
    is_int(s.n, 12, "cnn has 12 layers");
    is_int(dt_spec_infer(&s, &MNIST), DT_OK, "cnn fits (1, 28, 28)");
    /* conv 1*32*9+32, bn 2*32, conv 32*64*9+64, bn 2*64, linear 3136*128+128, linear 128*10+10 */
    int64_t want = (32 * 9 + 32) + 64 + (32 * 64 * 9 + 64) + 128 + (3136 * 128 + 128) + (128 * 10 + 10);
    is_int(s.nparams, want, "cnn parameter count (%lld)", (long long)want);
    is_int(s.nparams, 421834, "cnn parameter count is 421,834");
    is_int(s.layers[7].outs.ndim, 3, "cnn layer 7 output is (C, H, W)");
    is_int(s.layers[7].outs.d[0], 64, "cnn after second pool: 64 channels");
    is_int(s.layers[7].outs.d[1], 7, "cnn after second pool: H 7");
    is_int(s.layers[8].outs.d[0], 3136, "cnn flatten gives 3136 features");
    is_int(dt_layer_arg(&s.layers[0], "stride"), 1, "conv stride defaults to 1");
    is_int(dt_layer_arg(&s.layers[3], "stride"), 2, "maxpool stride defaults to the kernel");
    dt_spec_free(&s);

    is_int(dt_spec_parse("  conv( 8 , 3, stride=2, pad = 1, bias=0 )\n\tbn  gelu dropout(0.25) gap ln tanh linear(3, bias=false)", &s),
           DT_OK, "spaces inside parentheses and keyword arguments");
    is_int(s.n, 8, "8 layers");
    is_int(dt_layer_arg(&s.layers[0], "stride"), 2, "stride=2");
    is_int(dt_layer_arg(&s.layers[0], "pad"), 1, "pad = 1");
    is_int(dt_layer_arg(&s.layers[0], "bias"), 0, "bias=0");
    ok(fabs(dt_layer_arg(&s.layers[3], "p") - 0.25) < 1e-7, "dropout p 0.25");
    is_str(s.layers[0].text, "conv( 8 , 3, stride=2, pad = 1, bias=0 )", "layer text kept as written");
    dt_shape in = { 3, { 3, 9, 9 } };
    is_int(dt_spec_infer(&s, &in), DT_OK, "infers on (3, 9, 9)");
    is_int(s.layers[0].outs.d[1], 5, "conv k3 s2 p1 on 9 gives 5");
    is_int(s.layers[4].outs.ndim, 1, "gap gives (C)");
    is_int(s.layers[4].outs.d[0], 8, "gap keeps 8 channels");
    is_int(s.nparams, 8 * 3 * 9 + 16 + 16 + 8 * 3, "no conv bias, bn 16, ln 16, linear 24 without bias");
    is_int(s.layers[7].nparams, 1, "linear without bias has one parameter");
    dt_spec_free(&s);
    is_int(dt_spec_parse("dropout", &s), DT_OK, "bare dropout");
    ok(fabs(dt_layer_arg(&s.layers[0], "p") - 0.5) < 1e-7, "dropout p defaults to 0.5");
    dt_spec_free(&s);
    is_int(dt_spec_parse("maxpool(3,stride=2,pad=1) avgpool(2,1)", &s), DT_OK, "pool arguments");
    is_int(dt_layer_arg(&s.layers[0], "pad"), 1, "maxpool pad");
    is_int(dt_layer_arg(&s.layers[1], "stride"), 1, "avgpool positional stride");
    dt_spec_free(&s);
    ok(dt_spec_preset("mlp") && dt_spec_preset("cnn") && dt_spec_preset("resnet") && !dt_spec_preset("vgg"), "preset lookup");
}

/* Trees: seq and residual containers, PyTorch names, shapes through blocks. */
static void test_tree(void) {
    dt_spec s;
    const char *text = "conv(4,3,pad=1) residual(conv(4,3,pad=1) bn relu seq(conv(4,3,pad=1) bn)) relu "
                       "seq(flatten linear(10))";
    is_int(dt_spec_parse(text, &s), DT_OK, "a tree parses");
    /* conv, residual, conv, bn, relu, conv, bn, residual_end, relu, flatten, linear */
    is_int(s.n, 11, "flattened into 11 rows (a block adds its opening and closing rows)");
    is_str(s.layers[2].name, "1.0", "first layer in a residual block is named 1.0");
    is_str(s.layers[5].name, "1.3.0", "a seq inside a block nests its names");
    is_str(s.layers[8].name, "2", "after the block, names continue at the top");
    is_str(s.layers[10].name, "3.1", "seq at the top level");
    is_int(s.layers[1].kind, DT_LAYER_RESIDUAL, "row 1 opens the block");
    is_int(s.layers[7].kind, DT_LAYER_RESIDUAL_END, "row 7 closes it");
    ok(s.layers[1].partner == &s.layers[7] && s.layers[7].partner == &s.layers[1], "the block's rows know each other");
    is_int(s.layers[5].depth, 2, "depth counts containers");
    is_int(dt_spec_infer(&s, &MNIST), DT_OK, "the tree infers");
    is_int(s.layers[7].outs.d[0], 4, "the block keeps (4, 28, 28)");
    int64_t want = (9 * 4 + 4) + (4 * 4 * 9 + 4) + 8 + (4 * 4 * 9 + 4) + 8 + (4 * 784 * 10 + 10);
    is_int(s.nparams, want, "tree parameter count");
    char buf[4096];
    dt_spec_summary(&s, &MNIST, buf, sizeof buf);
    like(buf, "1.3.0", "the summary shows module paths");
    like(buf, "residual", "the summary shows the block");
    like(buf, "+ x", "the summary shows the skip addition");
    dt_spec_free(&s);

    dt_model *m = NULL;
    if (ok(dt_model_build(text, &MNIST, dt_ops_cpu(), 1, 2, &m) == DT_OK, "the tree builds")) {
        dt_tensor_info ti;
        is_int(dt_model_state_find(m, "1.3.0.weight", &ti), DT_OK, "a nested conv weight is named 1.3.0.weight");
        is_int(ti.ndim, 4, "... and is 4-d");
        is_int(dt_model_state_find(m, "1.1.running_var", &ti), DT_OK, "a batchnorm buffer inside a block");
        is_int(dt_model_state_find(m, "1.1.num_batches_tracked", &ti), DT_OK, "its counter");
        is_int(dt_model_state_find(m, "3.1.bias", &ti), DT_OK, "the head inside a seq is 3.1");
        ok(dt_model_layer(m, 4)->relu_fused && dt_model_layer(m, 3)->fuse_relu, "bn-relu inside a block is fused");
        ok(!dt_model_layer(m, 8)->relu_fused && !dt_model_layer(m, 7)->fuse_relu,
           "a relu after the block's addition is not fused into it");
        dt_model_free(m);
    }

    /* the resnet preset: parameters as its PyTorch module has them */
    is_int(dt_spec_parse("resnet", &s), DT_OK, "resnet preset parses");
    is_int(dt_spec_infer(&s, &MNIST), DT_OK, "resnet fits (1, 28, 28)");
    want = 288 + 64 + 2 * (32 * 32 * 9 + 64) + (32 * 64 * 9 + 128) + 2 * (64 * 64 * 9 + 128) + 650;
    is_int(s.nparams, want, "resnet has %lld parameters", (long long)want);
    is_int(s.layers[s.n - 1].outs.d[0], 10, "resnet gives 10 logits");
    dt_spec_free(&s);
    if (ok(dt_model_build("resnet", &MNIST, dt_ops_cpu(), 1, 2, &m) == DT_OK, "resnet builds")) {
        dt_tensor_info ti;
        is_int(dt_model_state_find(m, "4.3.weight", &ti), DT_OK, "resnet block conv 4.3.weight");
        is_int(dt_model_state_find(m, "9.4.running_mean", &ti), DT_OK, "resnet block bn 9.4.running_mean");
        is_int(dt_model_state_find(m, "12.weight", &ti), DT_OK, "resnet head 12.weight");
        dt_model_free(m);
    }

    expect_error("conv(4,3,pad=1) residual(conv(8,3,pad=1))", &MNIST, DT_ERR_INVALID,
                 "layer 1 'residual(conv(8,3,pad=1))': the block's output (B, 8, 28, 28) differs from its input "
                 "(B, 4, 28, 28)", "a block that changes the shape");
    expect_error("residual()", &MNIST, DT_ERR_INVALID, "layer 0 'residual()': empty layer list", "empty block");
    expect_error("seq( )", &MNIST, DT_ERR_INVALID, "empty layer list", "empty seq");
    expect_error("residual(relu foo)", &MNIST, DT_ERR_INVALID, "layer 0.1 'foo': unknown layer 'foo'",
                 "errors inside a block name the module path");
    expect_error("residual(relu", &MNIST, DT_ERR_INVALID, "unbalanced parentheses", "unclosed block");
    expect_error("residual_end", &MNIST, DT_ERR_INVALID, "unknown layer 'residual_end'", "the closing row is internal");
    char deep[256] = "";
    for (int i = 0; i < 20; i++) strcat(deep, "seq(");
    strcat(deep, "relu");
    for (int i = 0; i < 20; i++) strcat(deep, ")");
    expect_error(deep, &MNIST, DT_ERR_INVALID, "nested deeper than 16", "nesting is bounded");
}

static void test_files(void) {
    char path[] = "/tmp/dt_test_model_XXXXXX";
    int fd = mkstemp(path);
    ok(fd >= 0, "temporary spec file");
    if (fd < 0) return;
    const char *text = "# a small model\nflatten   # (B, 784)\nlinear(16) relu\n\n  linear(10)  # logits\n";
    ok(write(fd, text, strlen(text)) == (ssize_t)strlen(text), "spec file written");
    close(fd);
    dt_spec s;
    is_int(dt_spec_parse(path, &s), DT_OK, "a path that exists is read as a file");
    is_int(s.n, 4, "file: 4 layers, comments ignored");
    is_int(dt_spec_infer(&s, &MNIST), DT_OK, "file spec infers");
    is_int(s.nparams, 784 * 16 + 16 + 16 * 10 + 10, "file spec parameter count");
    dt_spec_free(&s);
    char at[64];
    snprintf(at, sizeof at, "@%s", path);
    is_int(dt_spec_parse(at, &s), DT_OK, "@file is read as a file");
    is_int(s.n, 4, "@file: 4 layers");
    dt_spec_free(&s);
    unlink(path);
    expect_error(at, &MNIST, DT_ERR_INVALID, path, "missing @file is bad input naming the file");
}

static void test_errors(void) {
    dt_shape flat = { 1, { 20 } }, small = { 3, { 1, 4, 4 } };
    expect_error("flatten foo(3) linear(10)", &MNIST, DT_ERR_INVALID, "layer 1 'foo(3)': unknown layer 'foo'", "unknown layer");
    expect_error("conv(x,3)", &MNIST, DT_ERR_INVALID, "layer 0 'conv(x,3)': 'out' expects a positive integer, got 'x'", "bad integer");
    expect_error("conv(0,3)", &MNIST, DT_ERR_INVALID, "'out' expects a positive integer, got '0'", "zero out channels");
    expect_error("conv(32)", &MNIST, DT_ERR_INVALID, "layer 0 'conv(32)': missing argument 'k'", "missing argument");
    expect_error("flatten linear(1,1,1,1)", &MNIST, DT_ERR_INVALID, "layer 1 'linear(1,1,1,1)': too many arguments", "too many arguments");
    expect_error("flatten linear(10,foo=1)", &MNIST, DT_ERR_INVALID, "unknown argument 'foo' (expected one of: out, bias, std)", "unknown keyword");
    expect_error("flatten linear(10,bias=2)", &MNIST, DT_ERR_INVALID, "'bias' expects 0 or 1, got '2'", "bad bool");
    expect_error("flatten linear(out=10,out=3)", &MNIST, DT_ERR_INVALID, "argument 'out' given twice", "repeated argument");
    expect_error("flatten linear(bias=0,10)", &MNIST, DT_ERR_INVALID, "positional argument '10' after key=value", "positional after keyword");
    expect_error("flatten linear(10,)", &MNIST, DT_ERR_INVALID, "empty argument", "empty argument");
    expect_error("flatten linear()", &MNIST, DT_ERR_INVALID, "empty argument list", "empty list");
    expect_error("relu(3)", &MNIST, DT_ERR_INVALID, "layer 0 'relu(3)': too many arguments", "argument to relu");
    expect_error("dropout(1.5)", &MNIST, DT_ERR_INVALID, "dropout 'p' expects a number in [0, 1), got '1.5'", "dropout p out of range");
    expect_error("conv(3,3", &MNIST, DT_ERR_INVALID, "layer 0 'conv(3,3': unbalanced parentheses", "unbalanced");
    expect_error("maxpool(2,pad=2)", &MNIST, DT_ERR_INVALID, "pad 2 must be at most half the kernel size 2", "pool pad");
    expect_error("", &MNIST, DT_ERR_INVALID, "no layers", "empty spec");
    expect_error("   # nothing\n", &MNIST, DT_ERR_INVALID, "no layers", "only blanks");
    expect_error("res(relu)", &MNIST, DT_ERR_INVALID, "layer 0 'res(relu)': unknown layer 'res' (expected linear, conv,", "unknown container");
    like(dt_last_error(), "residual or seq)", "the list of kinds names the containers");
    ok(!strstr(dt_last_error(), "residual_end"), "the list of kinds hides the internal closing row");
    expect_error("linear(10)", &MNIST, DT_ERR_INVALID,
                 "layer 0 'linear(10)': linear expects a flat (B, features) or (B, T, features) input, but its input is (B, 1, 28, 28); add 'flatten' before it",
                 "linear on 4-D input suggests flatten");
    expect_error("flatten conv(3,3)", &MNIST, DT_ERR_INVALID, "layer 1 'conv(3,3)'", "conv on flat input names the layer");
    like(dt_last_error(), "conv expects a (B, C, H, W) input, but its input is (B, 784)", "conv on flat input: expectation");
    expect_error("maxpool(2)", &flat, DT_ERR_INVALID, "pooling expects a (B, C, H, W) input", "pool on flat input");
    expect_error("gap", &flat, DT_ERR_INVALID, "gap expects", "gap on flat input");
    expect_error("conv(8,3) conv(8,3)", &small, DT_ERR_INVALID,
                 "layer 1 'conv(8,3)': output would be empty for input (B, 8, 2, 2)", "zero-size output");
    expect_error("maxpool(5)", &small, DT_ERR_INVALID, "layer 0 'maxpool(5)': output would be empty", "pool larger than input");
    /* sizes that would overflow: refused with the layer named, never a negative count */
    dt_shape big = { 3, { 1, 32, 32 } };
    expect_error("conv(1000000000,1) flatten linear(1000000000)", &big, DT_ERR_INVALID,
                 "layer 0 'conv(1000000000,1)': its output (B, 1000000000, 32, 32) would have more than 2147483647 "
                 "elements per sample", "an activation too large for 32-bit counts");
    expect_error("flatten linear(100000) linear(100000)", &MNIST, DT_ERR_INVALID,
                 "layer 2 'linear(100000)': its weight would have more than 2147483647 elements", "a weight too large");
    dt_shape huge = { 3, { 1000000, 1000000, 1000000 } };
    expect_error("relu", &huge, DT_ERR_INVALID, "input shape has more than", "an input too large");
    dt_shape bad = { 0, { 0 } };
    expect_error("relu", &bad, DT_ERR_INVALID, "input shape must be (C, H, W), (T, C) or (F), got 0 dims", "0-d input rejected");
}

static void test_summary(void) {
    dt_spec s;
    char buf[4096];
    dt_spec_parse("mlp", &s);
    dt_spec_infer(&s, &MNIST);
    size_t n = dt_spec_summary(&s, &MNIST, buf, sizeof buf);
    ok(n == strlen(buf), "summary length is the text length");
    like(buf, "Total params: 1,863,690", "summary total with thousands separators");
    like(buf, "linear(1024)", "summary names the layer");
    like(buf, "(B, 784)", "summary shows the flatten output");
    like(buf, "803,840", "linear(1024) row counts weight and bias");
    like(buf, "Params size (MB): 7.45", "parameter bytes as float32");
    char small[32];
    size_t need = dt_spec_summary(&s, &MNIST, small, sizeof small);
    is_int(need, n, "truncated summary reports the full length");
    is_int(strlen(small), sizeof small - 1, "truncated summary is terminated");
    dt_spec_free(&s);
}

/* dt_shape_parse: the per-sample shape a checkpoint records ("1,28,28"), as `dtrain
 * export` reads it. A fourth size once went into d[3], past the array. */
static void test_shape_parse(void) {
    dt_shape s;
    char buf[64];
    is_int(dt_shape_parse("1,28,28", &s), DT_OK, "shape \"1,28,28\" parses");
    dt_shape_str(&s, 0, buf, sizeof buf);
    is_str(buf, "(1, 28, 28)", "into C, H, W");
    is_int(dt_shape_parse("64,32", &s), DT_OK, "shape \"64,32\" parses");
    ok(s.ndim == 2 && s.d[0] == 64 && s.d[1] == 32, "into T, C");
    is_int(dt_shape_parse("2147483648", &s), DT_OK, "a size of 2^31 is the largest");
    ok(s.ndim == 1 && s.d[0] == INT64_C(2147483648), "into F");
    const char *const bad[] = {"1,2,3,4", "1,2,3,4,5,6,7,8", "", "1,,2", "1,2,", ",1", "0,2", "-1", "+1", " 1",
                               "1 ", "2147483649", "99999999999999999999999", "1;2", "1,2x", NULL};
    for (int i = 0; bad[i]; i++) {
        dt_error_clear();
        s = (dt_shape){.ndim = 7};
        is_int(dt_shape_parse(bad[i], &s), DT_ERR_FORMAT, "shape \"%s\" is refused", bad[i]);
        ok(s.ndim == 0, "shape \"%s\": nothing is left in the shape", bad[i]);
        like(dt_last_error(), "is not C,H,W, T,C or F", "shape \"%s\": the message says what is expected", bad[i]);
    }
    is_int(dt_shape_parse(NULL, &s), DT_ERR_FORMAT, "no text is refused");
}

/* ---- built models ------------------------------------------------------------ */

typedef struct { int calls, order_ok, last_first; int seen[64]; } ready_log;

static dt_status on_ready(void *ctx, int first, int n) {
    ready_log *r = ctx;
    if (r->calls && first + n != r->last_first) r->order_ok = 0;
    r->last_first = first;
    for (int i = first; i < first + n && i < 64; i++) r->seen[i]++;
    r->calls++;
    return DT_OK;
}

/* A fake 2-rank group of identical ranks: sums double, counts double. */
static int sync_calls[2];
static dt_status fake_sync(void *ctx, int backward, float *stats, size_t n, int64_t *count) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) stats[i] *= 2.0f;
    if (!backward) *count *= 2;
    sync_calls[backward]++;
    return DT_OK;
}

static void test_built(void) {
    const dt_ops *ops = dt_ops_cpu();
    dt_model *m = NULL;
    is_int(dt_model_build("cnn", &MNIST, ops, 42, 8, &m), DT_OK, "cnn builds");
    if (!m) return;
    static const char *names[] = {
        "0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
        "4.weight", "4.bias", "5.weight", "5.bias", "5.running_mean", "5.running_var", "5.num_batches_tracked",
        "9.weight", "9.bias", "11.weight", "11.bias",
    };
    is_int(dt_model_nstate(m), 18, "cnn has 18 state tensors");
    is_int(dt_model_nparam_tensors(m), 12, "cnn has 12 parameters");
    int names_ok = 1;
    for (int i = 0; i < dt_model_nstate(m) && i < 18; i++) {
        dt_tensor_info t;
        dt_model_state(m, i, &t);
        if (strcmp(t.name, names[i])) { names_ok = 0; diag("state %d is %s, expected %s", i, t.name, names[i]); }
    }
    ok(names_ok, "state_dict names and order as PyTorch");
    dt_tensor_info t;
    is_int(dt_model_state_find(m, "4.weight", &t), DT_OK, "find 4.weight");
    ok(t.ndim == 4 && t.shape[0] == 64 && t.shape[1] == 32 && t.shape[2] == 3 && t.shape[3] == 3, "4.weight is [64, 32, 3, 3]");
    is_int(dt_model_state_find(m, "9.weight", &t), DT_OK, "find 9.weight");
    ok(t.ndim == 2 && t.shape[0] == 128 && t.shape[1] == 3136, "9.weight is [128, 3136]");
    ok(t.is_param && t.param_index == 8 && t.grad == dt_model_grads(m) + t.offset, "9.weight is parameter 8 with a gradient view");
    is_int(dt_model_state_find(m, "5.num_batches_tracked", &t), DT_OK, "find num_batches_tracked");
    ok(t.dtype == DT_I64 && t.ndim == 0 && t.on_host && !t.is_param && *(int64_t *)t.data == 0, "num_batches_tracked: I64 scalar 0");
    is_int(dt_model_state_find(m, "2.weight", &t), DT_ERR_INVALID, "relu has no weight");
    like(dt_last_error(), "no tensor named '2.weight'", "missing name in the message");
    is_int(dt_model_param(m, 12, &t), DT_ERR_INVALID, "parameter index out of range");
    size_t total = 0;
    int contiguous = 1;
    for (int i = 0; i < dt_model_nparam_tensors(m); i++) {
        dt_model_param(m, i, &t);
        if (t.offset != total) contiguous = 0;
        total += (size_t)t.numel;
    }
    ok(contiguous && total == dt_model_nparams(m) && total == 421834, "parameters tile the flat array in order");

    /* initialisation as PyTorch: bounds 1/sqrt(fan_in), bn 1/0, running 0/1 */
    const float *p = dt_model_params(m);
    dt_model_state_find(m, "9.weight", &t);
    float bound = 1.0f / sqrtf(3136.0f), mx = 0;
    double mean = 0;
    for (int64_t i = 0; i < t.numel; i++) {
        float v = fabsf(p[t.offset + (size_t)i]);
        if (v > mx) mx = v;
        mean += p[t.offset + (size_t)i];
    }
    mean /= (double)t.numel;
    ok(mx <= bound && mx > 0.95f * bound, "9.weight within U(-1/sqrt(3136), 1/sqrt(3136)) and spans it");
    ok(fabs(mean) < 0.01 * bound, "9.weight mean near 0 (%g)", mean);
    dt_model_state_find(m, "1.weight", &t);
    ok(p[t.offset] == 1.0f && p[t.offset + 31] == 1.0f, "bn weight 1");
    dt_model_state_find(m, "1.running_var", &t);
    ok(((float *)t.data)[0] == 1.0f && t.data == dt_model_buffers(m) + t.offset, "running_var 1, in the buffer array");

    /* forward/backward on a batch, hooks */
    int B = 4;
    float *x = malloc((size_t)B * 784 * sizeof(float));
    int32_t labels[4] = { 3, 1, 4, 1 };
    for (int i = 0; i < B * 784; i++) x[i] = (float)((i * 7919) % 1000) / 1000.0f;
    ready_log r = { .order_ok = 1 };
    dt_model_set_grad_ready(m, on_ready, &r);
    const float *y;
    float loss = 0;
    is_int(dt_model_forward(m, x, B, 1, 0, 0, &y), DT_OK, "cnn forward");
    is_int(dt_model_output_shape(m)->d[0], 10, "output (B, 10)");
    dt_loss ce = { DT_LOSS_CE, 0.0f };
    is_int(dt_model_loss_backward(m, &ce, labels, B, (float)B, &loss), DT_OK, "cnn loss + backward");
    ok(loss > 1.5f && loss < 3.5f, "initial loss near ln(10) (%g)", (double)loss);
    is_int(r.calls, 6, "grad_ready once per layer with parameters");
    ok(r.order_ok && r.last_first == 0, "grad_ready in reverse order, ending at parameter 0");
    int all_once = 1;
    for (int i = 0; i < 12; i++) all_once &= r.seen[i] == 1;
    ok(all_once, "every parameter reported exactly once");
    dt_model_state_find(m, "1.num_batches_tracked", &t);
    is_int(*(int64_t *)t.data, 1, "num_batches_tracked counts train batches");
    is_int(dt_model_forward(m, x, 9, 1, 0, 0, &y), DT_ERR_INVALID, "batch above max rejected");
    like(dt_last_error(), "batch 9 outside [1, 8]", "batch message");
    dt_model_forward(m, x, B, 1, 0, 0, &y);
    int32_t badlab[4] = { 3, 1, 10, 1 };
    ok(dt_model_loss_backward(m, &ce, badlab, B, (float)B, &loss) != DT_OK, "label >= classes rejected");

    /* sync-BN with a fake group of identical ranks gives the local result bitwise */
    float *y1 = malloc(40 * sizeof(float)), *g1 = malloc(dt_model_nparams(m) * sizeof(float));
    dt_model_forward(m, x, B, 1, 0, 0, &y);
    memcpy(y1, y, 40 * sizeof(float));
    dt_model_loss_backward(m, &ce, labels, B, (float)B, NULL);
    memcpy(g1, dt_model_grads(m), dt_model_nparams(m) * sizeof(float));
    dt_model_set_bn_sync(m, fake_sync, NULL);
    dt_model_forward(m, x, B, 1, 0, 0, &y);
    ok(memcmp(y1, y, 40 * sizeof(float)) == 0, "sync-BN forward equals local for identical ranks");
    dt_model_loss_backward(m, &ce, labels, B, (float)B, NULL);
    /* bn weight/bias grads stay local (DDP sums them); dx uses the global sums */
    ok(memcmp(g1, dt_model_grads(m), dt_model_nparams(m) * sizeof(float)) == 0, "sync-BN gradients equal local");
    ok(sync_calls[0] == 2 && sync_calls[1] == 2, "sync hook: called by both batchnorms in forward and backward");
    dt_model_set_bn_sync(m, NULL, NULL);

    /* eval: running statistics, deterministic, no update */
    dt_model_state_find(m, "1.num_batches_tracked", &t);
    int64_t nbt = *(int64_t *)t.data;
    dt_model_forward(m, x, B, 0, 0, 0, &y);
    memcpy(y1, y, 40 * sizeof(float));
    dt_model_forward(m, x, B, 0, 0, 0, &y);
    ok(memcmp(y1, y, 40 * sizeof(float)) == 0, "eval forward repeats exactly");
    is_int(*(int64_t *)t.data, nbt, "eval does not count batches");
    int64_t correct = -1;
    is_int(dt_model_loss(m, &ce, labels, B, (float)B, &loss, &correct), DT_OK, "eval loss");
    ok(correct >= 0 && correct <= B, "correct count in [0, B]");

    char buf[4096];
    dt_model_summary(m, buf, sizeof buf);
    like(buf, "Total params: 421,834", "cnn summary total");
    like(buf, "(B, 64, 7, 7)", "cnn summary shows the pooled shape");
    free(x); free(y1); free(g1);
    dt_model_free(m);

    m = NULL;
    is_int(dt_model_build("flatten linear(10)", &MNIST, ops, 1, 0, &m), DT_ERR_INVALID, "max batch 0 rejected");
    is_int(dt_model_build("linear(10)", &MNIST, ops, 1, 4, &m), DT_ERR_INVALID, "build reports spec errors");
    ok(m == NULL, "no model on failure");
}

/* Deferred running statistics: records replayed in order give the buffers of
 * in-place updates bit for bit; outputs are the same either way. */
static void test_bn_record(void) {
    const dt_ops *ops = dt_ops_cpu();
    dt_shape in = { 3, { 2, 5, 5 } };
    const char *spec = "conv(3,3,pad=1) bn relu flatten linear(6) bn linear(2)";
    dt_model *a = NULL, *b = NULL;
    dt_model_build(spec, &in, ops, 3, 4, &a);
    dt_model_build(spec, &in, ops, 3, 4, &b);
    if (!ok(a && b, "two models for the record test")) return;
    size_t nrec = dt_model_bn_record_size(b);
    is_int(nrec, 2 * 3 + 2 * 6, "record holds [sum|sumsq] per bn layer");
    {   /* a replay before any train forward has no count to use */
        dt_model *c = NULL;
        float zero[32] = {0};
        dt_model_build(spec, &in, ops, 3, 4, &c);
        ok(c && dt_model_bn_replay(c, zero) == DT_ERR_INVALID, "a replay before any train forward is refused");
        like(dt_last_error(), "before a train forward", "saying so");
        dt_model_free(c);
    }
    float x[3][4 * 50], rec[3][32], ya[8], yb[8];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 200; i++) x[k][i] = (float)(((i + 37 * k) * 7919) % 101) / 50.0f - 1.0f;
    int same_out = 1;
    for (int k = 0; k < 3; k++) {
        const float *y;
        dt_model_forward(a, x[k], 4, 1, 0, 0, &y);
        memcpy(ya, y, sizeof ya);
        dt_model_set_bn_record(b, rec[k]);
        dt_model_forward(b, x[k], 4, 1, 0, 0, &y);
        memcpy(yb, y, sizeof yb);
        same_out &= memcmp(ya, yb, sizeof ya) == 0;
    }
    ok(same_out, "outputs equal with and without a record");
    dt_tensor_info ta, tb;
    dt_model_state_find(b, "1.num_batches_tracked", &tb);
    is_int(*(int64_t *)tb.data, 0, "recording does not count batches");
    ok(memcmp(dt_model_buffers(a), dt_model_buffers(b), dt_model_nbuffers(a) * sizeof(float)) != 0,
       "recording leaves the running buffers alone");
    for (int k = 0; k < 3; k++) is_int(dt_model_bn_replay(b, rec[k]), DT_OK, "replay record %d", k);
    ok(memcmp(dt_model_buffers(a), dt_model_buffers(b), dt_model_nbuffers(a) * sizeof(float)) == 0,
       "replayed running buffers equal in-place updates bit for bit");
    dt_model_state_find(a, "5.num_batches_tracked", &ta);
    dt_model_state_find(b, "5.num_batches_tracked", &tb);
    ok(*(int64_t *)ta.data == 3 && *(int64_t *)tb.data == 3, "num_batches_tracked 3 both ways");
    dt_model_free(a);
    dt_model_free(b);
}

/* Reference values from PyTorch 1.13 for nn.Sequential(Conv2d(2,3,3,padding=1),
 * BatchNorm2d(3), ReLU(), MaxPool2d(2), Flatten(), Linear(12,4)) with parameter k
 * (in model.parameters() order, flattened) = 0.3*sin(0.37k + 0.1), input element
 * i = 0.5*cos(0.11i^2 + 0.3i) of (3, 2, 4, 4), labels (2, 0, 3), one train-mode
 * forward with cross_entropy(label_smoothing=0.1) and backward, then eval. */
static const float torch_loss = 1.42721844f;
static const float torch_grads[115] = {
    -0.102561787f, -0.0248722266f, 0.0524837002f, 0.0195925795f, -0.0822510421f, 0.0149632292f,
    -0.00838155393f, -0.0137549564f, -0.00136420759f, -0.0517635532f, 0.0622260496f, 0.039069213f,
    -0.0151845124f, -0.0036859191f, -0.0409195833f, -0.0738915578f, -0.0357054099f, -0.0426609591f,
    0.00375835807f, -0.00922741648f, 0.00861110538f, 0.00181962142f, 0.014352384f, -0.0153259244f,
    -0.0120699825f, 0.00190668448f, 0.00831849966f, -0.021565266f, -0.00341593917f,
    -0.00227393745f, 0.00602966454f, 0.00369223091f, 0.00762968464f, -0.00996011496f,
    -0.0186943989f, -0.0103612551f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f,
    0.0f, 0.0f, -2.42143869e-08f, -1.62981451e-09f, 0.0f, 0.318127066f, -0.20776999f, 0.0f, 0.281658798f,
    -0.106717423f, 0.0f, 0.00521633355f, 0.0142313614f, -0.0776745602f, -0.0110601112f,
    0.00383849558f, 0.00400494272f, -0.0146636879f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0272171237f,
    0.0344048887f, 0.0250487961f, 0.0157041363f, 0.00411009323f, 0.00381131447f, 0.00472880341f,
    0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0302916858f, -0.0293203201f, 0.0296174362f, 0.017774811f, 0.00451006042f,
    -0.0111542866f, 0.00559128821f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -0.0627251416f, -0.0193159301f,
    0.0230083168f, -0.0224188361f, -0.0124586485f, 0.00333802844f, 0.00434359442f, 0.0f, 0.0f, 0.0f, 0.0f,
    0.0f, -0.0724343359f, 0.227040887f, -0.0512481555f, -0.103358403f,
};
static const float torch_rm[3] = { 0.0340512469f, 0.0362667255f, 0.0335424505f }, torch_rv[3] = { 0.906044483f, 0.906335115f, 0.907097757f };
static const float torch_eval[12] = {
    -0.113929391f, -0.192162648f, -0.246648446f, -0.307180583f, -0.134647921f, -0.203319073f,
    -0.219927028f, -0.310402036f, -0.1371281f, -0.18932347f, -0.224977404f, -0.321680218f,
};

static int close_to(float a, float b, float atol, float rtol) { return fabsf(a - b) <= atol + rtol * fabsf(b); }

static void test_against_torch(void) {
    const dt_ops *ops = dt_ops_cpu();
    dt_shape in = { 3, { 2, 4, 4 } };
    dt_model *m = NULL;
    if (!ok(dt_model_build("conv(3,3,pad=1) bn relu maxpool(2) flatten linear(4)", &in, ops, 0, 3, &m) == DT_OK,
            "reference model builds")) return;
    is_int(dt_model_nparams(m), 115, "reference model has PyTorch's 115 parameters");
    float *p = dt_model_params(m), x[96], loss = 0;
    for (int k = 0; k < 115; k++) p[k] = 0.3f * (float)sin(0.37 * k + 0.1);
    for (int i = 0; i < 96; i++) x[i] = 0.5f * (float)cos(0.11 * i * i + 0.3 * i);
    int32_t labels[3] = { 2, 0, 3 };
    dt_loss ce = { DT_LOSS_CE, 0.1f };
    dt_model_forward(m, x, 3, 1, 0, 0, NULL);
    is_int(dt_model_loss_backward(m, &ce, labels, 3, 3.0f, &loss), DT_OK, "reference loss + backward");
    ok(close_to(loss, torch_loss, 1e-6f, 1e-5f), "loss %.9g equals PyTorch's %.9g", (double)loss, (double)torch_loss);
    const float *g = dt_model_grads(m);
    int bad = -1;
    for (int k = 0; k < 115; k++)
        if (!close_to(g[k], torch_grads[k], 2e-6f, 1e-4f) && bad < 0) bad = k;
    if (!ok(bad < 0, "all 115 gradients equal PyTorch's (layouts, bn, pooling, smoothing)"))
        diag("   gradient %d: %.9g, PyTorch %.9g", bad, (double)g[bad], (double)torch_grads[bad]);
    const float *buf = dt_model_buffers(m);
    int stats = 1;
    for (int c = 0; c < 3; c++) stats &= close_to(buf[c], torch_rm[c], 1e-7f, 1e-5f) && close_to(buf[3 + c], torch_rv[c], 1e-7f, 1e-5f);
    ok(stats, "running_mean / running_var (unbiased, momentum 0.1) equal PyTorch's");
    const float *y;
    dt_model_forward(m, x, 3, 0, 0, 0, &y);
    int ev = 1;
    for (int i = 0; i < 12; i++) ev &= close_to(y[i], torch_eval[i], 1e-6f, 1e-5f);
    ok(ev, "eval-mode outputs equal PyTorch's");
    dt_model_free(m);
}

/* Incremental decoding (dt_model_set_decode, attention's cache of the positions
 * before) gives the logits of the full causal forward at every position: the same model
 * built for T positions and for 1, the same parameters, one sequence of T tokens run
 * whole and position by position. T = 72 passes the cache's first size (64 rows), so
 * its growth is covered; a second sequence from position 0 checks that pos 0 starts
 * afresh. The weights are not the presets' small init but uniform in [-0.5, 0.5] (norm
 * scales around 1), so attention is far from uniform. The gpt has one key/value head per
 * query head; the llamas share each of 2 key/value heads among 2 query heads, or one
 * among all 4, with rotary positions (the cache holds the rotated keys). */
static void test_decode(const char *spec) {
    enum { T = 72, V = 13 };
    const dt_ops *ops = dt_ops_cpu();
    dt_shape full_in = { 1, { T } }, one_in = { 1, { 1 } };
    dt_model *full = NULL, *dec = NULL;
    is_int(dt_model_build(spec, &full_in, ops, 3, 1, &full), DT_OK, "decode: %s builds for %d positions", spec, T);
    is_int(dt_model_build(spec, &one_in, ops, 3, 1, &dec), DT_OK, "decode: %s builds for 1 position", spec);
    if (!full || !dec) { dt_model_free(full); dt_model_free(dec); return; }
    size_t n = dt_model_nparams(full);
    is_int(dt_model_nparams(dec), n, "decode: both have the same flat parameter layout");
    float *p = malloc(n * sizeof(float)), *want = malloc((size_t)T * V * sizeof(float));
    if (!p || !want) { free(p); free(want); dt_model_free(full); dt_model_free(dec); ok(0, "decode: out of memory"); return; }
    for (size_t i = 0; i < n; i++) p[i] = (float)dt_rng_unit(77, 0, i) - 0.5f;
    for (int i = 0; i < dt_model_nparam_tensors(full); i++) {   /* layer norm scales near 1 */
        dt_tensor_info t;
        dt_model_param(full, i, &t);
        if (t.ndim == 1 && (strstr(t.name, "ln_") || strstr(t.name, "norm")) && strstr(t.name, ".weight"))
            for (int64_t k = 0; k < t.numel; k++) p[t.offset + (size_t)k] += 1.0f;
    }
    ops->copy_h2d(dt_model_params(full), p, n * sizeof(float));
    ops->copy_h2d(dt_model_params(dec), p, n * sizeof(float));
    for (int seq = 0; seq < 2; seq++) {
        float x[T];
        for (int t = 0; t < T; t++) x[t] = (float)((t * (seq ? 5 : 7) + 3 * seq + 1) % V);
        const float *out = NULL;
        is_int(dt_model_forward(full, x, 1, 0, 0, 0, &out), DT_OK, "decode: sequence %d, full forward", seq);
        ops->copy_d2h(want, out, (size_t)T * V * sizeof(float));
        double worst = 0, scale = 0;
        int good = 1;
        for (int t = 0; t < T && good; t++) {
            float got[V];
            dt_model_set_decode(dec, t);
            good = dt_model_forward(dec, x + t, 1, 0, 0, 0, &out) == DT_OK;
            if (!good) { diag("position %d: %s", t, dt_last_error()); break; }
            ops->copy_d2h(got, out, sizeof got);
            for (int v = 0; v < V; v++) {
                double d = fabs((double)got[v] - want[t * V + v]), a = fabs((double)want[t * V + v]);
                if (d > worst) worst = d;
                if (a > scale) scale = a;
                if (!(d <= 1e-5 * (1.0 + a))) {
                    if (good) diag("   position %d, token %d: decode %.9g, full %.9g", t, v, (double)got[v],
                                   (double)want[t * V + v]);
                    good = 0;
                }
            }
        }
        ok(good, "decode: %s, sequence %d, the logits of all %d positions decoded one by one are the full forward's "
           "(largest difference %.3g, logits up to %.3g)", spec, seq, T, worst, scale);
    }
    dt_model_set_decode(dec, T);
    float x0 = 1.0f;
    is_int(dt_model_forward(dec, &x0, 1, 0, 0, 0, NULL), DT_ERR_INVALID, "decode: a position past the block is refused");
    like(dt_last_error(), "outside the block of 72", "decode: ... saying so");
    free(p);
    free(want);
    dt_model_free(full);
    dt_model_free(dec);
}

/* Every loss row is complete and named as --loss parses it. */
static void test_loss_rows(void) {
    for (int k = 0; k < DT_LOSS_COUNT; k++) {
        const dt_loss_def *d = dt_loss_def_of((dt_loss_kind)k);
        dt_loss_kind back = DT_LOSS_COUNT;
        ok(d && d->name && *d->name && dt_loss_parse(d->name, &back) == DT_OK && back == (dt_loss_kind)k &&
           !strcmp(dt_loss_name((dt_loss_kind)k), d->name), "loss row %d (%s): named, parsed back", k, d ? d->name : "?");
        ok(!(d && d->one_hot && d->windows), "loss %s: one-hot targets cannot score token windows", d ? d->name : "?");
    }
    ok(!dt_loss_def_of(DT_LOSS_COUNT), "no row past the last loss");
    dt_loss_kind k;
    ok(dt_loss_parse("l1", &k) == DT_ERR_INVALID && strstr(dt_last_error(), "expected ce or mse"),
       "an unknown loss: the message lists the rows (%s)", dt_last_error());
}

/* No fixed buffer cuts the user's text: gpt(...) arguments of any length, the
 * dropout probability as written, a module path that does not fit (refused, naming the
 * limit), a long value quoted whole in a message, and a long layer text marked as cut. */
static void test_long_text(void) {
    char spec[1024], val[320];
    int64_t window = 0;
    int vocab = 0;
    /* padding that puts "vocab=2560" across the 255th character of the arguments */
    snprintf(spec, sizeof spec, "gpt(layers=1, heads=2, dim=8, block=8,%212svocab=2560)", "");
    is_int(dt_spec_token_dims(spec, &window, &vocab), DT_OK, "a gpt(...) of %zu characters parses", strlen(spec));
    is_int(vocab, 2560, "... with vocab=2560, not cut to 25");
    is_int(window, 8, "... and its block");
    dt_spec s;
    is_int(dt_spec_parse("gpt(layers=1,heads=2,dim=8,block=8,dropout=0.1234567)", &s), DT_OK, "gpt with dropout parses");
    double p = NAN;
    for (int i = 0; i < s.n && isnan(p); i++)
        if (s.layers[i].kind == DT_LAYER_DROPOUT) p = dt_layer_arg(&s.layers[i], "p");
    ok(p == (double)0.1234567f, "its dropout layers get p = 0.1234567 as written, not 6 digits of it (got %.9g)", p);
    dt_spec_free(&s);

    /* a module path longer than a layer's name field holds */
    const char *lab = "abcdefghijabcdefghijabcdefghijabcdefghi";   /* 39 characters, the longest label */
    snprintf(spec, sizeof spec, "%s:seq(%s:relu)", lab, lab);
    expect_error(spec, &MNIST, DT_ERR_INVALID, "is longer than 47 characters", "a module path of 79 characters");
    like(dt_last_error(), "abcdefghijabcdefghijabcdefghijabcdefghi.abcdefghijabcdefghijabcdefghijabcdefghi",
         "... naming the whole path");

    /* a long value is quoted whole; a long layer text is shown as cut */
    memset(val, 'x', 300);
    val[300] = '\0';
    snprintf(spec, sizeof spec, "flatten linear(%s)", val);
    expect_error(spec, &MNIST, DT_ERR_INVALID, "expects a positive integer, got 'xxx", "a 300-character value");
    char want[340];
    snprintf(want, sizeof want, "got '%s'", val);
    like(dt_last_error(), want, "... quoted whole in the message");
    like(dt_last_error(), "layer 1 'linear(xxxxxxxxxxxxxxx", "the layer's text starts the message");
    like(dt_last_error(), "...':", "... and ends in '...' where it is cut");
}

/* gpt(...) arguments that are not finite, or not whole where an integer is meant, are
 * refused with a message giving the range; none reaches a conversion to an integer. */
static void test_gpt_numbers(void) {
    static const struct { const char *arg, *msg; } bad[] = {
        { "layers=nan", "'layers' expects a whole number from 1 to 1000, got 'nan'" },
        { "layers=-nan", "'layers' expects a whole number from 1 to 1000, got '-nan'" },
        { "heads=inf", "'heads' expects a whole number from 1 to 1024, got 'inf'" },
        { "dim=2.5", "'dim' expects a whole number from 1 to 1048576, got '2.5'" },
        { "vocab=NAN(1)", "'vocab' expects a whole number from 1 to 16777216, got 'NAN(1)'" },
        { "dropout=nan", "'dropout' expects a probability in [0, 1), got 'nan'" },
        { "dropout=-inf", "'dropout' expects a probability in [0, 1), got '-inf'" },
    };
    const dt_shape tokens = { 1, { 64 } };   /* the default block: every gpt here would build */
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char spec[96];
        snprintf(spec, sizeof spec, "gpt(%s)", bad[i].arg);
        expect_error(spec, &tokens, DT_ERR_INVALID, bad[i].msg, spec);
    }
    is_int(try_spec("gpt(layers=1,dropout=0.5)", &tokens), DT_OK, "gpt(layers=1,dropout=0.5) builds on (64) tokens");
    int64_t window = 0;
    int vocab = 0;
    is_int(dt_spec_token_dims("gpt(layers=2.0,heads=2,dim=8,block=8,vocab=1e2)", &window, &vocab), DT_OK,
           "whole numbers written 2.0 and 1e2 are taken");
    is_int(vocab, 100, "... as the integers they are");
}

/* The gradient array's part of layers [lo, hi) of m equals whole's. */
static int same_grads(dt_model *whole, dt_model *m, int lo, int hi) {
    int same = 1;
    for (int i = lo; i < hi; i++) {
        const dt_layer *L = dt_model_layer(m, i);
        for (int p = L->first_param; p < L->first_param + L->nparams; p++) {
            dt_tensor_info tw, tm;
            if (dt_model_param(whole, p, &tw) != DT_OK || dt_model_param(m, p, &tm) != DT_OK) return 0;
            same &= tw.numel == tm.numel && !memcmp(tw.grad, tm.grad, (size_t)tw.numel * sizeof(float));
        }
    }
    return same;
}

/* The running statistics of layers [lo, hi) of m equal whole's. */
static int same_buffers(dt_model *whole, dt_model *m, int lo, int hi) {
    const float *bw = dt_model_buffers(whole), *bm = dt_model_buffers(m);
    int same = 1;
    for (int i = lo; i < hi; i++) {
        const dt_layer *L = dt_model_layer(m, i);
        for (int t = 0; t < L->ntensors; t++)
            if (L->t[t].role == DT_TENSOR_BUFFER)
                same &= !memcmp(bw + L->t[t].offset, bm + L->t[t].offset, (size_t)L->t[t].numel * sizeof(float));
    }
    return same;
}

/* The pipeline's seam: a model cut into three stages at module boundaries, each stage a
 * model of its own running its range (forward from the previous stage's output,
 * backward from the next stage's input gradient), gives the outputs, loss, gradients
 * and running statistics of the whole model's pass, bit for bit; dropout, batchnorm,
 * residual blocks and recomputation included. A range that cuts a block is refused. */
static void test_ranges(void) {
    const dt_ops *ops = dt_ops_cpu();
    static const struct { const char *spec; dt_shape in; int recompute; } cases[] = {
        {"flatten linear(16) relu dropout(0.3) linear(8) gelu linear(4)", {1, {12}}, 0},
        {"conv(4,3,pad=1) bn relu residual(conv(4,3,pad=1) bn relu) residual(bn conv(4,1)) gap linear(4)",
         {3, {2, 5, 5}}, 0},
        {"conv(4,3,pad=1) bn relu residual(conv(4,3,pad=1) bn relu dropout(0.2)) residual(bn conv(4,1)) gap linear(4)",
         {3, {2, 5, 5}}, 1},
    };
    enum { B = 3 };
    int32_t labels[B];
    for (int i = 0; i < B; i++) labels[i] = (i * 3 + 1) % 4;
    const dt_loss ce = {.kind = DT_LOSS_CE};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *spec = cases[k].spec;
        dt_model_opts mo;
        dt_model_opts_default(&mo);
        mo.recompute = cases[k].recompute;
        dt_model *whole = NULL, *st[3] = {NULL, NULL, NULL};
        dt_model_build_ex(spec, &cases[k].in, ops, 5, B, &mo, &whole);
        for (int j = 0; j < 3; j++) dt_model_build_ex(spec, &cases[k].in, ops, 5, B, &mo, &st[j]);
        if (!ok(whole && st[0] && st[1] && st[2], "%s: four models", spec)) continue;
        int cuts[64], nmod = dt_model_modules(whole, cuts), n = dt_model_nlayers(whole);
        ok(nmod >= 3 && cuts[0] == 0 && cuts[nmod] == n, "%s: %d modules over %d layers", spec, nmod, n);
        int a = cuts[2], b = cuts[nmod - 2];   /* bn in the first stage, a block in the second */
        size_t in_numel = (size_t)dt_shape_numel(&cases[k].in);
        size_t d1 = (size_t)dt_model_layer(whole, a)->in_numel, d2 = (size_t)dt_model_layer(whole, b)->in_numel;
        float *x = malloc(B * in_numel * sizeof *x), *dx1 = malloc(B * d1 * sizeof *dx1),
              *dx2 = malloc(B * d2 * sizeof *dx2), y[B * 4], ys[B * 4];
        for (size_t i = 0; i < B * in_numel; i++) x[i] = (float)((i * 7919) % 103) / 51.0f - 1.0f;
        const float *yw = NULL, *y0 = NULL, *y1 = NULL, *y2 = NULL;
        float lw = -1.0f, ls = -2.0f;
        int run = dt_model_forward(whole, x, B, 1, 2, 40, &yw) == DT_OK;
        if (run) memcpy(y, yw, sizeof y);
        run = run && dt_model_loss_backward(whole, &ce, labels, B, (float)B, &lw) == DT_OK;
        run = run && dt_model_forward_range(st[0], 0, a, x, B, 1, 2, 40, &y0) == DT_OK &&
              dt_model_forward_range(st[1], a, b, y0, B, 1, 2, 40, &y1) == DT_OK &&
              dt_model_forward_range(st[2], b, n, y1, B, 1, 2, 40, &y2) == DT_OK;
        if (run) memcpy(ys, y2, sizeof ys);   /* the loss's gradient takes the outputs' place */
        run = run && dt_model_loss_backward_to(st[2], &ce, labels, B, (float)B, &ls, dx2) == DT_OK &&
              dt_model_backward_range(st[1], a, b, dx2, dx1) == DT_OK &&
              dt_model_backward_range(st[0], 0, a, dx1, NULL) == DT_OK;
        if (ok(run, "%s: three stages [0,%d) [%d,%d) [%d,%d) run forward and backward (%s)", spec, a, a, b, b, n,
               run ? "ok" : dt_last_error())) {
            ok(!memcmp(y, ys, sizeof y) && lw == ls, "%s: the last stage's outputs and loss are the whole model's", spec);
            ok(same_grads(whole, st[0], 0, a) && same_grads(whole, st[1], a, b) && same_grads(whole, st[2], b, n),
               "%s: each stage's gradients are the whole model's, bit for bit", spec);
            ok(same_buffers(whole, st[0], 0, a) && same_buffers(whole, st[1], a, b) && same_buffers(whole, st[2], b, n),
               "%s: each stage's running statistics are the whole model's", spec);
        }
        /* a range inside a block, and a backward over layers the forward did not run */
        if (cases[k].in.ndim == 3) {
            int inside = cuts[3] + 1;   /* the first residual block is module 3 */
            ok(dt_model_forward_range(st[1], inside, n, y1, B, 1, 0, 0, NULL) == DT_ERR_INVALID &&
               strstr(dt_last_error(), "cut a residual block"), "%s: a range from inside a block is refused (%s)", spec,
               dt_last_error());
        }
        ok(dt_model_backward_range(st[2], 0, n, dx2, NULL) == DT_ERR_INVALID && strstr(dt_last_error(), "not all run"),
           "%s: a backward over layers its forward did not run is refused", spec);
        free(x);
        free(dx1);
        free(dx2);
        dt_model_free(whole);
        for (int j = 0; j < 3; j++) dt_model_free(st[j]);
    }
}

int main(void) {
    test_loss_rows();
    test_ranges();
    test_parse();
    test_shape_parse();
    test_files();
    test_errors();
    test_summary();
    test_tree();
    test_built();
    test_bn_record();
    test_against_torch();
    test_decode("gpt(layers=2,heads=2,dim=16,block=72,vocab=13)");
    test_decode("llama(layers=2,heads=4,kv_heads=2,dim=16,hidden=24,block=72,vocab=13)");
    test_decode("llama(layers=1,heads=4,kv_heads=1,dim=16,hidden=24,block=72,vocab=13,theta=500000)");
    test_long_text();
    test_gpt_numbers();
    return done_testing();
}
