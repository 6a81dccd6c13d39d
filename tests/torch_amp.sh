#!/bin/sh
# torch_amp.sh: mixed precision against PyTorch 1.13 on the CPU.
#  1. Loss scaling: on the same sequences of found-inf flags, the trainer's fp16 check
#     (tests/amp_prog) takes GradScaler's decisions: which steps are skipped, the factor
#     that unscales the gradient, the scale and the growth tracker after every update.
#     PyTorch's CPU build has neither of GradScaler's kernels (_amp_update_scale_,
#     _amp_foreach_non_finite_check_and_unscale_ run on CUDA only), so GradScaler's own
#     Python (scale init, unscale_, step, update) runs with those two kernels written in
#     Python from aten/src/ATen/native/cuda/AmpKernels.cu.
#  2. bf16 training of the mlp preset from the same weights (--init) on the same data
#     (512 random samples, full-batch SGD with momentum), against torch.autocast('cpu',
#     dtype=torch.bfloat16) and against PyTorch computing dtrain's stated arithmetic
#     ("rounded": every linear's operands rounded to bf16 — x and W forward; dy, x and W
#     backward — with f32 products, sums and outputs):
#       - the loss of each of 10 steps within 1e-3 relative of autocast's and of the
#         rounded computation's (measured: a few 1e-5; autocast also rounds each linear's
#         output and bias to bf16 where dtrain keeps f32);
#       - the first step's update (w1 - w0, all weights), which shows bf16's rounding
#         before it averages out in a loss: within 1e-4 (normwise) of the rounded
#         computation's, with PyTorch's f32 sums or with exact (f64) ones, i.e. the same
#         arithmetic up to summation order (the two orders alone differ by about 2e-3 in
#         this update: OpenBLAS's kernel, which dtrain calls without AVX-512, sums in
#         PyTorch's order; dtrain's own AVX-512 GEMM comes within 1e-4 of the exact
#         sums), and within 5e-2
#         of autocast's; and at least 1e-3 away from fp32's, so bf16 did round.
#     dtrain fp32 is held to PyTorch fp32 the same way.
. "$(dirname "$0")/tap.sh"
need_torch
PROG="$DT_BUILDDIR/tests/amp_prog"
[ -x "$PROG" ] || skip_all "tests/amp_prog not built"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
DTRAIN="$DT_BUILDDIR/dtrain"

# ---- 1. GradScaler's decisions ----
cat > "$T/scaler.py" <<'PYEOF'
import math, random, struct, sys
import torch
import torch.cuda.amp.grad_scaler as gs

init, interval, nsteps, p_inf, seed = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])

def f32(v):
    return torch.tensor([v], dtype=torch.float32)

def bits(v):   # an f32 value's bits, as tests/amp_prog prints them
    return '%08x' % struct.unpack('<I', struct.pack('<f', v))[0]

# AmpKernels.cu, _amp_foreach_non_finite_check_and_unscale_cuda_: found_inf = 1 if any value
# is not finite; each value multiplied by inv_scale unless it is 1
def check_and_unscale(grads, found_inf, inv_scale):
    for g in grads:
        if not torch.isfinite(g).all():
            found_inf.fill_(1.0)
        if inv_scale.item() != 1.0:
            g.mul_(inv_scale)

# AmpKernels.cu, amp_update_scale_cuda_kernel (float scale times double factor, narrowed)
def update_scale(scale, tracker, found_inf, growth, backoff, interval):
    if found_inf.item():
        scale.copy_(f32(scale.item() * backoff))
        tracker.fill_(0)
    else:
        successful = int(tracker.item()) + 1
        if successful == interval:
            new = f32(scale.item() * growth)
            if math.isfinite(new.item()):
                scale.copy_(new)
            tracker.fill_(0)
        else:
            tracker.fill_(successful)
    return scale

torch._amp_foreach_non_finite_check_and_unscale_ = check_and_unscale
torch._amp_update_scale_ = update_scale
gs.amp_definitely_not_available = lambda: False     # GradScaler would disable itself without CUDA
def replicator_init(self, master_tensor):           # the same, without its assertion that it is on CUDA
    self.master = master_tensor
    self._per_device_tensors = {}
gs._MultiDeviceReplicator.__init__ = replicator_init

scaler = gs.GradScaler(init_scale=init, growth_interval=interval)
p = torch.nn.Parameter(torch.zeros(2))
stepped = []
class Opt(torch.optim.SGD):
    def step(self, closure=None):
        stepped.append(1)
