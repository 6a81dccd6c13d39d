# st_torch.py: safetensors files read and written with json + struct, as PyTorch state
# dicts (F32, I64 and BOOL tensors), and random test data, for the tests that hold dtrain
# against PyTorch (tests/torch_*.sh put this directory on sys.path).
import json, struct
import torch

DTYPES = {'F32': torch.float32, 'I64': torch.int64, 'BOOL': torch.bool}


def load(path):
    raw = open(path, 'rb').read()
    n = struct.unpack('<Q', raw[:8])[0]
    hdr = json.loads(raw[8:8 + n]); data = bytearray(raw[8 + n:])
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__': continue
        b, e = v['data_offsets']
        out[k] = torch.frombuffer(data[b:e], dtype=DTYPES[v['dtype']]).reshape(v['shape']).clone()
    return out


def save(sd, path):
    names = {t: n for n, t in DTYPES.items()}
    hdr, blobs, off = {}, [], 0
    for k, t in sd.items():
        b = t.contiguous().numpy().tobytes()
        hdr[k] = {'dtype': names[t.dtype], 'shape': list(t.shape), 'data_offsets': [off, off + len(b)]}
        blobs.append(b); off += len(b)
    h = json.dumps(hdr).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    open(path, 'wb').write(struct.pack('<Q', len(h)) + h + b''.join(blobs))


def random_set(d, n, shape, classes):
    """d/x.npy: n standard-normal float32 samples of shape; d/y.npy: int64 labels in [0, classes)."""
    import numpy as np
    r = np.random.default_rng(0)
    np.save(d + '/x.npy', r.standard_normal((n,) + tuple(shape)).astype('<f4'))
    np.save(d + '/y.npy', r.integers(0, classes, n).astype('<i8'))
