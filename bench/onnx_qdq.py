#!/usr/bin/python3
"""ONNX rows: `qcal qdq` and `qcal onnx-expose` on a synthetic 1 GiB model against `cp`.

The model (bench/onnx_model, opset 17): 15 MatMul layers of 64 MiB float32 weights and 7
Conv layers of 9 MiB, 1.0 GiB in all, plus a native table covering every tensor either
profile quantizes; generated once under --dir (default /tmp/qcal-bench-onnx, never
committed). Each pair, interleaved, every command started after `sync` (so none pays for
the previous one's dirty pages) with the model in the page cache:
  cp:          cp MODEL COPY
  qdq ort:     qcal qdq MODEL --table TABLE -o OUT                      (writes 0.25 GiB)
  qdq tensorrt qcal qdq MODEL --table TABLE -o OUT --profile tensorrt  (writes 1.0 GiB)
  onnx-expose: qcal onnx-expose MODEL -o OUT                            (writes 1.0 GiB)
and reports the median wall time, the median of the per-pair ratios to cp (with spread)
and the peak RSS (GNU time %M) against the model's size. qcal's outputs are fsynced before
the rename (atomic output files); cp's are not, so the table also shows cp followed by
`sync` of the copy. A last row: onnx-expose of the same model with its weights in external
data (MODEL.onnx.data), whose peak RSS is the cost of loading external data.
Targets (issue 23): time <= 2x cp, peak RSS <= 2.5x the model's size.

usage: bench/onnx_qdq.py --qcal BUILD/tools/qcal --gen BUILD/bench/onnx_model
                         [--dir DIR] [--pairs N] [--json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

GNU_TIME = "/usr/bin/time"


def run(cmd):
    """Wall time (s), peak RSS (MiB) and CPU time (user + system, s) of one command, after a
    sync. On a loaded machine the wall time follows the CPU time a process needs."""
    subprocess.run(["sync"], check=True)
    fd, rss_file = tempfile.mkstemp()
    os.close(fd)
    t0 = time.perf_counter()
    p = subprocess.run([GNU_TIME, "-f", "%M %U %S", "-o", rss_file] + cmd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {p.stderr.decode(errors='replace').strip()}")
    with open(rss_file) as f:
        kb, user, system = f.read().split()[-3:]
    os.unlink(rss_file)
    return wall, int(kb) / 1024.0, float(user) + float(system)


def warm(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qcal", required=True)
    ap.add_argument("--gen", required=True)
    ap.add_argument("--dir", default="/tmp/qcal-bench-onnx")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    if not os.access(GNU_TIME, os.X_OK):
        print("bench/onnx_qdq.py: GNU time (/usr/bin/time) is needed for the peak RSS", file=sys.stderr)
        return 2
    os.makedirs(a.dir, exist_ok=True)
    model, table = os.path.join(a.dir, "model.onnx"), os.path.join(a.dir, "table.json")
    ext_dir = os.path.join(a.dir, "external")
    ext_model = os.path.join(ext_dir, "model.onnx")
    if not os.path.exists(os.path.join(a.dir, ".complete")):
        subprocess.run([a.gen, model, table], check=True, stdout=subprocess.DEVNULL)
        os.makedirs(ext_dir, exist_ok=True)
        subprocess.run([a.gen, ext_model, os.path.join(ext_dir, "table.json"), "1024", "external"],
                       check=True, stdout=subprocess.DEVNULL)
        open(os.path.join(a.dir, ".complete"), "w").close()
    size_mib = os.path.getsize(model) / 2**20
    cmds = {
        "cp": lambda o: ["cp", model, o],
        "cp + sync": lambda o: ["sh", "-c", 'cp "$0" "$1" && sync "$1"', model, o],
        "qdq ort": lambda o: [a.qcal, "qdq", model, "--table", table, "-o", o],
        "qdq tensorrt": lambda o: [a.qcal, "qdq", model, "--table", table, "-o", o, "--profile", "tensorrt"],
        "onnx-expose": lambda o: [a.qcal, "onnx-expose", model, "-o", o],
    }
    times = {k: [] for k in cmds}
    rss = {k: [] for k in cmds}
    cpu = {k: [] for k in cmds}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        out = os.path.join(tmp, "out.onnx")
        for _ in range(a.pairs):
            for k, c in cmds.items():
                warm(model)
                if os.path.exists(out):
                    os.unlink(out)
                w, r, u = run(c(out))
                times[k].append(w)
                rss[k].append(r)
                cpu[k].append(u)
        warm(os.path.join(ext_dir, "model.onnx.data"))
        ext_w, ext_r, _ = run([a.qcal, "onnx-expose", ext_model, "-o", out])
        load = os.getloadavg()[0]
    rows = []
    for k in ("qdq ort", "qdq tensorrt", "onnx-expose"):
        ratios = [q / c for q, c in zip(times[k], times["cp"])]
        sync_ratios = [q / c for q, c in zip(times[k], times["cp + sync"])]
        row = dict(row=f"{k} of a {size_mib:.0f} MiB ONNX model (opset 17) vs cp",
                   qcal_s=statistics.median(times[k]), ref_s=statistics.median(times["cp"]),
                   cp_sync_s=statistics.median(times["cp + sync"]),
                   ratio=statistics.median(ratios), ratio_spread=[min(ratios), max(ratios)],
                   ratio_vs_cp_sync=statistics.median(sync_ratios),
                   qcal_cpu_s=statistics.median(cpu[k]), cp_cpu_s=statistics.median(cpu["cp"]),
                   load_average=load,
                   qcal_rss_mib=max(rss[k]), model_mib=size_mib,
                   rss_over_model=max(rss[k]) / size_mib, pairs=a.pairs,
                   target="time <= 2x cp, peak RSS <= 2.5x the model")
        row["pass"] = row["ratio"] <= 2.0 and row["rss_over_model"] <= 2.5
        row["detail"] = (f"vs cp + sync {row['ratio_vs_cp_sync']:.2f}x; CPU {row['qcal_cpu_s']:.2f} / "
                         f"{row['cp_cpu_s']:.2f} s; load {load:.1f}")
        rows.append(row)
    ext_row = dict(row=f"onnx-expose, weights in external data ({size_mib:.0f} MiB)",
                   qcal_s=ext_w, qcal_rss_mib=ext_r, model_mib=size_mib,
                   rss_over_model=ext_r / size_mib, pairs=1, target="reported (RSS of loading external data)",
                   detail=f"load {load:.1f}")
    rows.append(ext_row)
    print(f"load average at the end: {load:.1f} ({os.cpu_count()} CPUs)")
    print("| row | qcal | cp | qcal / cp (median of pairs, spread) | cp + sync | CPU time qcal / cp | peak RSS (x model) | target | |")
    print("|---|---|---|---|---|---|---|---|---|")
    for x in rows[:-1]:
        print(f"| {x['row']} | {x['qcal_s']:.2f} s | {x['ref_s']:.2f} s | {x['ratio']:.2f}x "
              f"({x['ratio_spread'][0]:.2f}-{x['ratio_spread'][1]:.2f}) | {x['cp_sync_s']:.2f} s "
              f"({x['ratio_vs_cp_sync']:.2f}x) | {x['qcal_cpu_s']:.2f} / {x['cp_cpu_s']:.2f} s | "
              f"{x['qcal_rss_mib']:.0f} MiB ({x['rss_over_model']:.2f}x) | "
              f"{x['target']} | {'pass' if x['pass'] else 'FAIL'} |")
    print(f"| {ext_row['row']} | {ext_w:.2f} s | | | | | {ext_r:.0f} MiB ({ext_row['rss_over_model']:.2f}x) | "
          f"reported | |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