opt = Opt([p], lr=0.1)
scaler._lazy_init_scale_growth_tracker(torch.device('cpu'))   # what scale(loss) does first, on CUDA
rng = random.Random(seed)
with open(sys.argv[6], 'w') as flags, open(sys.argv[7], 'w') as out:
    flags.write('%r %d\n' % (init, interval))
    for step in range(nsteps):
        inf = rng.random() < p_inf or (seed == 3 and 500 <= step < 520)   # seed 3: a burst of overflows
        flags.write('%d\n' % inf)
        p.grad = torch.tensor([0.25 * scaler.get_scale(), math.inf if inf else 0.25 * scaler.get_scale()])
        inv = scaler._scale.double().reciprocal().float().item()
        before = len(stepped)
        scaler.step(opt)
        scaler.update()
        out.write('%d %s %s %d\n' % (len(stepped) == before, bits(inv), bits(scaler.get_scale()),
                                    scaler._get_growth_tracker()))
PYEOF
# (init, interval, steps, P(inf), seed): GradScaler's defaults over 9000 steps (four growths, a
# burst of 20 overflows); a short interval with frequent overflows; interval 1 without any, up
# to f32's largest power of two, where growth stops
for cfg in "65536.0 2000 9000 0.0003 3" "65536.0 3 600 0.2 4" "65536.0 1 150 0 5" "1.0 5 300 0.1 6"; do
    set -- $cfg
    timeout 300 "$PY" "$T/scaler.py" $cfg "$T/flags" "$T/torch.out" 2> "$T/py.err"
    ok $? "GradScaler ($1, interval $2) on $3 steps of flags"
    [ -s "$T/py.err" ] && grep -v Warning "$T/py.err" | sed 's/^/#   /' | tail -3
    timeout 60 "$PROG" < "$T/flags" > "$T/dtrain.out" 2>&1
    ok $? "dtrain's fp16 check on the same flags"
    cmp -s "$T/torch.out" "$T/dtrain.out"
    ok $? "every decision is GradScaler's: skips, unscale factors, scales and trackers ($(wc -l < "$T/torch.out") steps)"
    cmp "$T/torch.out" "$T/dtrain.out" | sed 's/^/#   /'
    diag "skipped $(awk '$1 == 1' "$T/torch.out" | wc -l), final scale (f32 bits) $(tail -1 "$T/torch.out" | cut -d' ' -f3)"
    if [ "$2" = 1 ]; then
        tail -1 "$T/dtrain.out" | grep -q '^0 [0-9a-f]* 7f000000 0$'
        ok $? "without overflows the scale grows to 2^127 and stays there (never inf)"
    fi
done

# ---- 2. bf16 training of the mlp against autocast ----
timeout 120 "$PY" -c "import st_torch; st_torch.random_set('$T', 512, (1, 28, 28), 10)"
ok $? "test data written (512 samples, 1x28x28, 10 classes)"
DATA="$T/x.npy,$T/y.npy,$T/x.npy,$T/y.npy"
STEPS=10
cat > "$T/mlp.py" <<'PYEOF'
import sys
import numpy as np, torch, torch.nn as nn
from st_torch import load, save

d, steps, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(2)

def mlp(linear=nn.Linear):
    return nn.Sequential(nn.Flatten(), linear(784, 1024), nn.ReLU(), linear(1024, 1024), nn.ReLU(), linear(1024, 10))

if what == 'init':
    torch.manual_seed(0)
    save(mlp().state_dict(), d + '/init.st')
    sys.exit(0)

if what == 'compare':   # normwise difference of two runs' updates w - w0, over all weights
    w0 = load(d + '/init.st')
    def update(f):
        w = load(f)
        return torch.cat([(w[k] - w0[k]).flatten() for k in sorted(w0)]).double()
    for a, b in zip(sys.argv[4::2], sys.argv[5::2]):
        ua, ub = update(a), update(b)
        print('%.3g' % ((ua - ub).norm() / ub.norm()).item())
    sys.exit(0)

def rb(t):
    return t.to(torch.bfloat16).float()

def mm(a, b):   # rounded: f32 sums in sgemm's order; rounded64: exact sums, rounded to f32 once
    return (a.double() @ b.double()).float() if what == 'rounded64' else a @ b

class RoundedLinearFn(torch.autograd.Function):
    """dtrain's bf16 linear: operands rounded to bf16, f32 products, sums and output."""
    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        return mm(rb(x), rb(w).t()) + b
    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dy = rb(dy)
        return mm(dy, rb(w)), mm(dy.t(), rb(x)), dy.sum(0)

class RoundedLinear(nn.Linear):
    def forward(self, x):
        return RoundedLinearFn.apply(x, self.weight, self.bias)

x = torch.from_numpy(np.load(d + '/x.npy'))
y = torch.from_numpy(np.load(d + '/y.npy'))
m = mlp(RoundedLinear if what.startswith('rounded') else nn.Linear)
m.load_state_dict(load(d + '/init.st'), strict=True)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
for step in range(steps):
    opt.zero_grad()
    if what == 'autocast':
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = m(x)
        assert out.dtype == torch.bfloat16
        out = out.float()
    else:
        out = m(x)
    loss = nn.functional.cross_entropy(out, y)
    loss.backward()
    opt.step()
    print('%.9g' % loss.item())
