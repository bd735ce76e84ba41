#!/usr/bin/python3
"""PyTorch 1.13 reference for the demo CNN (examples/cnn): forward logits, cross-entropy
loss and every parameter gradient for the first 8 Fashion-MNIST test images, with the
weights cnn_model_create(seed=5) makes (its splitmix64 initialisation re-implemented here
in numpy float32, so the test also checks the initialisation bit for bit).
Writes tests/data/cnn/cnn_ref.safetensors (F32):
  init.<param>.first16   first 16 values of each initialised parameter
  logits [8,10], loss [1]
  grad.<param>           full gradient, except fc1.weight: grad.fc1.weight.every61
                         (flattened elements 0, 61, 122, ...)
Run: /usr/bin/python3 tests/ref/gen_cnn.py"""
import gzip, json, os, struct
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = 5
N = 8
M64 = (1 << 64) - 1
names = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
         "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
shapes = [(32, 1, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 3136), (128,), (10, 128), (10,)]


def splitmix_stream(seed, count):
    s = seed
    out = np.empty(count, dtype=np.uint64)
    for i in range(count):
        s = (s + 0x9e3779b97f4a7c15) & M64
        z = s
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
        out[i] = z ^ (z >> 31)
    return out


def init_params(seed):
    total = sum(int(np.prod(s)) for s in shapes)
    r = splitmix_stream(seed, total)
    u = (r >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    params, at = {}, 0
    for l in range(4):
        fan_in = int(np.prod(shapes[2 * l][1:]))
        bound = np.float32(1.0) / np.sqrt(np.float32(fan_in))
        for p in (2 * l, 2 * l + 1):
            n = int(np.prod(shapes[p]))
            v = (np.float32(2.0) * u[at:at + n] - np.float32(1.0)) * bound
            params[names[p]] = v.astype(np.float32).reshape(shapes[p])
            at += n
    return params


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for k, v in tensors.items():
        b = np.ascontiguousarray(v, dtype="<f4").tobytes()
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    torch.set_num_threads(1)
    D = "/usr/share/datasets/fashion-mnist"
    img = np.frombuffer(gzip.open(f"{D}/t10k-images-idx3-ubyte.gz").read()[16:16 + N * 784], dtype=np.uint8)
    lab = np.frombuffer(gzip.open(f"{D}/t10k-labels-idx1-ubyte.gz").read()[8:8 + N], dtype=np.uint8)
    x = torch.from_numpy(img.reshape(N, 1, 28, 28).copy()).float().div(255)   # ToTensor
    x = x.sub(0.2860).div(0.3530)                                              # Normalize
    y = torch.from_numpy(lab.astype(np.int64))
    params = init_params(SEED)
    net = Net()
    with torch.no_grad():
        for k, v in params.items():
            dict(net.named_parameters())[k].copy_(torch.from_numpy(v))
    logits = net(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    out = {}
    for k in names:
        out[f"init.{k}.first16"] = params[k].reshape(-1)[:16]
    out["logits"] = logits.detach().numpy()
    out["loss"] = np.array([loss.item()], dtype=np.float32)
    for k, p in net.named_parameters():
        g = p.grad.numpy()
        if k == "fc1.weight":
            out["grad.fc1.weight.every61"] = g.reshape(-1)[::61].copy()
        else:
            out[f"grad.{k}"] = g
    path = os.path.join(os.path.dirname(__file__), "..", "data", "cnn", "cnn_ref.safetensors")
    write_safetensors(path, out)
    print("loss", loss.item(), "bytes", os.path.getsize(path))


main()
