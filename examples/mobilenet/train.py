#!/usr/bin/python3
"""Trains the MobileNet-style network of docs/models.md on Fashion-MNIST and writes
examples/mobilenet/mobilenet.safetensors (float weights and BatchNorm statistics) and
examples/mobilenet/mobilenet.onnx (opset 13, BatchNormalization nodes kept so that qcal
folds them). Seeded: the same torch build on the same thread count gives the same weights.

    nice /usr/bin/python3 examples/mobilenet/train.py [--epochs N] [--threads N] [--out DIR]

The network is torchvision 0.14's mobilenet_v2 (BatchNorm, ReLU6, depthwise convolutions,
inverted residuals) with width multiplier WIDTH and a stem for 28x28 grayscale: a 3x3
convolution from 1 channel, and the inverted-residual settings cut to SETTING: three
stride-2 steps in all (28 -> 14 -> 7 -> 4), the last 1x1 convolution LAST channels wide.
One thread by default: on this 2-core machine two threads made PyTorch's depthwise
convolutions slower, not faster.

Recipe of the committed weights (the defaults): 2 epochs, batch 128, random horizontal
flips, SGD with Nesterov momentum 0.9 and no weight decay, one-cycle schedule to a peak
learning rate of 0.3 (float top-1 88.70%, 21 min under load here). The high rate leaves a
few channels almost silent; BatchNorm then scales their weights up when folded, the way
per-tensor weights break on ImageNet MobileNets. With `--optimizer adam --lr 2e-3` the
folded ranges stay within 7x of each other and per-tensor weights lose nothing
(docs/models.md has both). Data: Debian's dataset-fashion-mnist, normalised as the demo
does, (pixel / 255 - 0.2860) / 0.3530. Needs /usr/bin/python3 with torch 1.13, torchvision
0.14 (python3-torchvision) and onnx."""
import argparse
import gzip
import json
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torchvision
from torchvision.ops.misc import Conv2dNormActivation

DATA = os.environ.get("QCAL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530
WIDTH = 0.5
SEED = 24
# t (expansion), c (channels before the width multiplier), n (blocks), s (first stride)
SETTING = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 2, 1], [6, 96, 1, 1]]
LAST = 320


def load_idx(kind):
    """Fashion-MNIST split `kind` ('train' or 't10k'): float32 (N, 1, 28, 28), int64 (N,)."""
    with gzip.open(os.path.join(DATA, "%s-images-idx3-ubyte.gz" % kind), "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        if magic != 0x803 or (rows, cols) != (28, 28):
            raise SystemExit("%s: unexpected IDX header" % kind)
        px = np.frombuffer(f.read(n * 784), dtype=np.uint8)
    with gzip.open(os.path.join(DATA, "%s-labels-idx1-ubyte.gz" % kind), "rb") as f:
        magic, m = struct.unpack(">II", f.read(8))
        if magic != 0x801 or m != n:
            raise SystemExit("%s: unexpected label header" % kind)
        y = np.frombuffer(f.read(n), dtype=np.uint8)
    x = px.astype(np.float32) / np.float32(255.0)
    x = ((x - np.float32(MEAN)) / np.float32(STD)).reshape(n, 1, 28, 28).astype(np.float32)
    return x, y.astype(np.int64)


def build(width=WIDTH):
    """torchvision's MobileNetV2 for 28x28 grayscale (stem: stride 1, one input channel)."""
    net = torchvision.models.mobilenet_v2(num_classes=10, width_mult=width,
                                          inverted_residual_setting=SETTING)
    c0 = net.features[0][0].out_channels
    net.features[0] = Conv2dNormActivation(1, c0, stride=2, norm_layer=nn.BatchNorm2d,
                                           activation_layer=nn.ReLU6)
    # the last 1x1 convolution: LAST channels instead of torchvision's fixed 1280
    c1 = net.features[-1][0].in_channels
    net.features[-1] = Conv2dNormActivation(c1, LAST, kernel_size=1, norm_layer=nn.BatchNorm2d,
                                            activation_layer=nn.ReLU6)
    net.classifier[1] = nn.Linear(LAST, 10)
    nn.init.normal_(net.classifier[1].weight, 0, 0.01)
    nn.init.zeros_(net.classifier[1].bias)
    return net


def save_safetensors(path, tensors):
    """Writes a .safetensors file (8-byte little-endian header length, JSON header, data)."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        a = np.ascontiguousarray(t.detach().cpu().numpy())
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    os.replace(tmp, path)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": np.float32, "I64": np.int64}[e["dtype"]]
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dt).reshape(e["shape"]).copy())
    return out


def export_onnx(net, path):
    """ONNX opset 13 with BatchNormalization kept: TrainingMode.PRESERVE on a model in eval
    mode skips the exporter's eval-mode Conv+BN fusion (the BN runs with running statistics)."""
    net.eval()
    tmp = path + ".tmp"
    torch.onnx.export(net, torch.zeros(1, 1, 28, 28), tmp, opset_version=13,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}},
                      training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=True)
    import onnx
    m = onnx.load(tmp)
    tidy_onnx(m)
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, tmp)
    os.replace(tmp, path)


