/* test_ckpt.c: training checkpoints (ckpt.h) on the CPU backend: the XXH64
 * checksum against reference values, a bitwise round trip of model, buffers
 * and optimizer state (SGD and AdamW) and of a step taken after resuming,
 * keep-last-K pruning, the newest valid checkpoint in the presence of
 * truncated, bit-flipped, mixed and half-written ones, dead writers'
 * leftovers, and every refusal (another model, another optimizer, a missing
 * directory, bad arguments) leaving the model untouched; and dt_model_load of a
 * GPT-2 in Hugging Face's layout (names, Conv1D weights, mask buffers, the tied
 * head), with its refusals. */
#include "config.h" /* _GNU_SOURCE: memmem */

#include "ckpt.h"
#include "ckpt_impl.h" /* dt_ckpt_save_: reusing a pruned checkpoint's files */
#include "checkpoint.h"
#include "hash.h"
#include "tap.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SPEC  "flatten linear(16) bn relu linear(4)"
#define OTHER "flatten linear(8) bn relu linear(4)"
#define B 8

static const dt_shape IN = {3, {1, 4, 4}};
static char tmpdir[256];

/* ---- helpers ------------------------------------------------------------------- */

static const char *pth(const char *a, const char *b) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    if (snprintf(buf[k], sizeof buf[k], "%s/%s", a, b) >= (int)sizeof buf[k]) {
        printf("Bail out! path too long: %s/%s\n", a, b);
        exit(1);
    }
    return buf[k];
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    long len = -1;
    *n = 0;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)len + 1)) != NULL)
        *n = fread(b, 1, (size_t)len, f);
    fclose(f);
    return b;
}

static void spit(const char *path, const void *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
        printf("Bail out! cannot write %s\n", path);
        exit(1);
    }
}

static int exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* Number of entries of dir starting with prefix. */
static int count_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static void rm_rf(const char *path) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) diag("could not remove %s", path);
}

static dt_model *build(const char *spec, uint64_t seed) {
    dt_model *m = NULL;
    if (dt_model_build(spec, &IN, dt_ops_cpu(), seed, B, &m) != DT_OK) {
        printf("Bail out! building %s: %s\n", spec, dt_last_error());
        exit(1);
    }
    return m;
}

static dt_optim *optim(int adamw, dt_model *m, float momentum) {
    dt_optim_config c = adamw ? dt_optim_defaults(DT_OPTIM_ADAMW, 1e-2f) : dt_optim_defaults(DT_OPTIM_SGD, 0.1f);
    if (!adamw) c.momentum = momentum;
    dt_optim *o = NULL;
    if (dt_optim_init(&c, dt_ops_cpu(), dt_model_nparams(m), &o) != DT_OK) {
        printf("Bail out! optimizer: %s\n", dt_last_error());
        exit(1);
    }
    return o;
}

/* One training step on batch number k (deterministic data from k). */
static void train_step(dt_model *m, dt_optim *o, int k) {
    float x[B * 16];
    int32_t y[B];
    unsigned r = 12345u + 977u * (unsigned)k;
    for (int i = 0; i < B * 16; i++) {
        r = r * 1664525u + 1013904223u;
        x[i] = (float)((r >> 8) & 0xFFFF) / 32768.0f - 1.0f;
    }
    for (int i = 0; i < B; i++) y[i] = (i + k) % 4;
    dt_loss loss = {DT_LOSS_CE, 0.0f};
    if (dt_model_forward(m, x, B, 1, 0, (int64_t)k * B, NULL) != DT_OK ||
        dt_model_loss_backward(m, &loss, y, B, (float)B, NULL) != DT_OK ||
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), 0.1f, 1.0f) != DT_OK) {
        printf("Bail out! training step: %s\n", dt_last_error());
        exit(1);
    }
}

/* Everything a checkpoint should bring back, as bytes: params, buffers,
 * num_batches_tracked values, optimizer state arrays, step count. */
typedef struct {
    unsigned char *p;
    size_t         n;
} snap;

static snap take(dt_model *m, dt_optim *o) {
    size_t np = dt_model_nparams(m), nb = dt_model_nbuffers(m), no = o ? dt_optim_size(o) : 0;
    int ns = o ? dt_optim_nstate(o) : 0;
    snap s = {NULL, 0};
    size_t cap = (np + nb + (size_t)ns * no) * 4 + 64 * 8 + 8;
    s.p = malloc(cap);
    if (!s.p) exit(1);
#define PUT(src, len) do { memcpy(s.p + s.n, (src), (len)); s.n += (len); } while (0)
    PUT(dt_model_params(m), np * 4);
    PUT(dt_model_buffers(m), nb * 4);
    for (int i = 0; i < dt_model_nstate(m) && s.n + 8 <= cap; i++) {
        dt_tensor_info ti;
        if (dt_model_state(m, i, &ti) == DT_OK && ti.on_host) PUT(ti.data, 8);
    }
    for (int i = 0; i < ns; i++) PUT(dt_optim_state(o, i), no * 4);
    if (o) {
        int64_t st = dt_optim_steps(o);
        PUT(&st, 8);
    }
#undef PUT
    return s;
}

static int same(snap a, snap b) { return a.n == b.n && memcmp(a.p, b.p, a.n) == 0; }

/* The state of (m, o) is bitwise a. */
static int holds(snap a, dt_model *m, dt_optim *o) {
    snap b = take(m, o);
    int r = same(a, b);
    free(b.p);
    return r;
}

/* Two models with their optimizers hold bitwise the same state. */
static int alike(dt_model *m1, dt_optim *o1, dt_model *m2, dt_optim *o2) {
    snap a = take(m1, o1);
    int r = holds(a, m2, o2);
    free(a.p);
    return r;
}

static dt_ckpt_info info_at(int64_t step) {
    dt_ckpt_info in;
    memset(&in, 0, sizeof in);
    in.step = step;
    in.epoch = 2;
    in.step_in_epoch = step % 7;
    in.seed = 0xFEEDFACECAFEBEEFULL;
    in.batch = 256;
    in.micro_batches = 4;
    in.world_size = 2;
    in.model_spec = SPEC;
    in.schedule = "cosine total=100 warmup=5 min=0";
    return in;
}

static int reuse;   /* save() writes over the files of the checkpoint it prunes */

static dt_status save(const char *dir, int keep, dt_model *m, dt_optim *o, int64_t step) {
    dt_ckpt_info in = info_at(step);
    char v[32];
    snprintf(v, sizeof v, "%.17g", 0.1 * (double)step);
    const char *extra[] = {"loss_sum", v, "note", "a \"quoted\"\nline"};
    return reuse ? dt_ckpt_save_(dir, keep, 1, m, o, &in, extra, 2) : dt_ckpt_save(dir, keep, m, o, &in, extra, 2);
}

static ino_t inode(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? st.st_ino : 0;
}

/* ---- tests ------------------------------------------------------------------- */

