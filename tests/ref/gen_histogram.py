#!/usr/bin/python3
"""Reference data for tests/test_observers_histogram.c and test_observers_calibrators.c.

Run with the Debian python (PyTorch 1.13 + numpy):  /usr/bin/python3 tests/ref/gen_histogram.py
Writes tests/data/histogram/{l2.bin,histc.bin,calib.bin}.

Container format (little-endian), one file = a sequence of named arrays:
  u32 name_len, name bytes, u8 kind ('f' float32, 'd' float64, 'q' uint64, 'i' int64),
  u64 count, count elements.

l2.bin     case<k>/hist (f32), case<k>/meta (d: bins, dst_nbins, min, max) and
           case<k>/out (f32: new_min, new_max, scale_u8_affine, scale_s8_symmetric) +
           case<k>/zp (i: zp_u8_affine, zp_s8_symmetric), from PyTorch's own
           HistogramObserver._non_linear_param_search / calculate_qparams on that histogram.
histc.bin  case<k>/x (f32), case<k>/meta (d: bins, min, max, absval), case<k>/counts (q):
           torch.histc(x or |x|, bins, min=min, max=max) with float bounds.
calib.bin  independent Python implementations of the variants documented in
           include/qcal/observers/histogram.h, on committed |x| histograms:
           h<k>/counts (q), h<k>/meta (d: bins, hi), h<k>/entropy (d: best_i, kl),
           h<k>/mse127 and h<k>/mse255 (d: best_i, mse), h<k>/pct (d: p, threshold, ...).
           s<k>/counts, s<k>/meta (d: bins, lo, hi), s<k>/pct2 (d: p, lo_clip, hi_clip, ...).
"""
import math
import os
import struct

import numpy as np
import torch
from torch.ao.quantization.observer import HistogramObserver

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "histogram")


class Writer:
    def __init__(self):
        self.parts = []

    def add(self, name, kind, values):
        dt = {"f": "<f4", "d": "<f8", "q": "<u8", "i": "<i8"}[kind]
        arr = np.ascontiguousarray(np.asarray(values, dtype=dt).ravel())
        nb = name.encode()
        self.parts.append(struct.pack("<I", len(nb)) + nb + kind.encode() +
                          struct.pack("<Q", arr.size) + arr.tobytes())

    def save(self, path):
        with open(path, "wb") as f:
            for p in self.parts:
                f.write(p)
        print(path, os.path.getsize(path), "bytes")


def datasets(rng):
    return {
        "normal": rng.standard_normal(100000).astype(np.float32),
        "lognormal": rng.lognormal(0.0, 1.0, 100000).astype(np.float32),
        "relu": np.maximum(rng.standard_normal(100000), 0).astype(np.float32),
        "heavy": rng.standard_t(1.5, 100000).astype(np.float32),
        "sparse": np.concatenate([rng.integers(0, 5, 50000) * 1.3,
                                  [40.0, -7.5]]).astype(np.float32),
        "bimodal": np.concatenate([rng.normal(-3, 0.5, 40000),
                                   rng.normal(2, 1.0, 60000)]).astype(np.float32),
        "uniform": rng.uniform(-0.2, 5.0, 30000).astype(np.float32),
        "laplace": rng.laplace(0.0, 0.3, 60000).astype(np.float32),
    }