def tidy_onnx(m):
    """The exporter in PRESERVE mode routes parameters through Identity nodes and writes
    Clip bounds as Constant nodes: Identity nodes of initializers are removed (their readers
    read the initializer) and Constant tensors become initializers, so every Conv weight is an
    initializer of the Conv (what qcal folds and quantizes). The function is unchanged."""
    import onnx
    g = m.graph
    inits = {t.name for t in g.initializer}
    alias, keep = {}, []
    for n in g.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            t = onnx.TensorProto()
            t.CopyFrom(n.attribute[0].t)
            t.name = n.output[0]
            g.initializer.append(t)
            inits.add(n.output[0])
        elif n.op_type == "Identity" and n.input[0] in inits and n.output[0] not in [o.name for o in g.output]:
            alias[n.output[0]] = n.input[0]
        else:
            keep.append(n)
    for n in keep:
        for i, name in enumerate(n.input):
            if name in alias:
                n.input[i] = alias[name]
    del g.node[:]
    g.node.extend(keep)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="sgd")
    ap.add_argument("--lr", type=float, default=0.3, help="peak learning rate of the one-cycle schedule")
    ap.add_argument("--train-images", type=int, default=60000)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--export-only", metavar="WEIGHTS",
                    help="no training: load WEIGHTS (.safetensors) and write the ONNX export to --out")
    a = ap.parse_args()
    if a.export_only:
        net = build()
        net.load_state_dict(load_safetensors(a.export_only), strict=False)
        export_onnx(net, os.path.join(a.out, "mobilenet.onnx"))
        print("wrote %s/mobilenet.onnx" % a.out)
        return
    torch.manual_seed(SEED)
    torch.set_num_threads(a.threads)
    x, y = load_idx("train")
    x, y = torch.from_numpy(x[:a.train_images]), torch.from_numpy(y[:a.train_images])
    xt, yt = load_idx("t10k")
    net = build()
    print("parameters: %d" % sum(p.numel() for p in net.parameters()))
    if a.optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=a.lr)
    else:
        # no weight decay: nothing pulls the weights of channels that stopped firing back to 0
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9, nesterov=True)
    steps = a.epochs * ((len(x) + a.batch - 1) // a.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=steps)
    g = torch.Generator().manual_seed(SEED)
    t0 = time.monotonic()
    for ep in range(a.epochs):
        net.train()
        perm = torch.randperm(len(x), generator=g)
        tot, n = 0.0, 0
        for i in range(0, len(x), a.batch):
            idx = perm[i:i + a.batch]
            xb = x[idx]
            # augmentation: random horizontal flip (seeded)
            flip = torch.rand(len(idx), generator=g) < 0.5
            xb = torch.where(flip[:, None, None, None], xb.flip(3), xb)
            loss = nn.functional.cross_entropy(net(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            tot += float(loss) * len(idx)
            n += len(idx)
            if (i // a.batch) % 100 == 99:
                print("  epoch %d, %d images: loss %.4f (%.0f s)" % (ep + 1, n, tot / n, time.monotonic() - t0),
                      flush=True)
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(torch.from_numpy(xt[i:i + 1000])).argmax(1) for i in range(0, 10000, 1000)])
        acc = 100.0 * float((pred.numpy() == yt).mean())
        print("epoch %d: loss %.4f, test top-1 %.2f%% (%.0f s)" % (ep + 1, tot / n, acc, time.monotonic() - t0),
              flush=True)
    os.makedirs(a.out, exist_ok=True)
    sd = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    save_safetensors(os.path.join(a.out, "mobilenet.safetensors"), sd)
    export_onnx(net, os.path.join(a.out, "mobilenet.onnx"))
    print("wrote %s/mobilenet.safetensors and mobilenet.onnx (float top-1 %.2f%%)" % (a.out, acc))


if __name__ == "__main__":
    main()
