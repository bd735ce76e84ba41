#!/usr/bin/python3
"""Python observer calls and FX calibration: qcal (numpy API, qcal.torch) against torch.ao.

Every row times qcal and PyTorch interleaved in pairs (qcal, torch, torch, qcal, ...: the
order alternates) and reports the median of the per-pair ratios torch/qcal with their spread
(min-max over the pairs), so a busy machine slows both sides of a pair alike. Both libraries
run on the same thread count (--threads, default 1: torch.set_num_threads and
qcal.set_num_threads).

Rows (targets from the issue "qcal in Python"):
  hist_1m         HistogramObserver call on 1M floats, range growing over 8 batches  >= 10x
  minmax_1m       MinMaxObserver call on 1M floats                                   >= 1x
  minmax_64       MinMaxObserver call on 64 floats                                   >= 1x
  numpy_64        qcal.Observer("histogram").update(64-float numpy array)           <= 5 us
  torch_64        qcal.torch.HistogramObserver()(64-float tensor), module call      <= 5 us
                  (the two 64-element rows pair with torch.ao's HistogramObserver call
                  on the same tensor; the verdict is on qcal's median absolute time, the
                  detail gives the fastest pair: on a loaded machine the closer estimate)
  fx_calibrate    FX calibration of the demo CNN (examples/cnn: conv 1->32 3x3 pad 1, ReLU,
                  max-pool 2, conv 32->64, ReLU, max-pool 2, fc 3136->128, ReLU, fc 128->10;
                  the demo's trained weights from ~/.cache/qcal when present): the model
                  prepare_fx'ed with histogram activation observers (reduce_range) and
                  per-channel symmetric qint8 weight observers, run under torch.no_grad()
                  over 1000 calibration images in 10 batches of 100 (the first 1000
                  Fashion-MNIST training images, normalised as the demo, when
                  /usr/share/datasets/fashion-mnist is there; else seeded uniform noise).
                  Timed: the 10 forward calls, convolutions included; not prepare_fx or
                  convert_fx (their own rows). No target: PyTorch's own float forward
                  is a fixed share of both sides (fx_float gives the ceiling).
  fx_observers    the observers' share of that calibration: the same run with every
                  observer call timed (perf_counter around each call), summed     >= 10x
  fx_float        the float model over the same batches (the floor of any calibration
                  time: ceiling of the fx_calibrate ratio = torch's time / this)
  fx_prepare      prepare_fx of the model (qcal.torch vs torch.ao observer classes)
  fx_convert      convert_fx of the calibrated model

Output: one JSON object per row on stdout as each row finishes (fields: name, label, qcal,
torch (median seconds per call; torch null for fx_float's reference), ratio (median of the
paired torch/qcal ratios), spread [min, max], target, verdict ("pass", "MISSED" or null
without a target), threads, pairs, detail; qcal_s / torch_s repeat the times for
bench/summary.py), then a Markdown table on stderr. --json FILE also writes the rows as a
JSON list. Exit status 0 whatever the verdicts.

usage: PYTHONPATH=<builddir>/python /usr/bin/python3 bench/python_observers.py [--quick]
       [--pairs N] [--threads N] [--only NAME,...] [--json FILE]
"""
import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time
import warnings

import numpy as np
import torch
from torch.ao.quantization import observer as tob

import qcal
import qcal.torch as qt

warnings.filterwarnings("ignore")


def per_call(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def paired(fq, ft, reps, pairs):
    """Paired timing: (median qcal s, median torch s, median ratio, min ratio, max ratio)."""
    fq(), ft()  # warm up
    tq, tt, r = [], [], []
    for i in range(pairs):
        if i % 2 == 0:
            a = per_call(fq, reps)
            b = per_call(ft, reps)
        else:
            b = per_call(ft, reps)
            a = per_call(fq, reps)
        tq.append(a)
        tt.append(b)
        r.append(b / a)
    paired.fastest = min(tq)
    return statistics.median(tq), statistics.median(tt), statistics.median(r), min(r), max(r)


# ---- the demo CNN ------------------------------------------------------------------------

class DemoCNN(torch.nn.Module):
    """examples/cnn's network (tensor names as the demo's safetensors file)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(3136, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def demo_weights():
    """The demo's trained weights (safetensors in ~/.cache/qcal), or None."""
    d = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "qcal")
    try:
        names = sorted(f for f in os.listdir(d) if f.startswith("fmnist_cnn") and
                       f.endswith(".safetensors"))
    except OSError:
        return None
    if not names:
        return None
    path = os.path.join(d, names[0])
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    sd = {}
    for k, v in header.items():
        if k == "__metadata__" or v.get("dtype") != "F32":
            continue
        a, b = v["data_offsets"]
        sd[k] = torch.from_numpy(np.frombuffer(blob[a:b], np.float32).reshape(v["shape"]).copy())
    return os.path.basename(path), sd


def model(weights):
    torch.manual_seed(0)
    m = DemoCNN()
    if weights is not None:
        m.load_state_dict(weights[1])
    return m.eval()


