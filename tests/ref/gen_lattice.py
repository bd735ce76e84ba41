#!/usr/bin/python3
"""Single-batch fidelity references for the lattice grid (tests/test_observers_lattice.c).

Run with the Debian python (PyTorch 1.13 + numpy):  /usr/bin/python3 tests/ref/gen_lattice.py
Writes tests/data/histogram/lattice.bin (container format of gen_histogram.py):
  ncases (i), case<k>/x (f32 data), case<k>/out (f32: new_min, new_max, scale) and
  case<k>/zp (i) from PyTorch 1.13's HistogramObserver L2 search (_non_linear_param_search,
  calculate_qparams; quint8 per_tensor_affine, 2048 bins) on a float-bounds
  torch.histc(x, 2048, min=x.min(), max=x.max()) of the same data (PyTorch's own forward
  truncates the bounds with int(); the float-bounds histogram is the one qcal approximates).
"""
import os
import sys

import numpy as np
import torch
from torch.ao.quantization.observer import HistogramObserver

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_histogram import Writer  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "histogram")
N = 10000


def datasets(rng):
    outl = rng.normal(0, 20, N)
    outl[[17, 4242, 9000]] = [-800.0, 1200.0, 950.0]
    return [
        ("normal", rng.standard_normal(N)),
        ("relu", np.maximum(rng.standard_normal(N), 0)),
        ("lognormal", rng.lognormal(0.0, 1.0, N)),
        ("outlier", outl),
        ("bimodal", np.concatenate([rng.normal(-3, 0.5, N // 2), rng.normal(5, 1.0, N - N // 2)])),
        ("skewed", rng.gamma(1.5, 2.0, N) - 1.0),
    ]


def main():
    w = Writer()
    cases = datasets(np.random.default_rng(11))
    for k, (name, x) in enumerate(cases):
        x = torch.from_numpy(x.astype(np.float32))
        mn, mx = float(x.min()), float(x.max())
        hist = torch.histc(x, 2048, min=mn, max=mx)
        obs = HistogramObserver(bins=2048, dtype=torch.quint8)
        obs.histogram.resize_(hist.shape).copy_(hist)
        obs.min_val.copy_(torch.tensor(mn))
        obs.max_val.copy_(torch.tensor(mx))
        new_min, new_max = obs._non_linear_param_search()
        s, z = obs.calculate_qparams()
        w.add(f"case{k}/x", "f", x.numpy())
        w.add(f"case{k}/out", "f", [float(new_min), float(new_max), float(s)])
        w.add(f"case{k}/zp", "i", [int(z)])
        print(f"case{k} {name} [{mn}, {mx}] -> [{float(new_min)}, {float(new_max)}] "
              f"scale={float(s)} zp={int(z)}")
    w.add("ncases", "i", [len(cases)])
    w.save(os.path.join(OUT, "lattice.bin"))


if __name__ == "__main__":
    main()
