#!/usr/bin/env bash
# torch_resnet.sh: the resnet preset is the PyTorch module the README gives.
# dtrain trains a few steps and saves; PyTorch loads the file with
# load_state_dict(strict=True) and gets dtrain's test loss and accuracy on the
# same data; then PyTorch saves its own freshly initialised module and
# dtrain eval gets PyTorch's numbers from it. Runs when python3-torch is installed.
. "$(dirname "$0")/tap.sh"
PY=
for p in python3 /usr/bin/python3; do
    if timeout 60 "$p" -c 'import torch, numpy' >/dev/null 2>&1; then PY=$p; break; fi
done
[ -n "$PY" ] || skip_all "PyTorch (python3-torch) not installed"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
DTRAIN="$DT_BUILDDIR/dtrain"

cat > "$T/resnet.py" <<'PYEOF'
# The README's resnet module, and safetensors read/written with json + struct.
import json, struct, sys
import numpy as np, torch, torch.nn as nn

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

DT = {'F32': torch.float32, 'I64': torch.int64}
def load(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); data = bytearray(raw[8 + n:])
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__': continue
        b, e = v['data_offsets']
        out[k] = torch.frombuffer(data[b:e], dtype=DT[v['dtype']]).reshape(v['shape']).clone()
    return out

def save(sd, path):
    names = {torch.float32: 'F32', torch.int64: 'I64'}
    hdr, blobs, off = {}, [], 0
    for k, t in sd.items():
        b = t.contiguous().numpy().tobytes()
        hdr[k] = {'dtype': names[t.dtype], 'shape': list(t.shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(hdr).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + b''.join(blobs))

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

timeout 120 "$PY" -c "
import numpy as np
r = np.random.default_rng(0)
np.save('$T/x.npy', r.standard_normal((64, 1, 28, 28)).astype('<f4'))
np.save('$T/y.npy', r.integers(0, 10, 64).astype('<i8'))"
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
