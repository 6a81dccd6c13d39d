#!/usr/bin/env bash
# torch_resnet.sh: the resnet preset is the PyTorch module the README gives.
# dtrain trains a few steps and saves; PyTorch loads the file with
# load_state_dict(strict=True) and gets dtrain's test loss and accuracy on the
# same data; then PyTorch saves its own freshly initialised module and
# dtrain eval gets PyTorch's numbers from it. Runs when python3-torch is installed.
. "$(dirname "$0")/tap.sh"
need_torch
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
DTRAIN="$DT_BUILDDIR/dtrain"

cat > "$T/resnet.py" <<'PYEOF'
# The README's resnet module.
import sys
import numpy as np, torch, torch.nn as nn
from st_torch import load, save

class Residual(nn.Sequential):
    def forward(self, x):
        return x + super().forward(x)

class GlobalAvgPool(nn.Module):
    def forward(self, x):
        return x.mean((2, 3))

def block(c):
    return Residual(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                    nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))

def resnet():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        block(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        block(64), nn.ReLU(),
        GlobalAvgPool(), nn.Linear(64, 10))

def evaluate(m, x, y):
    m.eval()
    with torch.no_grad():
        logits = m(torch.from_numpy(x))
        loss = nn.functional.cross_entropy(logits, torch.from_numpy(y)).item()
        acc = (logits.argmax(1) == torch.from_numpy(y)).float().mean().item()
    return loss, acc

x, y = np.load(sys.argv[2]), np.load(sys.argv[3])
m = resnet()
if sys.argv[1] == 'load':
    m.load_state_dict(load(sys.argv[4]), strict=True)
    print('%.4f %.4f' % evaluate(m, x, y))
else:
    torch.manual_seed(1)
    sd = m.state_dict()
    for k in sd:           # move batchnorm off its defaults so every tensor matters
        if 'running_var' in k: sd[k].uniform_(0.5, 1.5)
        elif 'running_mean' in k or k.endswith('bias'): sd[k].uniform_(-0.2, 0.2)
    m.load_state_dict(sd)
    save(m.state_dict(), sys.argv[4])
    print('%.4f %.4f' % evaluate(m, x, y))
PYEOF

timeout 120 "$PY" -c "import st_torch; st_torch.random_set('$T', 64, (1, 28, 28), 10)"
ok $? "test data written"
DATA="$T/x.npy,$T/y.npy,$T/x.npy,$T/y.npy"

timeout 300 "$DTRAIN" train --model resnet --data "$DATA" --batch 16 --epochs 1 --quiet --save "$T/dt.safetensors" \
    > "$T/train.out" 2>&1
ok $? "dtrain trains the resnet preset and saves it"
timeout 120 "$DTRAIN" eval --model resnet --weights "$T/dt.safetensors" --data "$DATA" > "$T/eval.out" 2>&1
ok $? "dtrain eval of its own file"
read -r dacc dloss < <(sed -n 's/^test accuracy \([0-9.]*\)  test loss \([0-9.]*\).*/\1 \2/p' "$T/eval.out")
read -r tloss tacc < <(timeout 300 "$PY" "$T/resnet.py" load "$T/x.npy" "$T/y.npy" "$T/dt.safetensors" 2> "$T/py.err")
ok $? "PyTorch loads dtrain's resnet with load_state_dict(strict=True)"
[ -s "$T/py.err" ] && sed 's/^/#   /' "$T/py.err"
diag "dtrain: loss $dloss accuracy $dacc; PyTorch: loss $tloss accuracy $tacc"
awk -v a="$dloss" -v b="$tloss" -v c="$dacc" -v d="$tacc" 'BEGIN { exit !(a != "" && (a - b < 2e-4 && b - a < 2e-4) && c == d) }'
ok $? "PyTorch computes dtrain's test loss and accuracy from dtrain's weights"

read -r tloss tacc < <(timeout 300 "$PY" "$T/resnet.py" save "$T/x.npy" "$T/y.npy" "$T/pt.safetensors" 2> "$T/py.err")
ok $? "PyTorch saves its resnet's state_dict"
timeout 120 "$DTRAIN" eval --model resnet --weights "$T/pt.safetensors" --data "$DATA" > "$T/eval2.out" 2>&1
ok $? "dtrain eval loads PyTorch's file"
read -r dacc dloss < <(sed -n 's/^test accuracy \([0-9.]*\)  test loss \([0-9.]*\).*/\1 \2/p' "$T/eval2.out")
diag "PyTorch: loss $tloss accuracy $tacc; dtrain: loss $dloss accuracy $dacc"
awk -v a="$dloss" -v b="$tloss" -v c="$dacc" -v d="$tacc" 'BEGIN { exit !(a != "" && (a - b < 2e-4 && b - a < 2e-4) && c == d) }'
ok $? "dtrain computes PyTorch's test loss and accuracy from PyTorch's weights"
done_testing
