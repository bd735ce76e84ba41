#!/usr/bin/python3
"""Python observer calls: qcal (numpy API and qcal.torch) against torch.ao, side by side.

Each row times qcal and PyTorch interleaved in pairs (qcal, torch, qcal, torch, ...) and
gives the median of the paired ratios with its spread (min-max over the pairs), so a busy
machine slows both sides of a pair alike. Targets (issue: qcal in Python):
  - HistogramObserver call on 1M floats >= 10x PyTorch's
  - MinMaxObserver call no slower than PyTorch's (ratio >= 1)
  - a 64-element call <= 5 us (qcal.Observer.update on a numpy array, and qcal.torch forward)
  - FX calibration of the demo CNN with histogram observers >= 3x faster end to end
    (prepare_fx + 20 calibration batches of 32 images + convert_fx)

usage: PYTHONPATH=<builddir>/python /usr/bin/python3 bench/python_observers.py [--quick]
       [--json FILE]
Prints a Markdown table; exit status 0 whatever the verdicts (the table says OK/MISSED).
"""
import argparse
import json
import statistics
import sys
import time
import warnings

import numpy as np
import torch
from torch.ao.quantization import observer as tob

import qcal
import qcal.torch as qt

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def timeit(fn, reps):
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def paired(fa, fb, reps, pairs):
    """Median of per-pair times of fa and fb and of the ratios tb/ta, with the spread."""
    fa(), fb()  # warm up
    ta, tb, r = [], [], []
    for _ in range(pairs):
        a = timeit(fa, reps)
        b = timeit(fb, reps)
        ta.append(a)
        tb.append(b)
        r.append(b / a)
    return statistics.median(ta), statistics.median(tb), statistics.median(r), min(r), max(r)


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(3136, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10)).eval()


def fx_calibrate(act, data):
    from torch.ao.quantization import QConfig, QConfigMapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
    w = (qt if act.__module__ == "qcal.torch" else tob).PerChannelMinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    qmap = QConfigMapping().set_global(QConfig(activation=act.with_args(reduce_range=True),
                                               weight=w))
    m = prepare_fx(cnn(), qmap, example_inputs=(data[0],))
    with torch.no_grad():
        for x in data:
            m(x)
    return convert_fx(m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    pairs = 3 if a.quick else 7
    rows = []
    g = torch.Generator().manual_seed(0)
    x1m = [torch.randn(1 << 20, generator=g) * (1 + i) for i in range(8)]  # growing range

    def obs_row(name, qo, to, xs, reps, target, unit="x"):
        it = {"i": 0}

        def step(o):
            def f():
                o(xs[it["i"] % len(xs)])
                it["i"] += 1
            return f
        tq, tt, med, lo, hi = paired(step(qo), step(to), reps, pairs)
        ok = med >= target
        rows.append(dict(row=name, qcal_us=tq * 1e6, torch_us=tt * 1e6, ratio=med,
                         spread=[lo, hi], target=f">= {target}x", ok=ok))

    obs_row("HistogramObserver call, 1M floats (growing range)", qt.HistogramObserver(),
            tob.HistogramObserver(), x1m, 2, 10.0)
    obs_row("MinMaxObserver call, 1M floats", qt.MinMaxObserver(), tob.MinMaxObserver(),
            x1m, 10, 1.0)
    x64 = [torch.randn(64, generator=g) for _ in range(8)]
    obs_row("MinMaxObserver call, 64 floats", qt.MinMaxObserver(), tob.MinMaxObserver(),
            x64, 2000, 1.0)
    # 64-element calls against the absolute 5 us target
    n64 = [x.numpy() for x in x64]
    o = qcal.Observer("histogram")
    tq = statistics.median(timeit(lambda: o.update(n64[0]), 5000) for _ in range(pairs))
    rows.append(dict(row="qcal.Observer('histogram').update, 64 floats (numpy)",
                     qcal_us=tq * 1e6, torch_us=None, ratio=None, spread=None,
                     target="<= 5 us", ok=tq * 1e6 <= 5.0))
    ho = qt.HistogramObserver()
    th = statistics.median(timeit(lambda: ho(x64[0]), 5000) for _ in range(pairs))
    rows.append(dict(row="qcal.torch.HistogramObserver call, 64 floats (tensor)",
                     qcal_us=th * 1e6, torch_us=None, ratio=None, spread=None,
                     target="<= 5 us", ok=th * 1e6 <= 5.0))
    data = [torch.randn(32, 1, 28, 28, generator=g) for _ in range(20)]
    tq, tt, med, lo, hi = paired(lambda: fx_calibrate(qt.HistogramObserver, data),
                                 lambda: fx_calibrate(tob.HistogramObserver, data), 1,
                                 max(2, pairs // 2))
    rows.append(dict(row="FX PTQ of the demo CNN, histogram observers (20 x 32 images)",
                     qcal_us=tq * 1e6, torch_us=tt * 1e6, ratio=med, spread=[lo, hi],
                     target=">= 3x", ok=med >= 3.0))

    print("| row | qcal | PyTorch | ratio (median of pairs) | spread | target | |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        fmt = (lambda us: "" if us is None else (f"{us / 1000:.2f} ms" if us >= 1000
                                                 else f"{us:.2f} us"))
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        spread = "" if r["spread"] is None else f"{r['spread'][0]:.2f}-{r['spread'][1]:.2f}x"
        print(f"| {r['row']} | {fmt(r['qcal_us'])} | {fmt(r['torch_us'])} | {ratio} | "
              f"{spread} | {r['target']} | {'OK' if r['ok'] else 'MISSED'} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
