"""ort.model_auto: `--observer auto` (each tensor's observer chosen by the exact SQNR of every
commuting candidate, the model run twice; docs/evaluate.md; then that choice and each kind on
every tensor judged at the model's outputs; docs/accuracy.md) on the committed MobileNet-style
network (examples/mobilenet/mobilenet.onnx) and Fashion-MNIST test images
(examples/data/fmnist_test_batch.npy: 64 to calibrate, the other 192 to evaluate).

  - the dump route: `qcal onnx-expose` -> onnxruntime-node (tests/ort/ort_run.cjs, optimizations
    disabled, batches of 16) -> `qcal evaluate DUMP --observers minmax,percentile,histogram,
    mse,entropy --rules-out R` -> `qcal calibrate DUMP --rules R`; the model route `qcal
    calibrate MODEL --data x.npy --batch 16 --observer auto --auto-samples 0` (the per-tensor
    choice alone): the two tables byte-identical;
  - the choice at the outputs (default: 64 samples): the candidate and each one's output SQNR
    as measured; --batch 1, 7 and the automatic batch, and one engine thread: the same table
    but for the entries' batch counts;
  - `qcal qdq MODEL --data` (auto, its default) writes the table of `calibrate --observer
    auto` (--table-out) and the summary names the choices; the Python `qcal.onnx.calibrate(
    observer="auto")` on a list of runs gives that table too;
  - accuracy in ONNX Runtime (graph optimization 'all', its int8 kernels) on the 192 held-out
    images: the int8 logits' SQNR against float's and the top-1 agreement, auto and histogram,
    asserted against the figures measured (comments);
  - usage errors: auto with --rules, with another observer option, with a dump directory.
Skips (exit 77, one line) without node / onnxruntime-node or numpy.

Environment: QCAL_BIN (qcal), PYTHONPATH with the qcal Python package (optional: the Python
check is skipped without it); QCAL_MA_WORK keeps the work directory."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from test_model_calib import MODEL, BATCH, RUNNER, chain_table, check, fails, qcal_run, run  # noqa: E402

N = 64
KINDS = "minmax,percentile,histogram,mse,entropy"
# Measured (Intel Xeon, AVX-512 VNNI, 2 cores; onnxruntime-node 1.30.0), 192 held-out images:
#   auto:      logits SQNR 28.49 dB, top-1 agreement 192/192 (minmax on every tensor)
#   histogram: logits SQNR 27.25 dB, top-1 agreement 190/192
# (the per-tensor choice alone, --auto-samples 0: 27.25 dB, 190/192)
# per-tensor choices: mse 32, percentile 2, entropy 1 (35 tensors; with the two-ended searches
# of asymmetric targets, observers/mse.c, percentile.c and entropy.c); at the outputs
# on the 64 calibration images (argmax agreement with float, output SQNR): per-tensor 62, 30.45
# dB; minmax 62, 33.65; histogram 61, 31.83; percentile 61, 33.90; entropy 61, 33.68; mse 60,
# 30.41: minmax on every tensor
MIN_AUTO_SQNR = 28.2
MIN_AUTO_AGREE = 191
CHOSEN = {"mse": 32, "percentile": 2, "entropy": 1}
AT_OUTPUTS = ("observer auto at the outputs (64 samples, one per run; samples whose argmax "
              "agrees with float's everywhere, then output SQNR): per-tensor 62/64 30.45 dB, "
              "minmax 62/64 33.65 dB, histogram 61/64 31.83 dB, percentile 61/64 33.90 dB, "
              "entropy 61/64 33.68 dB, mse 60/64 30.41 dB; chose minmax")
CHOSEN_AUTO = {"minmax": 35}


def qcal_run_env(env, qcal, *args):
    """qcal_run with the environment changed by env (None: as is) for that run only."""
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        return qcal_run(qcal, *args)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def observers(path):
    got = {}
    for e in json.load(open(path))["entries"]:
        got[e["observer"]] = got.get(e["observer"], 0) + 1
    return got


def strip_batches(path):
    t = json.load(open(path))
    t.pop("digest", None)   # the digest covers the batch counts' state
    for e in t["entries"]:
        e.pop("batches", None)
    return t


def logits(model, x, out):
    r = run(["node", RUNNER, model, x, "--out", out, "--batch", "64"])
    assert r.returncode == 0, r.stdout + r.stderr
    import numpy as np
    return np.load(out).astype(np.float64)


def main():
    qcal = os.environ.get("QCAL_BIN", os.path.join(ROOT, "build", "tools", "qcal"))
    try:
        import numpy as np
    except ImportError as e:
        print("ort.model_auto: skipped: %s" % e)
        return 77
    if not shutil.which("node"):
        print("ort.model_auto: skipped: node not found")
        return 77
    w = os.environ.get("QCAL_MA_WORK") or tempfile.mkdtemp(prefix="qcal-ma-test-")
    os.makedirs(w, exist_ok=True)
    allx = np.load(BATCH).astype(np.float32)
    x = os.path.join(w, "x.npy")
    np.save(x, allx[:N])
    held = os.path.join(w, "held.npy")
    np.save(held, allx[N:])
    r = qcal_run(qcal, "calibrate", MODEL, "--data", x, "-o", os.path.join(w, "t.json"), "-q")
    if r.returncode == 5:
        print("ort.model_auto: skipped: " + r.stderr.strip())
        return 77

    # The model route (the per-tensor choice alone) against the dump route through qcal
    # evaluate's rules file.
    per_tensor = os.path.join(w, "auto_pt.json")
    r = qcal_run(qcal, "calibrate", MODEL, "--data", x, "--batch", "16", "-o", per_tensor,
                 "--observer", "auto", "--auto-samples", "0", "-q")
    n_t = sum(CHOSEN.values())
    check(r.returncode == 0 and "(8 runs, 1 file); observer auto (the model run twice): mse 32, "
          "percentile 2, entropy 1;" in r.stdout,
          "calibrate --observer auto: exit 0, both passes' runs and the choices (%s)" % r.stdout.strip())
    dump_tab, n = chain_table(qcal, w, x, "ort", "histogram", "auto")
    check(n == n_t, "%d tensors exposed (want %d)" % (n, n_t))
    dump = os.path.join(w, "dump_auto")
    rules = os.path.join(w, "rules.txt")
    r = qcal_run(qcal, "evaluate", dump, "--observers", KINDS, "--rules-out", rules,
                 "-o", os.path.join(w, "eval.txt"))
    check(r.returncode == 0, "evaluate DUMP --rules-out: exit 0")
    chain = os.path.join(w, "chain_rules.json")
    r = qcal_run(qcal, "calibrate", dump, "--rules", rules, "--profile", "ort", "-o", chain, "-q")
    check(r.returncode == 0 and open(chain, "rb").read() == open(per_tensor, "rb").read(),
          "--observer auto --auto-samples 0: the table of evaluate's rules file on the dump "
          "route, byte for byte")
    check(observers(per_tensor) == CHOSEN, "per-tensor entries' observers %s (want %s)"
          % (observers(per_tensor), CHOSEN))

    # The choice at the outputs (the default).
    mine = os.path.join(w, "auto.json")
    r = qcal_run(qcal, "calibrate", MODEL, "--data", x, "--batch", "16", "-o", mine,
                 "--observer", "auto", "-q")
    check(r.returncode == 0 and "qcal: calibrate: " + AT_OUTPUTS in r.stdout
          and observers(mine) == CHOSEN_AUTO,
          "calibrate --observer auto: the candidates at the outputs and the one chosen (%s)"
          % r.stdout.strip())

    # The grouping of samples into runs, and the engine's threads, change nothing but the
    # batch counts.
    ref = strip_batches(mine)
    for b, env in (("1", None), ("7", None), (None, None), ("16", {"OMP_NUM_THREADS": "1"})):
        out = os.path.join(w, "auto_b%s_%s.json" % (b, "t1" if env else "t"))
        r = qcal_run_env(env, qcal, "calibrate", MODEL, "--data", x, "-o", out, "--observer",
                         "auto", "-q", *(["--batch", b] if b else []))
        check(r.returncode == 0 and strip_batches(out) == ref and AT_OUTPUTS in r.stdout,
              "--observer auto --batch %s%s: the --batch 16 table but for batch counts"
              % (b or "auto", ", 1 thread" if env else ""))

    # qdq --data: auto by default; its table is calibrate's.
    q_auto, q_hist = os.path.join(w, "auto.onnx"), os.path.join(w, "hist.onnx")
    tout = os.path.join(w, "tout.json")
    r = qcal_run(qcal, "qdq", MODEL, "--data", x, "--batch", "16", "-o", q_auto, "--table-out", tout, "-q")
    check(r.returncode == 0 and "observer auto (the model run twice): minmax 35" in r.stdout
          and "qcal: qdq: " + AT_OUTPUTS in r.stdout
          and open(tout, "rb").read() == open(mine, "rb").read(),
          "qdq --data: auto by default, the table of calibrate --observer auto (%s)" % r.stdout.strip())
    r = qcal_run(qcal, "qdq", MODEL, "--data", x, "--batch", "16", "-o", q_hist, "--observer", "histogram", "-q")
    check(r.returncode == 0 and "observer auto" not in r.stdout, "qdq --observer histogram: exit 0, no choice")

    # Accuracy in ONNX Runtime on the held-out images.
    f = logits(MODEL, held, os.path.join(w, "f.npy"))
    sq = {}
    for tag, model, min_sqnr, min_agree in (("auto", q_auto, MIN_AUTO_SQNR, MIN_AUTO_AGREE),
                                            ("histogram", q_hist, None, None)):
        q = logits(model, held, os.path.join(w, "q_%s.npy" % tag))
        sqnr = 10 * np.log10((f ** 2).sum() / ((f - q) ** 2).sum())
        agree = int((f.argmax(1) == q.argmax(1)).sum())
        sq[tag] = sqnr
        print("%s: int8 logits SQNR %.2f dB against float, top-1 agreement %d/%d" % (tag, sqnr, agree, len(f)))
        if min_sqnr is not None:
            check(sqnr >= min_sqnr and agree >= min_agree,
                  "%s in ONNX Runtime: SQNR %.2f >= %.1f dB, agreement %d >= %d" % (tag, sqnr, min_sqnr, agree, min_agree))

    check(sq["auto"] >= sq["histogram"] - 0.1, "auto's logits SQNR %.2f dB not below histogram's %.2f"
          % (sq["auto"], sq["histogram"]))

    # Python: observer="auto" on a list of runs (run twice) is the CLI's table.
    try:
        import qcal.onnx as qo
    except ImportError as e:
        print("skip the Python check: %s" % e)
        qo = None
    if qo:
        t = qo.calibrate(MODEL, [{"input": allx[i:i + 16]} for i in range(0, N, 16)], observer="auto")
        py = os.path.join(w, "py.json")
        t.write(py)
        check(open(py, "rb").read() == open(mine, "rb").read(),
              "qcal.onnx.calibrate(observer='auto') on a list: the CLI's table")
        rep = qo.qdq(MODEL, os.path.join(w, "py.onnx"),
                     data=[{"input": allx[i:i + 16]} for i in range(0, N, 16)])
        check(rep["auto_samples"] == 64 and rep["auto_choice"] == "minmax"
              and rep["auto_agree"]["minmax"] == 62 and rep["auto_agree"]["per-tensor"] == 62
              and "%.2f" % rep["auto_sqnr_db"]["minmax"] == "33.65"
              and "%.2f" % rep["auto_sqnr_db"]["per-tensor"] == "30.45",
              "qcal.onnx.qdq(data=...): the choice at the outputs in the report (%s, %s, %s)"
              % (rep["auto_samples"], rep["auto_choice"], rep["auto_sqnr_db"]))
        try:
            qo.calibrate(MODEL, iter([{"input": allx[:16]}]), observer="auto")
            check(False, "auto on a one-shot iterator: TypeError")
        except TypeError as e:
            check("twice" in str(e), "auto on a one-shot iterator: TypeError (%s)" % e)

    # Usage errors: exit 2, one line.
    for args, word in ((["--rules", rules], "--rules"), (["--bins", "512"], "--bins")):
        r = qcal_run(qcal, "calibrate", MODEL, "--data", x, "-o", os.path.join(w, "u.json"),
                     "--observer", "auto", *args)
        check(r.returncode == 2 and word in r.stderr and r.stderr.count("\n") == 1,
              "--observer auto with %s: exit 2 (%s)" % (word, r.stderr.strip()))
    r = qcal_run(qcal, "calibrate", dump, "-o", os.path.join(w, "u.json"), "--observer", "auto")
    check(r.returncode == 2 and "evaluate" in r.stderr, "--observer auto with a dump: exit 2 (%s)" % r.stderr.strip())

    if fails:
        print("FAILED:\n  " + "\n  ".join(fails) + "\n(files kept in %s)" % w)
        return 1
    if not os.environ.get("QCAL_MA_WORK"):
        shutil.rmtree(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
