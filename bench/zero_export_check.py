#!/usr/bin/python3
"""Reads a consolidated ZeRO checkpoint (ddp_zero_checkpoint_export) with
PyTorch, as a PyTorch user would: the safetensors format read by hand (the
safetensors package is not installed here; the format is an 8-byte
little-endian header length, a JSON header, the raw data), the tensors
loaded into torch.nn.Sequential(Linear(784,H), ReLU, ..., Linear(H,10)) (with
a BatchNorm1d after each hidden Linear when the file holds its buffers:
zero_mem --batchnorm 1) with load_state_dict(strict=True), and every tensor,
parameters and buffers, compared with the same model saved directly by
ddp_model_save_safetensors on rank 0 (EXPORT.direct).  Not part of the test
suite (it needs torch); run once by hand:

    mkdir -p /tmp/zx/ck /tmp/zx/bn
    build/bin/ddprun --standalone --nproc-per-node 4 build/bench/zero_mem --mode zero1 \
        --hidden 64 --layers 2 --steps 3 --save-dir /tmp/zx/ck --export /tmp/zx/model.safetensors
    /usr/bin/python3 bench/zero_export_check.py /tmp/zx/model.safetensors
    build/bin/ddprun --standalone --nproc-per-node 4 build/bench/zero_mem --mode zero2 \
        --hidden 64 --layers 2 --steps 3 --batchnorm 1 --save-dir /tmp/zx/bn \
        --export /tmp/zx/bn.safetensors
    /usr/bin/python3 bench/zero_export_check.py /tmp/zx/bn.safetensors
"""
import json
import struct
import sys

import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] in ("F32", "I64"), (name, e["dtype"])
        b, end = e["data_offsets"]
        dt = torch.float32 if e["dtype"] == "F32" else torch.int64
        t = torch.frombuffer(bytearray(data[b:end]), dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out


def main():
    path = sys.argv[1]
    sd = read_safetensors(path)
    ref = read_safetensors(path + ".direct")
    names = sorted(sd, key=lambda k: (int(k.split(".")[0]), k))
    assert sorted(names) == sorted(ref), (names, sorted(ref))
    hidden = sd["0.weight"].shape[0]
    bn = "1.running_mean" in sd
    layers = len([k for k in sd if k.endswith(".weight") and sd[k].dim() == 2]) - 1
    mods = []
    fan_in = 784
    for _ in range(layers):
        mods += [torch.nn.Linear(fan_in, hidden)]
        mods += [torch.nn.BatchNorm1d(hidden)] if bn else []
        mods += [torch.nn.ReLU()]
        fan_in = hidden
    mods.append(torch.nn.Linear(fan_in, 10))
    model = torch.nn.Sequential(*mods)
    model.load_state_dict(sd, strict=True)  # every PyTorch name, every shape
    for k in names:
        assert torch.equal(sd[k], ref[k]), k
    sdm = model.state_dict()
    for k in names:  # what load_state_dict put in the model
        assert torch.equal(sdm[k], sd[k]), k
    model.eval()  # BatchNorm from the running statistics
    x = torch.sin(torch.arange(2 * 784, dtype=torch.float32).reshape(2, 784) * 0.01)
    extra = ""
    if bn:
        extra = "; 1.num_batches_tracked = %d, 1.running_var[:2] = %s" % (
            int(sd["1.num_batches_tracked"]), sd["1.running_var"][:2].tolist())
    print("loaded %d tensors (%s) into %s; equal to the direct save%s; eval output[0,:3] = %s"
          % (len(sd), ", ".join(names), "Sequential", extra, model(x)[0, :3].tolist()))


if __name__ == "__main__":
    main()
