#!/usr/bin/python3
"""bench/torch_loggers.py: what qcal.torch.add_activation_loggers' statistics cost a forward.

The tiny Llama of tests/data/llama (3 layers, 21 decoder linears logged) on one batch of
8 x 64 tokens, torch on one thread: the plain forward and the forward with every decoder
linear's input logged to a statistics CSV (qcal's numeric logger: count, min, max, absmax,
mean, std per call) are timed in interleaved pairs (order alternating), after a warm-up.
One JSON row: qcal_s = logged forward, ref_s = plain forward (medians), overhead =
median of the paired logged/plain ratios - 1, spread of those ratios.

usage: PYTHONPATH=build/python bench/torch_loggers.py [--pairs N] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "python"))
import tinyllama as T  # noqa: E402

import qcal.torch as qt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    model = T.load_model(os.path.join(here, "..", "tests", "data", "llama",
                                      "tinyllama.safetensors"))
    x, _ = T.windows(T.text_bytes(T.CALIB_FILES), T.CONFIG["ctx"])
    x = x[:8]
    with tempfile.TemporaryDirectory() as tmp:
        def plain():
            t = time.perf_counter()
            with torch.no_grad():
                y = model(x)
            return time.perf_counter() - t, y

        def logged():
            h = qt.add_activation_loggers(model, names=["model.layers.*"],
                                          stats_csv=os.path.join(tmp, "act.csv"))
            try:
                t = time.perf_counter()
                with torch.no_grad():
                    y = model(x)
                return time.perf_counter() - t, y
            finally:
                h.remove()

        # verify: logging changes nothing
        assert torch.equal(plain()[1], logged()[1])
        for _ in range(3):
            plain()
            logged()
        tp, tl, ratios = [], [], []
        for i in range(a.pairs):
            if i % 2:
                p, l_ = plain()[0], logged()[0]
            else:
                l_, p = logged()[0], plain()[0]
            tp.append(p)
            tl.append(l_)
            ratios.append(l_ / p)
    row = dict(name="torch_loggers_stats",
               label="qcal.torch activation loggers (stats CSV) on the tiny Llama forward, "
                     "21 linears, 8x64 tokens",
               qcal_s=statistics.median(tl), ref_s=statistics.median(tp),
               overhead=statistics.median(ratios) - 1,
               spread=[min(ratios) - 1, max(ratios) - 1], pairs=a.pairs, threads=1,
               records_per_forward=21)
    print(json.dumps(row))
    print("forward %.3f ms, with stats loggers %.3f ms: overhead %+.1f%% (paired ratios %+.1f%% "
          "to %+.1f%%, %d pairs)" % (row["ref_s"] * 1e3, row["qcal_s"] * 1e3,
                                     100 * row["overhead"], 100 * row["spread"][0],
                                     100 * row["spread"][1], a.pairs), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump([row], f)


if __name__ == "__main__":
    main()
