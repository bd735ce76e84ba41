#!/usr/bin/python3
"""TorchScript call overhead of qcal.torch observers against torch.ao's (docs/python.md).

A scripted qcal.torch observer runs its update through the ``qcal::observe`` custom op (a
Python kernel registered with torch.library): the interpreter calls into Python, the op
updates the qcal observer and rewrites the ``qcal_state`` bytes and ``min_val`` /
``max_val``. This measures what that costs per call, beside the same observer called
eagerly and torch.ao's observer eager and scripted.

Rows, each a module call on one tensor of N float32 values (N = 64 and 1M):
  <class>/<N>  for MinMaxObserver, PerChannelMinMaxObserver (a [N/64, 64] tensor, axis 0)
               and HistogramObserver: qcal eager, qcal scripted, torch.ao eager, torch.ao
               scripted; median seconds per call over --repeats rounds of --calls calls
               (the four interleaved in each round), plus qcal's scripted - eager
               difference (the op's overhead).

Output: one JSON object per row on stdout (name, qcal_eager_s, qcal_script_s, torch_eager_s,
torch_script_s, overhead_s, threads), then a Markdown table on stderr.

usage: PYTHONPATH=<builddir>/python /usr/bin/python3 bench/torchscript.py [--calls N]
       [--repeats N] [--threads N]
"""
import argparse
import json
import statistics
import sys
import time
import warnings

import torch
from torch.ao.quantization import observer as tob

import qcal
import qcal.torch as qt

warnings.filterwarnings("ignore")


def per_call(fn, x, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - t0) / calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    qcal.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    rows = []
    for cls in ("MinMaxObserver", "PerChannelMinMaxObserver", "HistogramObserver"):
        for n in (64, 1 << 20):
            x = torch.randn(n // 64, 64, generator=g)
            calls = args.calls if n == 64 else max(args.calls // 20, 3)
            q_eager, t_eager = getattr(qt, cls)(), getattr(tob, cls)()
            q_script = torch.jit.script(getattr(qt, cls)())
            t_script = torch.jit.script(getattr(tob, cls)())
            sides = [q_eager, q_script, t_eager, t_script]
            for m in sides:          # warm-up, and a check that both scripted ones run
                m(x)
            times = [[] for _ in sides]
            for r in range(args.repeats):
                order = range(4) if r % 2 == 0 else reversed(range(4))
                for i in order:
                    times[i].append(per_call(sides[i], x, calls))
            med = [statistics.median(t) for t in times]
            row = dict(name=f"{cls}/{n}", qcal_eager_s=med[0], qcal_script_s=med[1],
                       torch_eager_s=med[2], torch_script_s=med[3],
                       overhead_s=med[1] - med[0], threads=args.threads)
            rows.append(row)
            print(json.dumps(row), flush=True)
    us = lambda s: f"{s * 1e6:.1f} us"
    print("| row | qcal eager | qcal scripted | scripted - eager | torch.ao eager | "
          "torch.ao scripted |", file=sys.stderr)
    print("|---|---|---|---|---|---|", file=sys.stderr)
    for r in rows:
        print(f"| {r['name']} | {us(r['qcal_eager_s'])} | {us(r['qcal_script_s'])} | "
              f"{us(r['overhead_s'])} | {us(r['torch_eager_s'])} | {us(r['torch_script_s'])} |",
              file=sys.stderr)


if __name__ == "__main__":
    main()