def calibration_batches(n=1000, batch=100):
    """(description, [batch tensors]) of the first n Fashion-MNIST training images
    normalised as the demo ((p / 255 - 0.2860) / 0.3530), or seeded noise."""
    path = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
    try:
        with gzip.open(path, "rb") as f:
            magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
            if magic != 0x803 or count < n or (rows, cols) != (28, 28):
                raise ValueError("unexpected IDX header")
            px = np.frombuffer(f.read(n * 784), np.uint8).astype(np.float32)
        x = ((px / np.float32(255) - np.float32(0.2860)) / np.float32(0.3530))
        x = torch.from_numpy(x.reshape(n, 1, 28, 28).copy())
        what = f"Fashion-MNIST train[0:{n}]"
    except (OSError, ValueError):
        g = torch.Generator().manual_seed(0)
        x = torch.rand(n, 1, 28, 28, generator=g) * 3 - 0.8
        what = f"{n} seeded uniform noise images"
    return what, list(x.split(batch))


def qconfig_mapping(mod):
    from torch.ao.quantization import QConfig, QConfigMapping
    w = mod.PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
                                               qscheme=torch.per_channel_symmetric)
    return QConfigMapping().set_global(
        QConfig(activation=mod.HistogramObserver.with_args(reduce_range=True), weight=w))


def fx_trial(mod, weights, data):
    """(prepare s, calibration s, observer s, convert s) of one full FX PTQ with the observer
    classes of mod (qcal.torch or torch.ao.quantization.observer). The observer time comes
    from a second, instrumented calibration of a second prepared model."""
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    qmap = qconfig_mapping(mod)
    t0 = time.perf_counter()
    m = prepare_fx(model(weights), qmap, example_inputs=(data[0],))
    t1 = time.perf_counter()
    with torch.no_grad():
        for x in data:
            m(x)
    t2 = time.perf_counter()
    convert_fx(m)
    t3 = time.perf_counter()
    # instrumented copy: every observer call timed
    m2 = prepare_fx(model(weights), qmap, example_inputs=(data[0],))
    spent = [0.0]
    for sub in m2.modules():
        if isinstance(sub, tob.ObserverBase):
            fwd = sub.forward

            def timed(x, _f=fwd):
                s = time.perf_counter()
                y = _f(x)
                spent[0] += time.perf_counter() - s
                return y
            sub.forward = timed
    with torch.no_grad():
        for x in data:
            m2(x)
    return t1 - t0, t2 - t1, spent[0], t3 - t2


def float_forward(weights, data):
    m = model(weights)
    t0 = time.perf_counter()
    with torch.no_grad():
        for x in data:
            m(x)
    return time.perf_counter() - t0


# ---- rows ----------------------------------------------------------------------------------

