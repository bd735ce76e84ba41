#!/usr/bin/python3
"""Reference data for tests/test_observers_histogram_torch.c (grid=torch).

Run with the Debian python (PyTorch 1.13 + numpy):
    /usr/bin/python3 tests/ref/gen_histogram_torch.py
Writes tests/data/histogram/torch.bin (container format: tests/ref/gen_histogram.py).

The batches are not stored: both sides generate them from a spec with float32 arithmetic
that is exact IEEE on either side (splitmix64 hashes -> 24-bit uniforms -> + - * / in float32,
one op at a time), so the C test rebuilds the same bits.

case<k>/spec (d): bins, qcfg (0: quint8 per_tensor_affine, 1: qint8 per_tensor_symmetric,
                  2: quint8 per_tensor_symmetric reduce_range), nbatches, then per batch
                  n, kind, scale, shift, seed.
case<k>/b<j>/hist (f): torch.ao HistogramObserver.histogram after batch j,
case<k>/b<j>/range (f): min_val, max_val, scale,
case<k>/b<j>/zp (i): zero_point (calculate_qparams after batch j).
"""
import os
import struct
import sys

import numpy as np
import torch
from torch.ao.quantization.observer import HistogramObserver

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_histogram import Writer  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "histogram")

M64 = (1 << 64) - 1


def splitmix(seed, idx):
    """splitmix64 of seed + idx * golden, vectorised (uint64 wraps)."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + idx.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


def batch(n, kind, scale, shift, seed):
    """Kinds: 0 Irwin-Hall(4) bell, 1 its ReLU, 2 heavy tails, 3 constant, 4 uniform."""
    i = np.arange(n, dtype=np.uint64)
    f = np.float32
    u = [((splitmix(seed, i * np.uint64(4) + np.uint64(j)) >> np.uint64(40)).astype(f)
          * f(2.0 ** -24)) for j in range(4)]
    sc, sh = f(scale), f(shift)
    if kind in (0, 1):
        s = u[0] + u[1]
        s = s + u[2]
        s = s + u[3]
        s = s - f(2.0)
        s = s * sc
        s = s + sh
        if kind == 1:
            s = np.maximum(s, f(0.0))
    elif kind == 2:
        s = (u[0] - f(0.5)) / (u[1] + f(0.001))
        s = s * sc
        s = s + sh
    elif kind == 3:
        s = np.full(n, sh, dtype=f)
    else:
        s = u[0] * f(2.0)
        s = s - f(1.0)
        s = s * sc
        s = s + sh
    return s.astype(f)


QCFG = {
    0: dict(dtype=torch.quint8, qscheme=torch.per_tensor_affine),
    1: dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
    2: dict(dtype=torch.quint8, qscheme=torch.per_tensor_symmetric, reduce_range=True),
}

# (bins, qcfg, [(n, kind, scale, shift, seed), ...])
GROW = [(3000, 0, 1.0, 0.0, 11), (3000, 0, 2.5, 0.25, 12), (3000, 0, 0.5, 0.0, 13),
        (3000, 0, 6.0, -1.0, 14)]
CASES = [
    (2048, 0, GROW),                                   # growing ranges
    (2048, 0, GROW[::-1]),                             # the same batches reversed
    (2048, 1, [(4000, 1, 3.0, 0.0, 21), (4000, 1, 5.0, 0.0, 22), (4000, 1, 2.0, 0.0, 23)]),
    (2048, 0, [(2000, 4, 0.4, 0.5, 31), (2000, 4, 0.45, 0.5, 32),    # inside (0, 1): int()
               (2000, 4, 1.5, 0.0, 33), (2000, 0, 0.3, 0.2, 34)]),  # edges equal, aminmax
    (2048, 0, [(5000, 4, 5.0, 0.0, 41)] * 1 + [(5000, 4, 5.0, 0.0, 42 + k) for k in range(4)]),
    (255, 0, [(3000, 0, 1.0, 0.0, 51), (3000, 0, 3.0, 0.0, 52), (3000, 2, 1.0, 0.0, 53)]),
    (2048, 0, [(1000, 3, 0.0, 0.0, 61), (1000, 3, 0.0, 2.5, 62), (3000, 0, 1.0, 0.0, 63),
               (3000, 0, 1.5, 0.0, 64)]),             # constant batches re-initialise
    (2048, 1, [(3000, 2, 1.0, 0.0, 71), (3000, 2, 4.0, 0.0, 72), (3000, 2, 0.5, 3.0, 73)]),
    # > 131072 values: the cumulative sums of the upsampled histogram pass 2^24, where
    # torch's float-rounded shifted sums differ from exact ones
    (2048, 0, [(200000, 0, 1.0, 0.0, 81), (50000, 0, 1.3, 0.0, 82),
               (50000, 1, 2.0, 0.0, 83)]),
    (512, 2, [(3000, 1, 2.0, 0.0, 91), (3000, 0, 2.0, 0.0, 92)]),
    (2048, 0, [(3000, 0, 300.0, 0.0, 101), (3000, 0, 900.0, 50.0, 102),
               (3000, 2, 10.0, 0.0, 103)]),
]


def main():
    torch.set_num_threads(1)
    w = Writer()
    for k, (bins, qcfg, spec) in enumerate(CASES):
        obs = HistogramObserver(bins=bins, **QCFG[qcfg])
        flat = [bins, qcfg, len(spec)]
        for j, (n, kind, scale, shift, seed) in enumerate(spec):
            flat += [n, kind, scale, shift, seed]
            obs(torch.from_numpy(batch(n, kind, scale, shift, seed)))
            s, z = obs.calculate_qparams()
            w.add(f"case{k}/b{j}/hist", "f", obs.histogram.numpy())
            w.add(f"case{k}/b{j}/range", "f",
                  [obs.min_val.item(), obs.max_val.item(), s.item()])
            w.add(f"case{k}/b{j}/zp", "i", [int(z.item())])
        w.add(f"case{k}/spec", "d", flat)
        print(f"case{k}: bins {bins}, {len(spec)} batches -> [{obs.min_val.item():.9g}, "
              f"{obs.max_val.item():.9g}] scale {s.item():.9g} zp {int(z.item())}")
    w.add("ncases", "i", [len(CASES)])
    os.makedirs(OUT, exist_ok=True)
    w.save(os.path.join(OUT, "torch.bin"))


if __name__ == "__main__":
    main()