save(m.state_dict(), '%s/t_%s_%d.st' % (d, what, steps))
PYEOF
timeout 120 "$PY" "$T/mlp.py" "$T" 0 init
ok $? "PyTorch writes the mlp's initial weights"
for p in fp32 bf16; do
    for n in 1 $STEPS; do
        timeout 300 "$DTRAIN" train --model mlp --data "$DATA" --init "$T/init.st" --batch 512 --micro-batches 1 \
            --steps $n --lr 0.1 --momentum 0.9 --weight-decay 0 --schedule constant --precision $p --no-eval \
            --log-every 1 --metrics "$T/$p.$n.jsonl" --save "$T/d_${p}_$n.st" --quiet > "$T/$p.out" 2>&1
        ok $? "dtrain --precision $p, $n full-batch step(s) from PyTorch's weights (--init)"
    done
    sed -n 's/.*"event":"step".*"loss":\([^,]*\),.*/\1/p' "$T/$p.$STEPS.jsonl" > "$T/d_$p"
done
for w in fp32 autocast rounded rounded64; do
    for n in 1 $STEPS; do
        timeout 600 "$PY" "$T/mlp.py" "$T" $n $w > "$T/t_$w.$n" 2> "$T/py.err"
        ok $? "PyTorch $w, $n step(s)"
        [ -s "$T/py.err" ] && sed 's/^/#   /' "$T/py.err" | tail -3
    done
    cp "$T/t_$w.$STEPS" "$T/t_$w"
done
# worst relative difference per step of two loss columns (rows must be $STEPS)
worst() { paste "$1" "$2" | awk -v n=$STEPS '{ d = $1 - $2; if (d < 0) d = -d; r = d / $2; if (r > w) w = r }
                                              END { if (NR != n) print "missing"; else printf "%.3g", w + 0 }'; }
within() { awk -v w="$1" -v t="$2" 'BEGIN { exit !(w != "missing" && w != "" && w <= t) }'; }
w_fp32=$(worst "$T/d_fp32" "$T/t_fp32"); w_auto=$(worst "$T/d_bf16" "$T/t_autocast")
w_round=$(worst "$T/d_bf16" "$T/t_rounded"); w_gap=$(worst "$T/t_autocast" "$T/t_fp32")
diag "losses, step 1 and $STEPS: dtrain bf16 $(head -1 "$T/d_bf16") $(tail -1 "$T/d_bf16"), autocast $(head -1 "$T/t_autocast") $(tail -1 "$T/t_autocast"), fp32 $(head -1 "$T/t_fp32") $(tail -1 "$T/t_fp32")"
diag "worst relative loss difference per step: dtrain bf16 vs autocast $w_auto, vs rounded $w_round; dtrain fp32 vs PyTorch fp32 $w_fp32; autocast vs fp32 $w_gap"
within "$w_fp32" 1e-5; ok $? "dtrain fp32's losses are PyTorch fp32's within 1e-5 per step (worst $w_fp32)"
within "$w_auto" 1e-3; ok $? "dtrain bf16's losses are torch.autocast's within 1e-3 per step (worst $w_auto)"
within "$w_round" 1e-3; ok $? "dtrain bf16's losses are the rounded computation's within 1e-3 per step (worst $w_round)"
set -- $(timeout 300 "$PY" "$T/mlp.py" "$T" 0 compare "$T/d_bf16_1.st" "$T/t_rounded_1.st" "$T/d_bf16_1.st" \
    "$T/t_autocast_1.st" "$T/d_bf16_1.st" "$T/t_fp32_1.st" "$T/d_fp32_1.st" "$T/t_fp32_1.st" \
    "$T/d_bf16_1.st" "$T/t_rounded64_1.st" "$T/t_rounded_1.st" "$T/t_rounded64_1.st")
diag "first update, normwise: dtrain bf16 vs rounded ${1:-?} (exact sums: ${5:-?}), vs autocast ${2:-?}, vs fp32 ${3:-?}; dtrain fp32 vs PyTorch fp32 ${4:-?}"
diag "the rounded computation's f32 sums (sgemm's order) against its exact ones: ${6:-?}: summation order alone moves this update that much"
r=${1:-}
within "${5:-}" 1e-4 && r=${5:-}
within "$r" 1e-4; ok $? "dtrain bf16's first update is the rounded computation's within 1e-4, with sgemm's f32 sums (${1:-none}) or exact ones (${5:-none})"
within "${2:-}" 5e-2; ok $? "and autocast's within 5e-2 (${2:-none})"
! within "${3:-}" 1e-3; ok $? "and at least 1e-3 from fp32's: bf16 rounded (${3:-none})"
within "${4:-}" 1e-5; ok $? "dtrain fp32's first update is PyTorch fp32's within 1e-5 (${4:-none})"
done_testing