static void test_hash(void) {
    /* reference values of XXH64 with seed 0 */
    ok(dt_xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL, "xxh64(\"\")");
    ok(dt_xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ULL, "xxh64(\"abc\")");
    const char *s = "Nobody inspects the spammish repetition";
    ok(dt_xxh64(s, strlen(s), 0) == 0xFBCEA83C8A378BF1ULL, "xxh64 over 32-byte stripes (39 bytes)");
    ok(dt_xxh64("abc", 3, 1) != dt_xxh64("abc", 3, 0), "the seed changes the hash");
    /* in pieces: the same value however the bytes are cut (stripes begun in one piece and
     * ended in another, empty pieces, a digest taken midway changes nothing) */
    unsigned char buf[300];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131u + 7u);
    int same = 1;
    for (size_t n = 0; n <= sizeof buf; n += 1 + n / 8)
        for (size_t cut = 1; cut <= 70; cut += 3) {
            dt_xxh64_state st;
            dt_xxh64_init(&st, 17);
            for (size_t at = 0, k = 0; at < n; k++) {
                size_t piece = (cut * (k + 1)) % 41;   /* 0 .. 40 bytes, zero now and then */
                if (piece > n - at) piece = n - at;
                dt_xxh64_update(&st, buf + at, piece);
                if (k == 2) (void)dt_xxh64_digest(&st);
                at += piece;
                if (!piece && k > 1000) break;
            }
            same &= dt_xxh64_digest(&st) == dt_xxh64(buf, n, 17);
        }
    ok(same, "xxh64 in pieces (0-40 bytes each, lengths 0-300) equals it in one");
    dt_xxh64_state st;
    dt_xxh64_init(&st, 0);
    dt_xxh64_update(&st, s, 20);
    dt_xxh64_update(&st, s + 20, strlen(s) - 20);
    ok(dt_xxh64_digest(&st) == 0xFBCEA83C8A378BF1ULL, "xxh64 of the reference text in two pieces");
}

static void test_round_trip(int adamw) {
    const char *what = adamw ? "AdamW" : "SGD";
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/rt-%s/nested/ckpt", tmpdir, what);
    dt_model *a = build(SPEC, 1), *b = build(SPEC, 2);
    dt_optim *oa = optim(adamw, a, 0.9f), *ob = optim(adamw, b, 0.9f);
    for (int k = 0; k < 3; k++) train_step(a, oa, k);
    snap sa = take(a, oa);
    is_int(save(dir, 0, a, oa, 3), DT_OK, "%s: save into a directory that does not exist yet", what);
    dt_ckpt_path(dir, 3, path, sizeof path);
    like(path, "/step-000000000003", "%s: the checkpoint is DIR/step-<12 digits>", what);
    ok(exists(pth(path, "model.safetensors")) && exists(pth(path, "train_state.safetensors")),
       "%s: model.safetensors and train_state.safetensors are there", what);
    is_int(count_prefix(dir, ".tmp-"), 0, "%s: no temporary directory is left", what);
    ok(!holds(sa, b, ob), "%s: the fresh model differs before loading", what);
    dt_st_file *sf = NULL;
    if (dt_st_open(pth(path, "train_state.safetensors"), &sf) == DT_OK) {
        is_str(dt_st_meta_get(sf, "dtrain.optimizer"), dt_optim_def_in(oa)->name,
               "%s: train_state records the optimizer by its row's name", what);
        dt_st_close(sf);
    } else {
        ok(0, "%s: open train_state.safetensors: %s", what, dt_last_error());
    }

    dt_ckpt *c = NULL;
    is_int(dt_ckpt_load(path, b, ob, &c), DT_OK, "%s: load", what);
    ok(holds(sa, b, ob), "%s: params, buffers, num_batches_tracked, optimizer state and step count are bitwise "
       "the saved ones", what);
    if (c) {
        const dt_ckpt_info *in = dt_ckpt_info_of(c);
        dt_ckpt_info want = info_at(3);
        const dt_optim_config *oc = dt_optim_config_of(oa);
        ok(in->step == 3 && in->epoch == want.epoch && in->step_in_epoch == want.step_in_epoch &&
           in->seed == want.seed && in->batch == 256 && in->micro_batches == 4 && in->world_size == 2,
           "%s: step, epoch, step in epoch, seed, batch, S, world size come back", what);
        is_str(in->model_spec, SPEC, "%s: model spec comes back", what);
        is_str(in->schedule, want.schedule, "%s: schedule comes back", what);
        is_int(in->format, DT_CKPT_FORMAT, "%s: format version", what);
        ok(in->has_optim && in->optim.kind == oc->kind && in->optim.lr == oc->lr &&
           in->optim.weight_decay == oc->weight_decay && in->optim.momentum == oc->momentum &&
           in->optim.beta1 == oc->beta1 && in->optim.beta2 == oc->beta2 && in->optim.eps == oc->eps,
           "%s: optimizer kind and hyper-parameters come back exactly", what);
        is_int(in->optim_steps, 3, "%s: optimizer step count", what);
        is_str(dt_ckpt_extra(c, "loss_sum"), "0.30000000000000004", "%s: trainer key/value comes back", what);
        is_str(dt_ckpt_extra(c, "note"), "a \"quoted\"\nline", "%s: a value with quotes and a newline comes back",
               what);
        ok(dt_ckpt_extra(c, "nothing") == NULL, "%s: an absent extra key is NULL", what);
        dt_ckpt_close(c);
    }
    /* resuming: the next step from the loaded state is bitwise the uninterrupted one */
    train_step(a, oa, 3);
    train_step(b, ob, 3);
    ok(alike(a, oa, b, ob), "%s: a step after resuming is bitwise the uninterrupted step", what);

    /* the model file is a plain weights file as dt_model_save writes it */
    dt_model *w = build(SPEC, 3);
    is_int(dt_model_load(w, pth(path, "model.safetensors")), DT_OK, "%s: model.safetensors loads with dt_model_load",
           what);
    ok(memcmp(dt_model_params(w), sa.p, dt_model_nparams(w) * 4) == 0, "%s: ... giving the saved weights", what);
    const char *plain = pth(tmpdir, adamw ? "plain-adamw.safetensors" : "plain-sgd.safetensors");
    dt_st_file *f1 = NULL, *f2 = NULL;
    const char *meta[] = {"format", "pt"};
    is_int(dt_model_save(w, plain, meta, 1), DT_OK, "%s: dt_model_save of the same weights", what);
    dt_st_open(plain, &f1);
    dt_st_open(pth(path, "model.safetensors"), &f2);
    int eq = f1 && f2 && dt_st_count(f1) == dt_st_count(f2);
    for (size_t i = 0; eq && i < dt_st_count(f1); i++) {
        dt_st_tensor t1, t2;
        eq = dt_st_tensor_at(f1, i, &t1) == DT_OK && dt_st_tensor_at(f2, i, &t2) == DT_OK &&
             strcmp(t1.name, t2.name) == 0 && t1.dtype == t2.dtype && t1.ndim == t2.ndim && t1.nbytes == t2.nbytes &&
             memcmp(t1.shape, t2.shape, sizeof t1.shape) == 0 && memcmp(t1.data, t2.data, t1.nbytes) == 0;
    }
    ok(eq, "%s: model.safetensors holds the tensors of dt_model_save, in the same order, bit for bit", what);
    dt_st_close(f1);
    dt_st_close(f2);
    free(sa.p);
    dt_model_free(w);
    dt_optim_free(oa);
    dt_optim_free(ob);
    dt_model_free(a);
    dt_model_free(b);
}

