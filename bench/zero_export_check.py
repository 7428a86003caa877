#!/usr/bin/python3
"""Reads a consolidated ZeRO checkpoint (ddp_zero_checkpoint_export) with
PyTorch, as a PyTorch user would: the safetensors format read by hand (the
safetensors package is not installed here; the format is an 8-byte
little-endian header length, a JSON header, the raw data), the tensors
loaded into torch.nn.Sequential(Linear(784,H), ReLU, ..., Linear(H,10)) with
load_state_dict(strict=True), and compared with the same weights saved
directly by ddp_model_save_safetensors (EXPORT.direct).  Not part of the
test suite (it needs torch); run once by hand:

    mkdir -p /tmp/zx/ck
    build/bin/ddprun --standalone --nproc-per-node 4 build/bench/zero_mem --mode zero1 \
        --hidden 64 --layers 2 --steps 3 --save-dir /tmp/zx/ck --export /tmp/zx/model.safetensors
    /usr/bin/python3 bench/zero_export_check.py /tmp/zx/model.safetensors
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
        assert e["dtype"] == "F32", (name, e["dtype"])
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[b:end]), dtype=torch.float32)
        out[name] = t.reshape(e["shape"])
    return out


def main():
    path = sys.argv[1]
    sd = read_safetensors(path)
    ref = read_safetensors(path + ".direct")
    names = sorted(sd, key=lambda k: (int(k.split(".")[0]), k))
    hidden = sd["0.weight"].shape[0]
    layers = len([k for k in sd if k.endswith(".weight")]) - 1
    mods = []
    fan_in = 784
    for _ in range(layers):
        mods += [torch.nn.Linear(fan_in, hidden), torch.nn.ReLU()]
        fan_in = hidden
    mods.append(torch.nn.Linear(fan_in, 10))
    model = torch.nn.Sequential(*mods)
    model.load_state_dict(sd, strict=True)  # every PyTorch name, every shape
    for k in names:
        assert torch.equal(sd[k], ref[k]), k
    x = torch.sin(torch.arange(2 * 784, dtype=torch.float32).reshape(2, 784) * 0.01)
    print("loaded %d tensors (%s) into %s; equal to the direct save; output[0,:3] = %s"
          % (len(sd), ", ".join(names), "Sequential", model(x)[0, :3].tolist()))


if __name__ == "__main__":
    main()
