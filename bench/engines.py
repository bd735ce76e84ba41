#!/usr/bin/python3
"""bench/engines.py: two engines, one table. ONNX Runtime's int8 QDQ model of the demo CNN
against qcal's oneDNN int8 network (bench/int8_cnn.c) on the same 10,000 images, 1 and 2
threads.

Preparation (once, in --work, default /tmp/qcal-bench-engines; reused while complete), the
flow of tests/ort/test_cnn_qdq.py:
  cnn_deploy export W     the demo CNN (its cached C-trained weights) as model.onnx +
                          model.safetensors, the 1000 calibration and 10,000 test images
  qcal onnx-expose        --profile ort; ONNX Runtime dumps the exposed tensors on the
                          calibration images (tests/ort/ort_run.cjs, batches of 100)
  qcal calibrate          --observer histogram, the model input with minmax (as the demo)
  qcal qdq                --profile ort: the QDQ model ONNX Runtime runs
Then, for each thread count, bench_int8_cnn --deploy W --table T --ort CMD: qcal's int8 net
built from the same table and weights, and ONNX Runtime (bench/ort_serve.cjs, graph
optimizations 'all', intraOpNumThreads = the thread count) on the same test images; both
outputs verified (top-1 against the labels within 0.5 points, the same prediction on >= 99.8%
of the images) before they are timed in interleaved pairs. Target: qcal >= 1.0x ONNX Runtime.
The row's ONNX Runtime computes what qcal computes: session.x64quantprecision=1, its exact
U8U8 kernels, as every ONNX Runtime test and table of this project runs it on CPUs without
VNNI (its default U8S8 kernels let u8 x s8 pair sums saturate there, docs/onnx.md).
Beside it, in the same pairs: ONNX Runtime's default kernels, and, when oneDNN has no VNNI,
qcal's net without its exact weight split (the two saturating configurations compared with
each other); --ort-precision default judges the row against the default kernels instead.

Without node, onnxruntime-node ($QCAL_NPM_DIR, ./run.sh installs it), the dataset, the
examples (cnn_deploy) or ONNX support: one line, an empty row list, exit 0.

usage: bench/engines.py --build BUILD [--work DIR] [--pairs N] [--threads 1,2] [--json FILE]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import bench_util
from bench_util import npm_dir

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*cmd, env=None):
    return bench_util.run("bench/engines.py", *cmd, env=env)


def skip(why, json_path):
    print("bench/run: engines: skipped: " + why)
    if json_path:
        with open(json_path, "w") as f:
            f.write("[]\n")
    return 0


def prepare(w, qcal, deploy):
    """The QDQ model and its table in w (the steps are skipped when their output exists)."""
    P = lambda *p: os.path.join(w, *p)
    runner = os.path.join(SRC, "tests", "ort", "ort_run.cjs")
    os.makedirs(w, exist_ok=True)
    if not os.path.exists(P(".exported")):
        run(deploy, "export", w)
        open(P(".exported"), "w").close()
    if not os.path.exists(P("qdq.onnx")):
        run(qcal, "onnx-expose", P("model.onnx"), "-o", P("exposed.onnx"), "--profile", "ort",
            "--list", P("list.txt"))
        if os.path.isdir(P("dump")):
            shutil.rmtree(P("dump"))
        run("node", runner, P("exposed.onnx"), P("calib.npy"), "--dump", P("dump"), "--batch", "100")
        with open(P("rules.txt"), "w") as f:
            f.write("input activation minmax\n")
        run(qcal, "calibrate", P("dump"), "-o", P("table.json"), "--rules", P("rules.txt"),
            "--observer", "histogram")
        run(qcal, "qdq", P("model.onnx"), "--table", P("table.json"), "-o", P("qdq.tmp.onnx"),
            "--profile", "ort")
        os.replace(P("qdq.tmp.onnx"), P("qdq.onnx"))
    return P("qdq.onnx"), P("table.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", default="/tmp/qcal-bench-engines")
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batch", default="10000",
                    help="ONNX Runtime's batch (images per run; default all, as qcal's forward)")
    ap.add_argument("--ort-precision", choices=["high", "default"], default="high",
                    help="ONNX Runtime's int8 kernels the row is judged against: high "
                         "(session.x64quantprecision=1, exact, as the ort tests run it) or "
                         "default; the other is timed beside it")
    ap.add_argument("--json")
    a = ap.parse_args()
    qcal = os.path.join(a.build, "tools", "qcal")
    deploy = os.path.join(a.build, "examples", "cnn_deploy")
    bench = os.path.join(a.build, "bench", "bench_int8_cnn")
    pkg = os.path.join(npm_dir(), "node_modules", "onnxruntime-node", "package.json")
    if not shutil.which("node"):
        return skip("node not found (./run.sh installs nodejs and ONNX Runtime)", a.json)
    if not os.path.exists(pkg):
        return skip("onnxruntime-node not in %s (./run.sh test installs it from npm)" % npm_dir(), a.json)
    for exe in (qcal, deploy, bench):
        if not os.access(exe, os.X_OK):
            return skip("%s not built (examples and tools needed)" % exe, a.json)
    if subprocess.run([qcal, "onnx-expose", "--help"], capture_output=True).returncode != 0:
        return skip("qcal built without ONNX support", a.json)
    data = os.environ.get("QCAL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
    if not os.path.exists(os.path.join(data, "t10k-images-idx3-ubyte.gz")):
        return skip("Fashion-MNIST not found in %s" % data, a.json)
    qdq, table = prepare(a.work, qcal, deploy)
    rows = []
    for t in [int(x) for x in a.threads.split(",") if x]:
        out = os.path.join(a.work, "row_%d.json" % t)
        if os.path.exists(out):
            os.unlink(out)
        ort = "node %s %s %s --threads %d --batch %s --precision " % (
            os.path.join(SRC, "bench", "ort_serve.cjs"), qdq, os.path.join(a.work, "test.npy"), t,
            a.batch)
        other = "default" if a.ort_precision == "high" else "high"
        env = dict(os.environ, OMP_NUM_THREADS=str(t))
        r = subprocess.run([bench, "--deploy", a.work, "--table", table,
                            "--ort", ort + a.ort_precision, "--ort-other", ort + other,
                            "--pairs", str(a.pairs), "--json", out], env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        sys.stdout.write(r.stdout)
        if r.returncode != 0 or not os.path.exists(out):
            print("bench/engines.py: bench_int8_cnn --deploy failed at %d thread(s) (exit %d)" %
                  (t, r.returncode), file=sys.stderr)
            return 1
        with open(out) as f:
            rows += json.load(f)
    if a.json:
        with open(a.json + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(a.json + ".tmp", a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