static void test_keep_and_latest(void) {
    char dir[512], path[1024], skipped[2048];
    snprintf(dir, sizeof dir, "%s/keep", tmpdir);
    dt_model *m = build(SPEC, 1);
    dt_optim *o = optim(0, m, 0.9f);
    int okall = 1;
    for (int64_t s = 1; s <= 5; s++) {
        train_step(m, o, (int)s);
        okall &= save(dir, 3, m, o, s * 10) == DT_OK;
    }
    ok(okall, "five saves with keep 3");
    ok(!exists(pth(dir, "step-000000000010")) && !exists(pth(dir, "step-000000000020")) &&
       exists(pth(dir, "step-000000000030")) && exists(pth(dir, "step-000000000040")) &&
       exists(pth(dir, "step-000000000050")), "keep 3 leaves the three newest");
    is_int(count_prefix(dir, "step-"), 3, "exactly three checkpoints");
    is_int(dt_ckpt_latest(dir, path, sizeof path, skipped, sizeof skipped), DT_OK, "latest");
    like(path, "step-000000000050", "latest picks the newest");
    is_str(skipped, "", "nothing skipped");

    /* a save of an older step (a run resumed from before) never deletes newer ones */
    is_int(save(dir, 1, m, o, 35), DT_OK, "save step 35 with keep 1");
    ok(exists(pth(dir, "step-000000000035")) && exists(pth(dir, "step-000000000040")) &&
       exists(pth(dir, "step-000000000050")) && !exists(pth(dir, "step-000000000030")),
       "keep 1 removed the older step 30 but not the newer 40, 50");

    /* keep 0 keeps everything */
    is_int(save(dir, 0, m, o, 60), DT_OK, "save with keep 0");
    is_int(count_prefix(dir, "step-"), 4, "keep 0 removed nothing");

    /* saving a step that exists replaces it as a whole */
    snap before = take(m, o);
    train_step(m, o, 99);
    is_int(save(dir, 0, m, o, 60), DT_OK, "save step 60 again");
    dt_model *r = build(SPEC, 7);
    dt_optim *ro = optim(0, r, 0.9f);
    dt_ckpt_latest(dir, path, sizeof path, NULL, 0);
    is_int(dt_ckpt_load(path, r, ro, NULL), DT_OK, "load the replaced step 60");
    ok(alike(r, ro, m, o) && !holds(before, r, ro), "the replacement holds the new state");
    is_int(count_prefix(dir, ".tmp-"), 0, "no temporary directory left after a replacement");
    free(before.p);
    dt_optim_free(ro);
    dt_model_free(r);
    dt_optim_free(o);
    dt_model_free(m);
}

/* Damage the newest checkpoint in several ways; each time it is refused and
 * latest falls back to the one before. */
static void test_damage(void) {
    char dir[512], path[1024], skipped[4096];
    snprintf(dir, sizeof dir, "%s/damage", tmpdir);
    dt_model *m = build(SPEC, 1);
    dt_optim *o = optim(0, m, 0.9f);
    train_step(m, o, 0);
    is_int(save(dir, 0, m, o, 100), DT_OK, "save step 100");
    train_step(m, o, 1);
    is_int(save(dir, 0, m, o, 200), DT_OK, "save step 200");
    char newest[1024];
    dt_ckpt_path(dir, 200, newest, sizeof newest);

    const char *files[] = {"model.safetensors", "train_state.safetensors"};
    for (int f = 0; f < 2; f++) {
        const char *fp = pth(newest, files[f]);
        size_t n;
        unsigned char *orig = slurp(fp, &n);
        ok(orig && n > 200, "%s read (%zu bytes)", files[f], n);
        if (!orig) continue;
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = (hl << 8) | orig[i];
        size_t cuts[] = {0, 5, 8, 8 + (size_t)hl / 2, 8 + (size_t)hl, 8 + (size_t)hl + 3, n - 4, n - 1};
        int refused = 0, fell_back = 0, named = 0;
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            spit(fp, orig, cuts[i]);
            dt_ckpt *c = NULL;
            refused += dt_ckpt_open(newest, &c) == DT_ERR_FORMAT;
            dt_ckpt_close(c);
            fell_back += dt_ckpt_latest(dir, path, sizeof path, skipped, sizeof skipped) == DT_OK &&
                         strstr(path, "step-000000000100") != NULL;
            named += strstr(skipped, "step-000000000200") != NULL && strstr(skipped, files[f]) != NULL;
        }
        is_int(refused, 8, "%s truncated at 8 points: refused as corrupt each time", files[f]);
        is_int(fell_back, 8, "%s truncated: latest falls back to step 100 each time", files[f]);
        is_int(named, 8, "%s truncated: the skipped message names the checkpoint and file", files[f]);

        /* one flipped bit in the last data byte */
        orig[n - 1] ^= 0x10;
        spit(fp, orig, n);
        dt_ckpt *c = NULL;
        is_int(dt_ckpt_open(newest, &c), DT_ERR_FORMAT, "%s with a flipped data bit is refused", files[f]);
        like(dt_last_error(), "checksum mismatch", "%s: the error says checksum mismatch", files[f]);
        dt_ckpt_latest(dir, path, sizeof path, skipped, sizeof skipped);
        like(path, "step-000000000100", "%s flipped: latest falls back to step 100", files[f]);
        like(skipped, "checksum mismatch", "%s flipped: the skipped message says why", files[f]);
        orig[n - 1] ^= 0x10;

        /* a changed metadata digit (same length, valid JSON) */
        const char *key = f ? "\"dtrain.step_in_epoch\":\"" : "\"dtrain.step\":\"";
        unsigned char *at = memmem(orig, n, key, strlen(key));
        ok(at != NULL, "%s: found %s in the header", files[f], key);
        if (at) {
            unsigned char *d = at + strlen(key), was = *d;
            *d = was == '1' ? '2' : '1';
            spit(fp, orig, n);
            is_int(dt_ckpt_open(newest, &c), DT_ERR_FORMAT, "%s with an edited metadata value is refused", files[f]);
            *d = was;
        }
        spit(fp, orig, n);
        is_int(dt_ckpt_open(newest, &c), DT_OK, "%s restored: the checkpoint verifies again", files[f]);
        dt_ckpt_close(c);
        free(orig);
    }

    /* files of two different saves in one directory */
    size_t n;
    char older[1024];
    dt_ckpt_path(dir, 100, older, sizeof older);
    unsigned char *keep = slurp(pth(newest, "model.safetensors"), &n), *other;
    size_t on;
    other = slurp(pth(older, "model.safetensors"), &on);
    spit(pth(newest, "model.safetensors"), other, on);
    dt_ckpt *c = NULL;
    is_int(dt_ckpt_open(newest, &c), DT_ERR_FORMAT, "a model.safetensors from another save is refused");
    like(dt_last_error(), "is not the one", "the error says the files do not belong together");
    spit(pth(newest, "model.safetensors"), keep, n);
    free(keep);
    free(other);

    /* a crashed writer: half-written .tmp-* with a dead pid, a step-* without files */
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    char tmpname[128], tmpp[1024], live[128];
    snprintf(tmpname, sizeof tmpname, ".tmp-step-000000000300-%ld", (long)child);
    snprintf(tmpp, sizeof tmpp, "%s", pth(dir, tmpname));
    mkdir(tmpp, 0755);
    spit(pth(tmpp, "model.safetensors"), "half", 4);
    snprintf(live, sizeof live, ".tmp-step-000000000400-%ld", (long)getppid());
    mkdir(pth(dir, live), 0755);
    mkdir(pth(dir, "step-000000000500"), 0755);
    is_int(dt_ckpt_latest(dir, path, sizeof path, skipped, sizeof skipped), DT_OK, "latest with leftovers");
    like(path, "step-000000000200", "latest ignores .tmp-* and skips an empty step-500");
    like(skipped, "step-000000000500", "the empty step-500 is reported as skipped");
    is_int(save(dir, 0, m, o, 250), DT_OK, "the next save");
    ok(!exists(tmpp), "the next save removed the dead writer's .tmp-* directory");
    ok(exists(pth(dir, live)), "a .tmp-* of a live process is left alone");
    rmdir(pth(dir, live));
    rmdir(pth(dir, "step-000000000500"));

    /* every checkpoint damaged */
    char emptyd[512];
    snprintf(emptyd, sizeof emptyd, "%s/alldamaged", tmpdir);
    mkdir(emptyd, 0755);
    mkdir(pth(emptyd, "step-000000000001"), 0755);
    is_int(dt_ckpt_latest(emptyd, path, sizeof path, NULL, 0), DT_ERR_FORMAT, "only damaged checkpoints: an error");
    like(dt_last_error(), "no valid checkpoint in", "... saying there is no valid checkpoint");
    dt_optim_free(o);
    dt_model_free(m);
}