class Rows:
    def __init__(self, threads, pairs, json_path):
        self.rows, self.threads, self.pairs, self.json_path = [], threads, pairs, json_path

    def add(self, name, label, tq, tt, ratio, lo, hi, target, ok, detail="", pairs=None):
        r = dict(name=name, label=label, qcal=tq, torch=tt, ratio=ratio,
                 spread=None if lo is None else [lo, hi], target=target,
                 verdict=None if ok is None else ("pass" if ok else "MISSED"),
                 threads=self.threads, pairs=pairs or self.pairs, detail=detail,
                 qcal_s=tq, torch_s=tt)
        self.rows.append(r)
        print(json.dumps(r), flush=True)

    def table(self):
        def t(s):
            if s is None:
                return ""
            return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.2f} us"
        out = ["| row | qcal | PyTorch | ratio (median of pairs) | spread | target | verdict |",
               "|---|---|---|---|---|---|---|"]
        for r in self.rows:
            ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
            spread = "" if r["spread"] is None else \
                f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f}x"
            out.append(f"| {r['label']} | {t(r['qcal'])} | {t(r['torch'])} | {ratio} | "
                       f"{spread} | {r['target'] or ''} | {r['verdict'] or ''} |")
        return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 pairs (FX rows: 2)")
    ap.add_argument("--pairs", type=int, help="pairs per row (default 7, FX rows 4)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads for both libraries (default 1)")
    ap.add_argument("--only", help="comma-separated row names")
    ap.add_argument("--json", help="also write the rows to FILE as a JSON list")
    a = ap.parse_args()
    pairs = a.pairs or (3 if a.quick else 7)
    fx_pairs = a.pairs or (2 if a.quick else 4)
    torch.set_num_threads(a.threads)
    qcal.set_num_threads(a.threads)
    only = set(a.only.split(",")) if a.only else None
    rows = Rows(a.threads, pairs, a.json)

    def want(name):
        return only is None or name in only

    g = torch.Generator().manual_seed(0)
    x1m = [torch.randn(1 << 20, generator=g) * (1 + i) for i in range(8)]  # growing range
    x64 = [torch.randn(64, generator=g) for _ in range(8)]

    def cycling(o, xs):
        it = [0]

        def f():
            o(xs[it[0] % len(xs)])
            it[0] += 1
        return f

    def obs_row(name, label, qo, to, xs, reps, target):
        tq, tt, med, lo, hi = paired(cycling(qo, xs), cycling(to, xs), reps, pairs)
        rows.add(name, label, tq, tt, med, lo, hi, f">= {target:g}x", med >= target)

    if want("hist_1m"):
        obs_row("hist_1m", "HistogramObserver call, 1M floats (range growing over 8 batches)",
                qt.HistogramObserver(), tob.HistogramObserver(), x1m, 4, 10.0)
    if want("minmax_1m"):
        obs_row("minmax_1m", "MinMaxObserver call, 1M floats", qt.MinMaxObserver(),
                tob.MinMaxObserver(), x1m, 20, 1.0)
    if want("minmax_64"):
        obs_row("minmax_64", "MinMaxObserver call, 64 floats", qt.MinMaxObserver(),
                tob.MinMaxObserver(), x64, 2000, 1.0)
    if want("numpy_64"):
        o = qcal.Observer("histogram")
        n64 = [x.numpy() for x in x64]
        tq, tt, med, lo, hi = paired(cycling(o.update, n64),
                                     cycling(tob.HistogramObserver(), x64), 2000, pairs)
        rows.add("numpy_64", "qcal.Observer('histogram').update, 64 floats (numpy); "
                 "PyTorch: torch.ao HistogramObserver call", tq, tt, med, lo, hi, "<= 5 us",
                 tq <= 5e-6, detail=f"fastest pair {paired.fastest * 1e6:.2f} us")
    if want("torch_64"):
        tq, tt, med, lo, hi = paired(cycling(qt.HistogramObserver(), x64),
                                     cycling(tob.HistogramObserver(), x64), 2000, pairs)
        rows.add("torch_64", "qcal.torch.HistogramObserver call, 64 floats (tensor); "
                 "PyTorch: torch.ao HistogramObserver call", tq, tt, med, lo, hi, "<= 5 us",
                 tq <= 5e-6, detail=f"fastest pair {paired.fastest * 1e6:.2f} us")

    fx_names = ("fx_calibrate", "fx_observers", "fx_float", "fx_prepare", "fx_convert")
    if any(want(n) for n in fx_names):
        weights = demo_weights()
        what, data = calibration_batches()
        wdesc = f"weights {weights[0]}" if weights else "seeded random weights"
        res = {k: [] for k in ("q", "t", "f")}
        fx_trial(qt, weights, data[:1])          # warm up both (imports, allocator)
        fx_trial(tob, weights, data[:1])
        for i in range(fx_pairs):
            order = (("q", qt), ("t", tob)) if i % 2 == 0 else (("t", tob), ("q", qt))
            for key, mod in order:
                res[key].append(fx_trial(mod, weights, data))
            res["f"].append(float_forward(weights, data))

        def phase(k):
            q = [r[k] for r in res["q"]]
            t = [r[k] for r in res["t"]]
            r = [b / a for a, b in zip(q, t)]
            return statistics.median(q), statistics.median(t), statistics.median(r), min(r), \
                max(r)
        fl = statistics.median(res["f"])
        tq, tt, med, lo, hi = phase(1)
        ceiling = statistics.median(t[1] / f for t, f in zip(res["t"], res["f"]))
        common = f"{what}, {wdesc}"
        if want("fx_calibrate"):
            rows.add("fx_calibrate", "FX calibration of the demo CNN, histogram observers "
                     "(10 batches of 100 images, forward calls only)", tq, tt, med, lo, hi,
                     None, None,
                     detail=f"{common}; float model over the same batches {fl:.3f} s, so "
                     f"the ratio cannot exceed {ceiling:.2f}x (PyTorch's calibration / float "
                     f"forward)", pairs=fx_pairs)
        if want("fx_observers"):
            oq, ot, omed, olo, ohi = phase(2)
            rows.add("fx_observers", "FX calibration: time inside the observer calls",
                     oq, ot, omed, olo, ohi, ">= 10x", omed >= 10.0,
                     detail=f"{common}; summed perf_counter around every observer call of "
                     f"an instrumented copy; end to end (no target) {med:.2f}x, ceiling "
                     f"{ceiling:.2f}x", pairs=fx_pairs)
        if want("fx_float"):
            rows.add("fx_float", "Float demo CNN over the same 10 batches (reference, no "
                     "observers)", fl, None, None, None, None, None, None, detail=common,
                     pairs=fx_pairs)
        if want("fx_prepare"):
            pq, pt, pmed, plo, phi = phase(0)
            rows.add("fx_prepare", "prepare_fx of the demo CNN", pq, pt, pmed, plo, phi,
                     None, None, pairs=fx_pairs)
        if want("fx_convert"):
            cq, ct, cmed, clo, chi = phase(3)
            rows.add("fx_convert", "convert_fx of the calibrated demo CNN", cq, ct, cmed,
                     clo, chi, None, None, pairs=fx_pairs)

    print(rows.table(), file=sys.stderr)
    print(f"(threads {a.threads}; load average {os.getloadavg()[0]:.2f})", file=sys.stderr)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(rows.rows, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