def l2_cases(rng, w):
    d = datasets(rng)
    cases = [  # (data name, bins, dtype, count multiplier)
        ("normal", 2048, torch.quint8, 1), ("lognormal", 2048, torch.quint8, 1),
        ("relu", 2048, torch.quint8, 1), ("heavy", 2048, torch.quint8, 1),
        ("sparse", 2048, torch.quint8, 1), ("bimodal", 2048, torch.quint8, 1),
        ("uniform", 100, torch.quint8, 1), ("laplace", 2047, torch.quint8, 1),
        ("normal", 2048, torch.qint32, 1), ("normal", 5, torch.quint8, 1),
        ("laplace", 2048, torch.quint8, 3001),  # float32 counts far above 2^24
        ("heavy", 1000, torch.quint8, 7),
    ]
    for k, (name, bins, dtype, mult) in enumerate(cases):
        x = torch.from_numpy(d[name])
        mn, mx = float(x.min()), float(x.max())
        hist = torch.histc(x, bins, min=mn, max=mx) * mult
        obs = HistogramObserver(bins=bins, dtype=dtype)
        obs.histogram.resize_(hist.shape).copy_(hist)
        obs.min_val.copy_(torch.tensor(mn))
        obs.max_val.copy_(torch.tensor(mx))
        new_min, new_max = obs._non_linear_param_search()
        s8, z8 = obs.calculate_qparams()
        sym = HistogramObserver(bins=bins, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
        sym.histogram.resize_(hist.shape).copy_(hist)
        sym.min_val.copy_(obs.min_val)
        sym.max_val.copy_(obs.max_val)
        ss, zs = sym.calculate_qparams()
        w.add(f"case{k}/hist", "f", hist.numpy())
        w.add(f"case{k}/meta", "d", [bins, obs.dst_nbins, mn, mx])
        w.add(f"case{k}/out", "f", [float(new_min), float(new_max), float(s8), float(ss)])
        w.add(f"case{k}/zp", "i", [int(z8), int(zs)])
        print(f"l2 case{k} {name} bins={bins} [{mn}, {mx}] -> [{float(new_min)}, {float(new_max)}]"
              f" scale={float(s8)} zp={int(z8)}")
    w.add("ncases", "i", [len(cases)])


def histc_cases(rng, w):
    cases = []
    x = rng.standard_normal(10000).astype(np.float32)
    cases.append((x, 2048, float(x.min()), float(x.max()), 0))
    # Values on and next to the float bin edges of a non-power-of-two grid, plus min and max.
    lo, hi, bins = np.float32(-1.0), np.float32(0.7), 10
    edges = torch.linspace(float(lo), float(hi), bins + 1).numpy()
    near = np.concatenate([edges, np.nextafter(edges, np.float32(-2)),
                           np.nextafter(edges, np.float32(2)), [lo, hi, hi, hi]])
    near = near[(near >= lo) & (near <= hi)].astype(np.float32)
    cases.append((near, bins, float(lo), float(hi), 0))
    # Edges as lo + k * width computed in float (what users would write), 7 bins.
    lo, hi, bins = np.float32(0.1), np.float32(0.3), 7
    wd = (hi - lo) / np.float32(bins)
    xs = np.array([lo + np.float32(k) * wd for k in range(bins + 1)], dtype=np.float32)
    xs = np.concatenate([xs, np.nextafter(xs, np.float32(0)), np.nextafter(xs, np.float32(1))])
    xs = xs[(xs >= lo) & (xs <= hi)].astype(np.float32)
    cases.append((xs, bins, float(lo), float(hi), 0))
    # A range of a few ulps: every float in it.
    lo = np.float32(1.0)
    xs = np.array([np.float32(1.0) + np.float32(k) * np.float32(2.0 ** -23) for k in range(65)],
                  dtype=np.float32)
    cases.append((xs, 2048, float(lo), float(xs.max()), 0))
    # |x| histogram over [0, max|x|] with mixed signs and zeros.
    x = np.concatenate([rng.standard_normal(5000), np.zeros(17), [-3.25, 3.25]]).astype(np.float32)
    cases.append((x, 2048, 0.0, float(np.abs(x).max()), 1))
    # Large magnitudes (not near overflow of (x - lo) * bins).
    x = (rng.standard_normal(3000) * 1e30).astype(np.float32)
    cases.append((x, 2048, float(x.min()), float(x.max()), 0))
    for k, (x, bins, lo, hi, absval) in enumerate(cases):
        t = torch.from_numpy(np.abs(x) if absval else x)
        c = torch.histc(t, bins, min=lo, max=hi).numpy().astype(np.uint64)
        w.add(f"case{k}/x", "f", x)
        w.add(f"case{k}/meta", "d", [bins, lo, hi, absval])
        w.add(f"case{k}/counts", "q", c)
        print(f"histc case{k} n={x.size} bins={bins} [{lo}, {hi}] abs={absval} total={c.sum()}")
    w.add("ncases", "i", [len(cases)])


# ---- independent references of the documented calibrator variants ---------------------

def ref_percentile(counts, lo, hi, q):
    """Linear interpolation inside the first non-empty bin whose cumulative count reaches
    q * total."""
    counts = [int(c) for c in counts]
    total = sum(counts)
    wd = (hi - lo) / len(counts)
    target = q * float(total)
    below = 0
    last = -1
    for i, c in enumerate(counts):
        if c == 0:
            continue
        last = i
        if float(below + c) >= target:
            f = min(max((target - float(below)) / float(c), 0.0), 1.0)
            return lo + (float(i) + f) * wd
        below += c
    return lo + float(last + 1) * wd


def ref_entropy(counts, levels):
    """TensorRT KL search on the histogram with bins[0] = min(bins[0], bins[1]) (the
    zero-spike clamp of observers/entropy.c; NVIDIA copies bins[1]): P = bins[:i] with the
    outliers added to P[i-1]; Q = the unclipped bins[:i] merged into `levels` levels
    (bin j -> j*levels//i) and spread over each level's non-zero bins; p = P/total,
    q = Q/(total - outliers); KL(p||q), inf where q = 0 < p. Only bin 0 non-empty:
    (bins, 0.0)."""
    counts = [int(c) for c in counts]
    nb = len(counts)
    if nb >= 2:
        counts[0] = min(counts[0], counts[1])
    if sum(counts) == 0:
        return nb, 0.0
    total = sum(counts)
    S = float(total)
    best_i, best_kl = nb, math.inf
    for i in range(levels, nb + 1):
        outl = sum(counts[i:])
        P = counts[:i]
        P[i - 1] += outl
        lev = [(j * levels) // i for j in range(i)]
        lsum = [0] * levels
        nz = [0] * levels
        for j in range(i):
            lsum[lev[j]] += counts[j]
            nz[lev[j]] += 1 if counts[j] > 0 else 0
        SQ = float(total - outl)
        Q = [(float(lsum[lev[j]]) / float(nz[lev[j]])) / SQ if counts[j] > 0 else 0.0
             for j in range(i)] if SQ > 0 else [0.0] * i
        kl = 0.0
        for j in range(i):
            if P[j] == 0:
                continue
            if Q[j] == 0.0:
                kl = math.inf
                break
            p = float(P[j]) / S
            kl += p * (math.log(p) - math.log(Q[j]))
        if kl < best_kl:
            best_kl, best_i = kl, i
    return best_i, best_kl


def ref_mse(counts, hi, nlev):
    counts = np.asarray(counts, dtype=np.uint64).astype(np.float64)
    nb = counts.size
    wd = hi / nb
    c = (np.arange(nb, dtype=np.float64) + 0.5) * wd
    best_i, best = nb - 1, math.inf
    for i in range(min(128, nb - 1), nb):
        amax = (float(i) + 0.5) * wd
        s = amax / float(nlev)
        q = np.minimum(np.rint(c / s), float(nlev))
        d = q * s - c
        err = float(np.cumsum((d * d) * counts)[-1])
        mse = err / nb
        if mse < best:
            best, best_i = mse, i
    return best_i, best


def calib_cases(rng, w):
    d = datasets(rng)
    abs_sets = [("normal", 2048), ("relu", 2048), ("heavy", 2048), ("sparse", 2048),
                ("lognormal", 512), ("laplace", 300)]
    pcts = [99.99, 99.9, 99.0, 50.0, 100.0]
    for k, (name, bins) in enumerate(abs_sets):
        a = torch.from_numpy(np.abs(d[name]))
        hi = float(a.max())
        counts = torch.histc(a, bins, min=0.0, max=hi).numpy().astype(np.uint64)
        w.add(f"h{k}/counts", "q", counts)
        w.add(f"h{k}/meta", "d", [bins, hi])
        ei, ekl = ref_entropy(counts, 128)
        w.add(f"h{k}/entropy", "d", [ei, ekl])
        for nlev in (127, 255):
            mi, mv = ref_mse(counts, hi, nlev)
            w.add(f"h{k}/mse{nlev}", "d", [mi, mv])
        pv = []
        for p in pcts:
            pv += [p, ref_percentile(counts, 0.0, hi, p / 100.0)]
        w.add(f"h{k}/pct", "d", pv)
        print(f"calib h{k} {name}: entropy i={ei} kl={ekl:.6g}; pct {pv[1]:.6g}")
    signed_sets = [("normal", 2048), ("lognormal", 2048), ("bimodal", 1000)]
    for k, (name, bins) in enumerate(signed_sets):
        x = torch.from_numpy(d[name])
        lo, hi = float(x.min()), float(x.max())
        counts = torch.histc(x, bins, min=lo, max=hi).numpy().astype(np.uint64)
        w.add(f"s{k}/counts", "q", counts)
        w.add(f"s{k}/meta", "d", [bins, lo, hi])
        pv = []
        for p in pcts:
            pv += [p, ref_percentile(counts, lo, hi, 1.0 - p / 100.0),
                   ref_percentile(counts, lo, hi, p / 100.0)]
        w.add(f"s{k}/pct2", "d", pv)
    w.add("nabs", "i", [len(abs_sets)])
    w.add("nsigned", "i", [len(signed_sets)])
    w.add("pcts", "d", pcts)


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    w = Writer()
    histc_cases(np.random.default_rng(1), w)
    w.save(os.path.join(OUT, "histc.bin"))
    w = Writer()
    l2_cases(np.random.default_rng(2), w)
    w.save(os.path.join(OUT, "l2.bin"))
    w = Writer()
    calib_cases(np.random.default_rng(3), w)
    w.save(os.path.join(OUT, "calib.bin"))


if __name__ == "__main__":
    main()