/* Pruning and replacing touch only what dtrain writes. A user's step-5/ and
 * .tmp-mine-<dead pid>/, and directories of dtrain's names that hold anything
 * else, survive every save; a dead writer's leftovers (dtrain's files only) go. */
static void test_foreign(void) {
    char dir[512], name[128], d[16][1024];
    snprintf(dir, sizeof dir, "%s/foreign", tmpdir);
    dt_model *m = build(SPEC, 1);
    dt_optim *o = optim(0, m, 0.9f);
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    is_int(save(dir, 1, m, o, 1), DT_OK, "a first checkpoint");
    size_t sn;
    unsigned char *state = slurp(pth(pth(dir, "step-000000000001"), "train_state.safetensors"), &sn);
    ok(state != NULL, "its state file");
    /* the user's: other names, and dtrain's names with more inside */
    const char *kept[] = {"step-5", ".tmp-mine-%ld", "step-000000000002", "step-000000000003", "step-000000000004",
                          ".tmp-step-000000000005-%ld"};
    const char *gone[] = {".tmp-del-000000000006-%ld", ".tmp-step-000000000007-%ld"};
    int nk = (int)(sizeof kept / sizeof kept[0]), ng = (int)(sizeof gone / sizeof gone[0]);
    for (int i = 0; i < nk + ng; i++) {
        snprintf(name, sizeof name, i < nk ? kept[i] : gone[i - nk], (long)child);
        snprintf(d[i], sizeof d[i], "%s", pth(dir, name));
        mkdir(d[i], 0755);
    }
    spit(pth(d[0], "results.txt"), "mine\n", 5);
    spit(pth(d[1], "notes"), "mine\n", 5);
    spit(pth(d[2], "train_state.safetensors"), state, sn);     /* a checkpoint's file and a foreign one */
    spit(pth(d[2], "results.txt"), "mine\n", 5);
    spit(pth(d[3], "train_state.safetensors"), state, sn);     /* ... and a subdirectory */
    mkdir(pth(d[3], "plots"), 0755);
    spit(pth(d[4], "model.safetensors"), "half", 4);           /* no state file: not a checkpoint */
    spit(pth(d[5], "results.csv"), "mine\n", 5);
    spit(pth(d[6], "model.safetensors.tmp.Ab12Cd"), "half", 4);   /* a killed writer's: removed */
    spit(pth(d[6], "train_state.safetensors"), state, sn);
    free(state);
    /* a user's directory under the name of a step that is saved later */
    char later[1024];
    snprintf(later, sizeof later, "%s", pth(dir, "step-000000000020"));
    mkdir(later, 0755);
    spit(pth(later, "results.txt"), "mine\n", 5);

    is_int(save(dir, 1, m, o, 10), DT_OK, "a save with keep 1 beside them");
    ok(!exists(pth(dir, "step-000000000001")), "it removed the older checkpoint");
    for (int i = 0; i < nk; i++) ok(exists(d[i]), "it left %s alone", strrchr(d[i], '/') + 1);
    ok(exists(pth(d[0], "results.txt")) && exists(pth(d[1], "notes")) && exists(pth(d[2], "results.txt")) &&
       exists(pth(d[3], "plots")) && exists(pth(d[5], "results.csv")), "... and everything in them");
    for (int i = nk; i < nk + ng; i++) ok(!exists(d[i]), "it removed the dead writer's %s", strrchr(d[i], '/') + 1);

    is_int(save(dir, 1, m, o, 20), DT_ERR_IO, "a save of step 20 over the user's step-000000000020 is refused");
    like(dt_last_error(), "step-000000000020 exists and holds files that are not a checkpoint's",
         "... naming the directory");
    ok(exists(pth(later, "results.txt")), "... and the user's file is still there");
    ok(exists(pth(dir, "step-000000000010")), "the previous checkpoint is still there");
    char tmpn[128];
    snprintf(tmpn, sizeof tmpn, ".tmp-step-000000000030-%ld", (long)getpid());
    mkdir(pth(dir, tmpn), 0755);
    spit(pth(pth(dir, tmpn), "results.txt"), "mine\n", 5);
    is_int(save(dir, 1, m, o, 30), DT_ERR_IO, "a save whose temporary name is taken by a user's directory is refused");
    ok(exists(pth(pth(dir, tmpn), "results.txt")), "... leaving it as it was");
    dt_optim_free(o);
    dt_model_free(m);
}

/* Writers killed (SIGKILL) at random moments while saving, replacing and
 * pruning: every step-* left behind verifies, and the next save cleans up. */
static void test_crash(void) {
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, "%s/crash%s", tmpdir, reuse ? "-reuse" : "");
    diag("writers killed while saving%s", reuse ? ", each over the files of the checkpoint it prunes" : "");
    dt_model *m = build(SPEC, 1);
    dt_optim *o = optim(0, m, 0.9f);
    train_step(m, o, 0);
    is_int(save(dir, 2, m, o, 1), DT_OK, "a first checkpoint");
    unsigned r = 2024u;
    int all_valid = 1, kills = 0, saved = 0, tmp_seen = 0;
    for (int it = 0; it < 12; it++) {
        pid_t child = fork();
        if (child < 0) break;
        if (child == 0) {
            /* each step twice: the second save replaces the first; keep 2 prunes */
            for (int k = 0; k < 400; k++)
                if (save(dir, 2, m, o, 10 + 100 * it + k / 2) != DT_OK) _exit(3);
            _exit(0);
        }
        r = r * 1664525u + 1013904223u;
        usleep(1000 + (r >> 8) % 30000);
        kills += kill(child, SIGKILL) == 0;
        int st = 0;
        waitpid(child, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) != 0) diag("writer %d failed with status %d", it, WEXITSTATUS(st));
        DIR *d = opendir(dir);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, "step-", 5) != 0) continue;
            dt_ckpt *c = NULL;
            if (dt_ckpt_open(pth(dir, e->d_name), &c) != DT_OK) {
                all_valid = 0;
                diag("after kill %d: %s", it, dt_last_error());
            }
            saved++;
            dt_ckpt_close(c);
        }
        if (d) closedir(d);
        tmp_seen += count_prefix(dir, ".tmp-");
    }
    diag("%d writers killed, %d checkpoints checked, %d leftovers of interrupted saves", kills, saved, tmp_seen);
    ok(kills >= 10 && saved >= 12, "writers were killed while saving");
    ok(all_valid, "every step-* directory left by a killed writer verifies");
    is_int(dt_ckpt_latest(dir, path, sizeof path, NULL, 0), DT_OK, "latest after the kills");
    is_int(save(dir, 2, m, o, 100000), DT_OK, "a save after the kills");
    is_int(count_prefix(dir, ".tmp-"), 0, "it removed every leftover of the killed writers");
    is_int(count_prefix(dir, "step-"), 2, "and kept two checkpoints");
    dt_optim_free(o);
    dt_model_free(m);
}

