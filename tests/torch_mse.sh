#!/usr/bin/env bash
# torch_mse.sh: dtrain's --loss mse is PyTorch's nn.MSELoss on one-hot targets
# (the mean over all batch x output elements). From the same initial weights, one
# full-batch SGD step of dtrain and of PyTorch reach the same loss and the same
# weights, and `dtrain eval --loss mse` gives PyTorch's test loss. Runs when
# python3-torch is installed.
. "$(dirname "$0")/tap.sh"
need_torch
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
DTRAIN="$DT_BUILDDIR/dtrain"
MODEL="flatten linear(8) relu linear(5)"

timeout 120 "$PY" -c "import st_torch; st_torch.random_set('$T', 256, (1, 4, 4), 5)"
ok $? "test data written"
DATA="$T/x.npy,$T/y.npy,$T/x.npy,$T/y.npy"
# one step over the whole set (the sampler's order then only changes the summation order)
step() {
    timeout 120 "$DTRAIN" train --model "$MODEL" --data "$DATA" --loss mse --batch 256 --steps 1 --momentum 0 \
        --weight-decay 0 --schedule constant --no-eval --quiet "$@"
}
step --lr 1e-30 --save "$T/init.st" > "$T/a.out" 2>&1
ok $? "dtrain saves its initial weights (one step at a vanishing learning rate)"
step --lr 0.5 --metrics "$T/m.jsonl" --save "$T/one.st" > "$T/b.out" 2>&1
ok $? "dtrain takes one SGD step with --loss mse"

cat > "$T/mse.py" <<'PYEOF'
import sys
import numpy as np, torch, torch.nn as nn
from st_torch import load

d = sys.argv[1]
x = torch.from_numpy(np.load(d + '/x.npy'))
y = torch.from_numpy(np.load(d + '/y.npy'))
m = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 5))
m.load_state_dict(load(d + '/init.st'), strict=True)
crit = nn.MSELoss()                                   # reduction='mean': over all 256 x 5 elements
target = nn.functional.one_hot(y, 5).float()
loss = crit(m(x), target)
opt = torch.optim.SGD(m.parameters(), lr=0.5)
opt.zero_grad(); loss.backward(); opt.step()
want = load(d + '/one.st')
diff = max((p - want[k]).abs().max().item() for k, p in m.state_dict().items())
with torch.no_grad():
    test = crit(m(x), target).item()
print('%.9g %.3g %.6f' % (loss.item(), diff, test))
PYEOF
read -r tloss wdiff ttest < <(timeout 300 "$PY" "$T/mse.py" "$T" 2> "$T/py.err")
ok $? "PyTorch takes the same step from dtrain's initial weights"
[ -s "$T/py.err" ] && sed 's/^/#   /' "$T/py.err" | tail -5
dloss=$(sed -n 's/.*"event":"step".*"loss":\([^,]*\),.*/\1/p' "$T/m.jsonl" | head -1)
diag "loss: dtrain $dloss, PyTorch $tloss; largest weight difference $wdiff"
awk -v a="${dloss:-0}" -v b="${tloss:-1}" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-6 * b) }'
ok $? "the step's loss is nn.MSELoss of the one-hot targets (relative difference <= 1e-6)"
awk -v w="${wdiff:-1}" 'BEGIN { exit !(w < 1e-6) }'
ok $? "the weights after the step agree within 1e-6 (got ${wdiff:-none})"
timeout 120 "$DTRAIN" eval --model "$MODEL" --data "$DATA" --weights "$T/one.st" --loss mse > "$T/eval.out" 2>&1
dtest=$(sed -n 's/.*test loss \([0-9.]*\) .*/\1/p' "$T/eval.out")
diag "test loss: dtrain ${dtest:-none}, PyTorch ${ttest:-none}"
awk -v a="${dtest:-9}" -v b="${ttest:-0}" 'BEGIN { exit !(a - b < 1e-4 && b - a < 1e-4) }'
ok $? "dtrain eval --loss mse gives PyTorch's test loss"
done_testing