/* Reusing the memory of the checkpoint a save prunes (ckpt_impl.h; the in-memory
 * snapshots do): its files are written over in place (the same inodes, so no fresh pages),
 * what the new checkpoint does not write is removed, the new one loads bitwise, and at
 * least one complete checkpoint stays while it is written (keep 1 reuses nothing). */
static void test_reuse(void) {
    char dir[512], p[1024], q[1024];
    snprintf(dir, sizeof dir, "%s/reuse", tmpdir);
    dt_model *m = build(SPEC, 5), *back = build(SPEC, 9);
    dt_optim *o = optim(1, m, 0.0f), *ob = optim(1, back, 0.0f);
    reuse = 1;
    for (int step = 1; step <= 2; step++) {
        train_step(m, o, step);
        is_int(save(dir, 2, m, o, step), DT_OK, "reusing: checkpoint %d of 2 kept (nothing to reuse yet)", step);
    }
    dt_ckpt_path(dir, 1, p, sizeof p);
    ino_t im = inode(pth(p, "model.safetensors")), is = inode(pth(p, "train_state.safetensors"));
    /* a file the next checkpoint does not write (as a run of another layout leaves) */
    spit(pth(p, "shard-00001-of-00002.safetensors"), "stale", 5);
    train_step(m, o, 3);
    snap want = take(m, o);
    is_int(save(dir, 2, m, o, 3), DT_OK, "a third checkpoint, over the files of the first");
    ok(!exists(p), "the first is gone (pruned: its files are the third's now)");
    dt_ckpt_path(dir, 3, q, sizeof q);
    ok(im && inode(pth(q, "model.safetensors")) == im && inode(pth(q, "train_state.safetensors")) == is,
       "the third's files are the first's, written over in place");
    ok(!exists(pth(q, "shard-00001-of-00002.safetensors")) && !exists(pth(q, DT_CKPT_REUSE_)),
       "what the third did not write over is removed");
    dt_ckpt_path(dir, 2, p, sizeof p);
    ok(exists(p), "the second stays");
    dt_ckpt *c = NULL;
    is_int(dt_ckpt_load(q, back, ob, &c), DT_OK, "the third loads: every checksum is valid");
    ok(holds(want, back, ob), "... and gives the state back bitwise");
    dt_ckpt_close(c);
    free(want.p);
    /* bigger files over smaller ones, then smaller over bigger: the same bytes as fresh files */
    dt_model *big = build("flatten linear(16) bn relu linear(8)", 2);
    dt_optim *obig = optim(1, big, 0.0f);
    is_int(save(dir, 2, big, obig, 4), DT_OK, "a bigger model's fourth, over the second");
    is_int(save(dir, 2, big, obig, 5), DT_OK, "and fifth, over the third");
    train_step(m, o, 6);
    is_int(save(dir, 2, m, o, 6), DT_OK, "the smaller model's sixth, over the bigger fourth");
    char fresh[512];
    snprintf(fresh, sizeof fresh, "%s/reuse-fresh", tmpdir);
    reuse = 0;
    is_int(save(fresh, 2, m, o, 6), DT_OK, "the same in fresh files");
    reuse = 1;
    dt_ckpt_path(dir, 6, q, sizeof q);
    dt_ckpt_path(fresh, 6, p, sizeof p);
    const char *files[] = {"model.safetensors", "train_state.safetensors"};
    for (int i = 0; i < 2; i++) {
        size_t na, nb;
        unsigned char *a = slurp(pth(q, files[i]), &na), *b = slurp(pth(p, files[i]), &nb);
        ok(a && b && na == nb && memcmp(a, b, na) == 0, "%s written over a bigger one: cut to the bytes of a fresh one "
           "(%zu and %zu bytes)", files[i], na, nb);
        free(a);
        free(b);
    }
    dt_optim_free(obig);
    dt_model_free(big);
    is_int(count_prefix(dir, ".tmp-"), 0, "no temporary directory is left");
    is_int(count_prefix(dir, "step-"), 2, "two checkpoints are kept");
    /* keep 1: the only checkpoint is not reused while the next is written */
    dt_ckpt_path(dir, 6, p, sizeof p);
    im = inode(pth(p, "model.safetensors"));
    train_step(m, o, 7);
    is_int(save(dir, 1, m, o, 7), DT_OK, "with keep 1 a seventh is saved");
    dt_ckpt_path(dir, 7, q, sizeof q);
    ok(inode(pth(q, "model.safetensors")) != im && !exists(p), "in fresh files: the sixth stayed until it was installed");
    /* a dead writer's temporary directory holding reused files is a leftover like any other */
    char t[1024];
    snprintf(t, sizeof t, "%s/.tmp-step-000000000019-999999999", dir);
    mkdir(t, 0755);
    mkdir(pth(t, DT_CKPT_REUSE_), 0755);
    spit(pth(pth(t, DT_CKPT_REUSE_), "model.safetensors"), "x", 1);
    is_int(save(dir, 2, m, o, 8), DT_OK, "a save beside a dead writer's temporary directory with reused files");
    ok(!exists(t), "which it removed");
    /* a user's file in a .reuse directory makes it not ours: left alone */
    mkdir(t, 0755);
    mkdir(pth(t, DT_CKPT_REUSE_), 0755);
    spit(pth(pth(t, DT_CKPT_REUSE_), "notes.txt"), "mine", 4);
    is_int(save(dir, 2, m, o, 9), DT_OK, "a save beside one holding a user's file");
    ok(exists(pth(pth(t, DT_CKPT_REUSE_), "notes.txt")), "which it left alone");
    reuse = 0;
    dt_optim_free(ob);
    dt_optim_free(o);
    dt_model_free(back);
    dt_model_free(m);
}

/* A sharded checkpoint whose shards hold fewer parameters than the model its manifest
 * names (checksums all valid) is refused on every restore, with an optimizer or without
 * one as `dtrain export` restores, never completed with the model's fresh initialisation. */
static void test_shard_coverage(void) {
    char dir[512], tmp[1024], path[1024];
    snprintf(dir, sizeof dir, "%s/coverage", tmpdir);
    /* BIGGER has SPEC's buffers (bn over 16 features) and more parameters */
    const char *bigger = "flatten linear(16) bn relu linear(8)";
    dt_model *a = build(SPEC, 1), *big = build(bigger, 2), *big2 = build(bigger, 2);
    size_t na = dt_model_nparams(a), nb = dt_model_nparams(big), half = na / 2;
    dt_ckpt_info in = info_at(4);
    in.model_spec = bigger;
    size_t lo[2] = {0, half}, len[2] = {half, na - half};
    char sums[2][24];
    /* each "rank" with its optimizer's shard, as a --shard optim run writes them */
    dt_optim_config oc = dt_optim_defaults(DT_OPTIM_SGD, 0.1f);
    oc.momentum = 0.9f;
    dt_optim *o = optim(0, a, 0.9f), *os[2] = {NULL, NULL};
    dt_status s = DT_OK;
    for (int r = 0; r < 2 && s == DT_OK; r++) s = dt_optim_init(&oc, dt_ops_cpu(), len[r], &os[r]);
    if (s == DT_OK) s = dt_ckpt_begin(dir, 4, tmp, sizeof tmp);
    for (int r = 0; r < 2 && s == DT_OK; r++) s = dt_ckpt_write_shard(tmp, r, 2, a, os[r], lo[r], len[r], sums[r]);
    if (s == DT_OK) s = dt_ckpt_commit(dir, 0, tmp, a, o, &in, NULL, 0, 2, lo, len, (const char (*)[24])sums);
    is_int(s, DT_OK, "a sharded checkpoint of %zu parameters naming a model of %zu", na, nb);
    dt_ckpt_path(dir, 4, path, sizeof path);
    dt_ckpt *c = NULL;
    is_int(dt_ckpt_open(path, &c), DT_OK, "it opens: every checksum is valid");
    if (c) {
        is_int(dt_ckpt_restore_range(c, big, 0, nb, NULL, 0), DT_ERR_FORMAT,
               "restoring all of the bigger model without an optimizer is refused");
        char want[128];
        snprintf(want, sizeof want, "its 2 shards hold %zu parameters, the model has %zu", na, nb);
        like(dt_last_error(), want, "... saying what the shards hold");
        is_int(dt_ckpt_restore_range(c, big, 0, half, NULL, 0), DT_ERR_FORMAT, "... and so is a range the shards hold");
        ok(memcmp(dt_model_params(big), dt_model_params(big2), nb * sizeof(float)) == 0,
           "the model is left as it was");
        dt_ckpt_close(c);
    }
    for (int r = 0; r < 2; r++) dt_optim_free(os[r]);
    dt_optim_free(o);
    dt_model_free(big2);
    dt_model_free(big);
    dt_model_free(a);
}

/* Every file written twice, once by a CPU model (the writer reads the state where it is)
 * and once by the same model on a backend whose memory is not the host's (as a GPU's:
 * the state copied to a host buffer first): the same bytes, whole and sharded. */
static void test_device_copy(void) {
    dt_ops dev = *dt_ops_cpu();
    dev.host_memory = 0;
    const dt_ops *ops[2] = {dt_ops_cpu(), &dev};
    dt_model *m[2] = {build(SPEC, 3), NULL};
    if (dt_model_build(SPEC, &IN, &dev, 3, B, &m[1]) != DT_OK) {
        printf("Bail out! building %s: %s\n", SPEC, dt_last_error());
        exit(1);
    }
    size_t n = dt_model_nparams(m[0]), half = n / 2, lo[2] = {0, half}, len[2] = {half, n - half};
    dt_optim_config c = dt_optim_defaults(DT_OPTIM_ADAMW, 1e-2f);
    dt_optim *o[2] = {NULL, NULL}, *os[2][2] = {{NULL, NULL}, {NULL, NULL}};
    dt_status s = DT_OK;
    char dir[2][512], sdir[2][512], tmp[1024], sums[2][2][24];
    dt_ckpt_info in = info_at(6);
    for (int k = 0; k < 2 && s == DT_OK; k++) {
        s = dt_optim_init(&c, ops[k], n, &o[k]);
        for (int r = 0; r < 2 && s == DT_OK; r++) s = dt_optim_init(&c, ops[k], len[r], &os[k][r]);
        for (int i = 0; s == DT_OK && i < dt_optim_nstate(o[k]); i++) {   /* a state that is not all zeros */
            float *st = dt_optim_state(o[k], i);
            for (size_t j = 0; j < n; j++) st[j] = (float)((j * 7 + (size_t)i) % 13) * 0.25f;
            for (int r = 0; r < 2; r++) memcpy(dt_optim_state(os[k][r], i), st + lo[r], len[r] * sizeof(float));
        }
        snprintf(dir[k], sizeof dir[k], "%s/device-%d", tmpdir, k);
        snprintf(sdir[k], sizeof sdir[k], "%s/device-sharded-%d", tmpdir, k);
        if (s == DT_OK) s = dt_ckpt_save(dir[k], 1, m[k], o[k], &in, NULL, 0);
        if (s == DT_OK) s = dt_ckpt_begin(sdir[k], 6, tmp, sizeof tmp);
        for (int r = 0; r < 2 && s == DT_OK; r++)
            s = dt_ckpt_write_shard(tmp, r, 2, m[k], os[k][r], lo[r], len[r], sums[k][r]);
        if (s == DT_OK)
            s = dt_ckpt_commit(sdir[k], 1, tmp, m[k], o[k], &in, NULL, 0, 2, lo, len, (const char (*)[24])sums[k]);
    }
    is_int(s, DT_OK, "a checkpoint written from host memory and from a backend's copy, whole and sharded");
    const char *files[] = {"model.safetensors", "train_state.safetensors", "shard-00000-of-00002.safetensors",
                           "shard-00001-of-00002.safetensors"};
    for (int f = 0; f < 4; f++) {
        char p0[1024], p1[1024];
        const char *d0 = f < 2 ? dir[0] : sdir[0], *d1 = f < 2 ? dir[1] : sdir[1];
        snprintf(p0, sizeof p0, "%s/step-000000000006/%s", d0, files[f]);
        snprintf(p1, sizeof p1, "%s/step-000000000006/%s", d1, files[f]);
        size_t n0 = 0, n1 = 0;
        unsigned char *b0 = slurp(p0, &n0), *b1 = slurp(p1, &n1);
        ok(b0 && b1 && n0 == n1 && memcmp(b0, b1, n0) == 0, "%s: the same %zu bytes either way", files[f], n0);
        free(b0);
        free(b1);
    }
    for (int k = 0; k < 2; k++) {
        for (int r = 0; r < 2; r++) dt_optim_free(os[k][r]);
        dt_optim_free(o[k]);
        dt_model_free(m[k]);
    }
}

/* Numbers read from a checkpoint are checked, even when its checksums are valid. */
static void test_bad_numbers(void) {
    char dir[512], ck[1024], moved[1024];
    snprintf(dir, sizeof dir, "%s/numbers", tmpdir);
    dt_model *m = build(SPEC, 1);
    dt_optim *o = optim(0, m, 0.9f);
    dt_ckpt_info in = info_at(12);
    in.micro_batches = 0;     /* a division by zero for a trainer that trusted it */
    is_int(dt_ckpt_save(dir, 0, m, o, &in, NULL, 0), DT_OK, "a checkpoint claiming 0 micro-batches is written");
    dt_ckpt_path(dir, 12, ck, sizeof ck);
    dt_ckpt *c = NULL;
    is_int(dt_ckpt_open(ck, &c), DT_ERR_FORMAT, "... and refused when opened");
    like(dt_last_error(), "\"dtrain.micro_batches\" = \"0\" is not an integer >= 1", "the message names the field");
    dt_ckpt_close(c);
    in = info_at(13);
    in.micro_batches = 3;     /* 256 is not divisible by 3 */
    is_int(dt_ckpt_save(dir, 0, m, o, &in, NULL, 0), DT_OK, "a checkpoint with an impossible batch split is written");
    dt_ckpt_path(dir, 13, ck, sizeof ck);
    is_int(dt_ckpt_open(ck, &c), DT_ERR_FORMAT, "... and refused when opened");
    like(dt_last_error(), "inconsistent metadata: batch 256, 3 micro-batches", "the message gives the numbers");
    dt_ckpt_close(c);
    is_int(save(dir, 0, m, o, 14), DT_OK, "a good checkpoint of step 14");
    dt_ckpt_path(dir, 14, ck, sizeof ck);
    snprintf(moved, sizeof moved, "%s/step-000000000099", dir);
    ok(rename(ck, moved) == 0, "renamed to step 99");
    is_int(dt_ckpt_open(moved, &c), DT_ERR_FORMAT, "a step-N directory holding another step is refused");
    like(dt_last_error(), "named for step 99 but holds step 14", "the message names both steps");
    dt_ckpt_close(c);
    dt_optim_free(o);
    dt_model_free(m);
}

static void test_refusals(void) {
    char dir[512], path[1024], ck[1024];
    snprintf(dir, sizeof dir, "%s/refuse", tmpdir);
    dt_model *m = build(SPEC, 1);
    dt_optim *o = optim(0, m, 0.9f);
    train_step(m, o, 0);
    is_int(save(dir, 0, m, o, 100), DT_OK, "save step 100");
    dt_ckpt_path(dir, 100, ck, sizeof ck);
    snprintf(path, sizeof path, "%s", ck);

    /* another model: the first mismatched tensor is named, nothing changes */
    dt_model *x = build(OTHER, 5);
    dt_optim *xo = optim(0, x, 0.9f);
    snap before = take(x, xo);
    is_int(dt_ckpt_load(path, x, xo, NULL), DT_ERR_FORMAT, "loading into another model fails");
    like(dt_last_error(), "step-000000000100/model.safetensors: tensor '1.weight' is F32 [16,16] in the file, the "
         "model expects F32 [8,16]", "the error names the file and the first mismatched tensor");
    ok(holds(before, x, xo), "the other model and its optimizer are unchanged");
    free(before.p);

    /* SGD state into AdamW */
    dt_model *y = build(SPEC, 6);
    dt_optim *yo = optim(1, y, 0);
    before = take(y, yo);
    is_int(dt_ckpt_load(path, y, yo, NULL), DT_ERR_FORMAT, "SGD state into AdamW fails");
    char want[1200];
    snprintf(want, sizeof want, "checkpoint %s was written by optimizer 'sgd'; this run uses 'adamw'", path);
    like(dt_last_error(), want, "the error names the checkpoint and both optimizers");
    ok(holds(before, y, yo), "the model is unchanged after the optimizer refusal");
    free(before.p);
    /* and AdamW state into SGD */
    char adir[512], apath[1024];
    snprintf(adir, sizeof adir, "%s/adamw-run", tmpdir);
    is_int(save(adir, 0, y, yo, 5), DT_OK, "save an AdamW checkpoint");
    dt_ckpt_path(adir, 5, apath, sizeof apath);
    dt_optim *so = optim(0, y, 0.9f);
    is_int(dt_ckpt_load(apath, y, so, NULL), DT_ERR_FORMAT, "AdamW state into SGD fails");
    snprintf(want, sizeof want, "checkpoint %s was written by optimizer 'adamw'; this run uses 'sgd'", apath);
    like(dt_last_error(), want, "... naming both");
    dt_optim_free(so);

    /* SGD with momentum into SGD without */
    dt_optim *zo = optim(0, y, 0.0f);
    is_int(dt_ckpt_load(path, y, zo, NULL), DT_ERR_FORMAT, "momentum state into SGD without momentum fails");
    like(dt_last_error(), "optim.momentum_buffer", "the error names the state array");
    /* weights only */
    is_int(dt_ckpt_load(path, y, NULL, NULL), DT_OK, "weights only (no optimizer) load");
    char wdir[512], wck[1024];
    snprintf(wdir, sizeof wdir, "%s/weights-only", tmpdir);
    dt_ckpt_info win = info_at(7);
    is_int(dt_ckpt_save(wdir, 0, m, NULL, &win, NULL, 0), DT_OK, "save without an optimizer");
    dt_ckpt_path(wdir, 7, wck, sizeof wck);
    is_int(dt_ckpt_load(wck, y, yo, NULL), DT_ERR_FORMAT, "loading it with an optimizer fails");
    like(dt_last_error(), "holds no optimizer state", "... saying the checkpoint holds none");

    /* missing and empty directories, not a checkpoint */
    char nodir[512], empty[512];
    snprintf(nodir, sizeof nodir, "%s/does-not-exist", tmpdir);
    is_int(dt_ckpt_latest(nodir, path, sizeof path, NULL, 0), DT_ERR_IO, "latest of a missing directory fails");
    like(dt_last_error(), "no checkpoint in", "... saying no checkpoint in DIR");
    like(dt_last_error(), "does-not-exist", "... naming the directory");
    snprintf(empty, sizeof empty, "%s/empty", tmpdir);
    mkdir(empty, 0755);
    is_int(dt_ckpt_latest(empty, path, sizeof path, NULL, 0), DT_ERR_IO, "latest of an empty directory fails");
    like(dt_last_error(), "no checkpoint in", "... saying no checkpoint in DIR");
    is_int(dt_ckpt_load(pth(nodir, "step-000000000001"), y, yo, NULL), DT_ERR_IO, "load of a missing checkpoint fails");
    like(dt_last_error(), "no such checkpoint", "... saying so");
    is_int(dt_ckpt_load(pth(ck, "model.safetensors"), y, yo, NULL), DT_ERR_INVALID, "load of a file, not a directory");
    like(dt_last_error(), "not a checkpoint directory", "... saying what was expected");

    /* bad arguments */
    dt_ckpt_info in = info_at(1);
    const char *dup[] = {"a", "1", "a", "2"};
    is_int(dt_ckpt_save(dir, -1, m, o, &in, NULL, 0), DT_ERR_INVALID, "keep -1 is refused");
    is_int(dt_ckpt_save(dir, 0, m, o, &in, dup, 2), DT_ERR_INVALID, "an extra key given twice is refused");
    like(dt_last_error(), "\"a\" given twice", "... naming it");
    in.batch = -1;
    is_int(dt_ckpt_save(dir, 0, m, o, &in, NULL, 0), DT_ERR_INVALID, "a negative batch is refused");
    in.batch = 256;
    in.step = -5;
    is_int(dt_ckpt_save(dir, 0, m, o, &in, NULL, 0), DT_ERR_INVALID, "a negative step is refused");
    in.step = 1;
    char filedir[512];
    snprintf(filedir, sizeof filedir, "%s/afile", tmpdir);
    spit(filedir, "x", 1);
    is_int(dt_ckpt_save(filedir, 0, m, o, &in, NULL, 0), DT_ERR_IO, "saving under a regular file fails");
    like(dt_last_error(), "afile", "... naming it");

    dt_optim_free(zo);
    dt_optim_free(yo);
    dt_model_free(y);
    dt_optim_free(xo);
    dt_model_free(x);
    dt_optim_free(o);
    dt_model_free(m);
}

/* ---- Hugging Face's GPT-2 layout for dt_model_load ---------------------------------- */

#define GPT "gpt(layers=2,heads=2,dim=8,block=8,vocab=11)"
enum { HF_EXTRA = 1, HF_MISSING = 2, HF_NOT_TRANSPOSED = 4, HF_PREFIX = 8, HF_HEAD_ONLY = 16 };

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && !strcmp(s + n - k, suf);
}

/* m's weights as transformers writes a GPT-2: GPT2Model's names (no "transformer.";
 * HF_PREFIX keeps it, as GPT2LMHeadModel), Conv1D weights [in, out], a BOOL attn.bias
 * and an F32 attn.masked_bias per block, no lm_head.weight (HF_HEAD_ONLY: lm_head.weight
 * and no wte.weight). The flags break it: an extra tensor, a missing one, c_fc left
 * [out, in]. */
static void write_hf(dt_model *m, const char *path, int flags) {
    dt_st_writer *w = NULL;
    int n = dt_model_nstate(m);
    float *bufs[32] = {0};
    char names[32][80], bias[32][80], masked_bias[32][80];   /* the writer keeps pointers */
    static unsigned char mask[64];
    static float masked = -1e4f, extra[3] = {1, 2, 3};
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) mask[r * 8 + c] = c <= r;
    int ok_ = dt_st_writer_init(&w) == DT_OK && n <= 32;
    for (int i = 0; ok_ && i < n; i++) {
        dt_tensor_info t;
        dt_model_state(m, i, &t);
        int head = !strcmp(t.name, "lm_head.weight"), wte = !strcmp(t.name, "transformer.wte.weight");
        if ((flags & HF_HEAD_ONLY) ? wte : head) continue;
        if ((flags & HF_MISSING) && !strcmp(t.name, "transformer.h.1.ln_2.bias")) continue;
        const char *name = (flags & HF_PREFIX) || head ? t.name : t.name + strlen("transformer.");
        snprintf(names[i], sizeof names[i], "%s", name);
        int64_t shape[2] = { t.shape[0], t.shape[1] };
        const float *src = t.data;
        int conv = t.ndim == 2 && (ends_with(name, "c_attn.weight") || ends_with(name, "c_proj.weight") ||
                                   (ends_with(name, "c_fc.weight") && !(flags & HF_NOT_TRANSPOSED)));
        bufs[i] = malloc((size_t)t.numel * sizeof(float));
        if (!bufs[i]) { ok_ = 0; break; }
        if (conv) {   /* [out, in] -> [in, out] */
            shape[0] = t.shape[1];
            shape[1] = t.shape[0];
            for (int64_t o = 0; o < t.shape[0]; o++)
                for (int64_t k = 0; k < t.shape[1]; k++) bufs[i][k * t.shape[0] + o] = src[o * t.shape[1] + k];
        } else {
            memcpy(bufs[i], src, (size_t)t.numel * sizeof(float));
        }
        ok_ = dt_st_writer_add(w, names[i], DT_F32, t.ndim, shape, bufs[i]) == DT_OK;
        if (ok_ && ends_with(name, "attn.c_attn.bias")) {
            int stem = (int)(strlen(name) - strlen("c_attn.bias"));   /* "h.0.attn." */
            snprintf(bias[i], sizeof bias[i], "%.*sbias", stem, name);
            snprintf(masked_bias[i], sizeof masked_bias[i], "%.*smasked_bias", stem, name);
            ok_ = dt_st_writer_add(w, bias[i], DT_BOOL, 4, (int64_t[]){ 1, 1, 8, 8 }, mask) == DT_OK &&
                  dt_st_writer_add(w, masked_bias[i], DT_F32, 0, NULL, &masked) == DT_OK;
        }
    }
    if (ok_ && (flags & HF_EXTRA)) ok_ = dt_st_writer_add(w, "h.0.attn.extra", DT_F32, 1, (int64_t[]){ 3 }, extra) == DT_OK;
    if (ok_) ok_ = dt_st_writer_write(w, path) == DT_OK;
    if (!ok_) printf("Bail out! writing %s: %s\n", path, dt_last_error());
    dt_st_writer_free(w);
    for (int i = 0; i < 32; i++) free(bufs[i]);
    if (!ok_) exit(1);
}

static int same_params(dt_model *a, dt_model *b) {
    return dt_model_nparams(a) == dt_model_nparams(b) &&
           !memcmp(dt_model_params(a), dt_model_params(b), dt_model_nparams(a) * sizeof(float));
}

static void test_hf_gpt2(void) {
    static const dt_shape seq = {1, {8}};
    dt_model *a = NULL, *b = NULL;
    if (dt_model_build(GPT, &seq, dt_ops_cpu(), 1, 2, &a) != DT_OK || dt_model_build(GPT, &seq, dt_ops_cpu(), 2, 2, &b) != DT_OK) {
        printf("Bail out! building %s: %s\n", GPT, dt_last_error());
        exit(1);
    }
    float *p = dt_model_params(a);   /* biases and norms off their init, so every tensor tells */
    for (size_t i = 0; i < dt_model_nparams(a); i++) p[i] += 0.001f * (float)(i % 13);
    char path[1024];
    snprintf(path, sizeof path, "%s/hf.safetensors", tmpdir);
    const struct { int flags; const char *what; } good[] = {
        { 0, "GPT2Model's names" }, { HF_PREFIX, "GPT2LMHeadModel's names" },
        { HF_PREFIX | HF_HEAD_ONLY, "the tied weight as lm_head.weight only" },
    };
    for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
        dt_model *c = NULL;
        dt_model_build(GPT, &seq, dt_ops_cpu(), 3 + k, 2, &c);
        write_hf(a, path, good[k].flags);
        is_int(dt_model_load(c, path), DT_OK, "HF GPT-2 file (%s, Conv1D, mask buffers) loads", good[k].what);
        ok(same_params(a, c), "... into exactly the weights it was written from");
        dt_model_free(c);
    }
    const struct { int flags; const char *msg, *what; } bad[] = {
        { HF_EXTRA, "hf.safetensors: tensor 'h.0.attn.extra' is not one of the model's", "an unknown tensor" },
        { HF_MISSING, "tensor 'transformer.h.1.ln_2.bias' is missing, also without 'transformer.'", "a missing tensor" },
        { HF_NOT_TRANSPOSED, "tensor 'h.0.mlp.c_fc.weight' is F32 [32,8] in the file, the model expects F32 [8,32] "
          "(Conv1D's [in, out]", "c_fc in nn.Linear's layout among Conv1D ones" },
    };
    float *before = malloc(dt_model_nparams(b) * sizeof(float));
    if (!before) exit(1);
    memcpy(before, dt_model_params(b), dt_model_nparams(b) * sizeof(float));
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_hf(a, path, bad[k].flags);
        is_int(dt_model_load(b, path), DT_ERR_FORMAT, "HF GPT-2 file with %s is refused", bad[k].what);
        like(dt_last_error(), bad[k].msg, "... naming the tensor");
        ok(!memcmp(before, dt_model_params(b), dt_model_nparams(b) * sizeof(float)), "... and the model is unchanged");
    }
    /* dtrain's own file of another size: the direct comparison's message, not the HF one */
    dt_model *small = NULL;
    dt_model_build("gpt(layers=1,heads=2,dim=8,block=8,vocab=11)", &seq, dt_ops_cpu(), 1, 2, &small);
    snprintf(path, sizeof path, "%s/gpt.safetensors", tmpdir);
    is_int(dt_model_save(a, path, NULL, 0), DT_OK, "save a 2-layer gpt");
    is_int(dt_model_load(small, path), DT_ERR_FORMAT, "it does not load into a 1-layer gpt");
    like(dt_last_error(), "gpt.safetensors: holds 29 tensors, the model has 17", "... with the direct comparison's message");
    free(before);
    dt_model_free(small);
    dt_model_free(a);
    dt_model_free(b);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/dt_ckpt.XXXXXX");
    if (!mkdtemp(tmpdir)) skip_all("cannot create a temporary directory");
    test_hash();
    test_round_trip(0);
    test_round_trip(1);
    test_device_copy();
    test_keep_and_latest();
    test_damage();
    test_crash();
    test_reuse();
    reuse = 1;
    test_crash();
    reuse = 0;
    test_foreign();
    test_refusals();
    test_bad_numbers();
    test_shard_coverage();
    test_hf_gpt2();
    rm_rf(tmpdir);
    return done_testing();
}
