"""ort.cnn_qdq: a qcal-calibrated model in an engine nobody here wrote (issue: deployable
models). The demo CNN (C-trained weights, the demo's cache) as ONNX, then for both profiles:

    qcal onnx-expose -> ONNX Runtime runs it on the 1000 calibration images, writes the dump
    -> qcal calibrate (every observer) -> qcal qdq -> onnx.checker
    -> ONNX Runtime runs the QDQ model (graphOptimizationLevel 'all', optimized model saved,
      session.x64quantprecision=1: see below)

and asserts: profile ort: the optimized graph runs every conv and linear layer in an int8
kernel (QLinearConv / QGemm / QLinearMatMul by op type and count, no float Conv / Gemm left);
top-1 on the 10,000 test images within 0.15 points of float and agreement with float >= 99.3%;
ONNX Runtime's int8 and qcal's oneDNN int8 (cnn_deploy int8, same table) within 0.1 points,
their predictions equal on >= 99.8% of the images. Profile tensorrt: within 0.3 points
(ONNX Runtime cannot form int8 node units there: TensorRT's placement has no Q after the op,
so ONNX Runtime runs DQ -> float Conv/Gemm; the op types are printed, not asserted).

ONNX Runtime runs with session.x64quantprecision=1 (its U8U8 kernels): on x86 CPUs without
VNNI, its default U8S8 kernels add pairs of u8 x s8 products in saturating 16-bit lanes, which
on conv1 (input codes up to 255) moves logits by up to 11 codes. The default kernels' top-1
and agreement are printed for the record (equal to the precise ones on VNNI CPUs).

Every step leaves its files in the work directory (printed; kept on failure), so a failure
replays by hand with the same commands. Skips (exit 77, one line) without node, without
onnxruntime-node in $QCAL_NPM_DIR (./run.sh test installs it), without the dataset, or when
qcal was built without ONNX support.

Environment: QCAL_BIN (qcal), QCAL_DEPLOY_BIN (build/examples/cnn_deploy), QCAL_ORT_RUNNER
(tests/ort/ort_run.cjs); QCAL_ORT_WORK keeps the work directory there; QCAL_ORT_OBSERVERS
limits the observers (comma list); QCAL_ORT_TRAIN_IMAGES / QCAL_ORT_EPOCHS train a smaller
model into the cache (quick runs: the bounds are for the demo's model)."""
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

KINDS = ["minmax", "moving_average_minmax", "histogram", "percentile", "entropy", "mse"]
CONV_LINEAR = {"Conv": 2, "Gemm": 2}                 # the demo CNN's layers by op type
INT8_OPS = {"QLinearConv", "QGemm", "QLinearMatMul"}
FLOAT_OPS = {"Conv", "Gemm", "MatMul", "FusedConv", "FusedGemm", "FusedMatMul"}

BIN = os.environ.get("QCAL_BIN", "")
DEPLOY = os.environ.get("QCAL_DEPLOY_BIN", "")
RUNNER = os.environ.get("QCAL_ORT_RUNNER", os.path.join(os.path.dirname(__file__), "ort_run.cjs"))
THREADS = os.environ.get("OMP_NUM_THREADS", "2")


def skip(why):
    print("ort.cnn_qdq: skipped: " + why)
    sys.exit(77)


def npm_dir():
    d = os.environ.get("QCAL_NPM_DIR")
    if d:
        return d
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "qcal", "npm")


def run(*cmd, log=None):
    t0 = time.monotonic()
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("FAILED (exit %d): %s\n%s%s" % (r.returncode, " ".join(map(str, cmd)),
                                                        r.stdout[-3000:], r.stderr[-3000:]))
    if log is not None:
        log.append((" ".join(map(str, cmd)), time.monotonic() - t0))
    return r


def ort(model, x, log, **kw):
    args = ["node", RUNNER, model, x, "--threads", THREADS]
    for k, v in kw.items():
        args += ["--" + k, v]
    return run(*args, log=log)


def top1(logits, labels):
    return 100.0 * float(np.mean(logits.argmax(1) == labels))


def agree(a, b):
    return 100.0 * float(np.mean(a.argmax(1) == b.argmax(1)))


def op_counts(path):
    import onnx
    m = onnx.load(path)
    return collections.Counter(n.op_type for n in m.graph.node)


def main():
    if not BIN or not DEPLOY:
        skip("QCAL_BIN / QCAL_DEPLOY_BIN not set (built without tools or examples)")
    if not shutil.which("node"):
        skip("node not found (apt-get install nodejs npm; ./run.sh test installs them)")
    pkg = os.path.join(npm_dir(), "node_modules", "onnxruntime-node", "package.json")
    if not os.path.exists(pkg):
        skip("onnxruntime-node not installed in %s (./run.sh test installs it from npm)" % npm_dir())
    if subprocess.run([BIN, "onnx-expose", "--help"], capture_output=True).returncode != 0:
        skip("qcal was built without ONNX support (-Donnx; libprotobuf-c-dev, libonnx-dev)")
    data = os.environ.get("QCAL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
    if not os.path.exists(os.path.join(data, "t10k-images-idx3-ubyte.gz")):
        skip("Fashion-MNIST not found in %s (apt-get install dataset-fashion-mnist)" % data)
    import onnx  # Debian's python3-onnx (1.12): the checker

    kinds = [k for k in os.environ.get("QCAL_ORT_OBSERVERS", ",".join(KINDS)).split(",") if k]
    keep = os.environ.get("QCAL_ORT_WORK")
    w = keep or tempfile.mkdtemp(prefix="qcal-ort-")
    os.makedirs(w, exist_ok=True)
    print("work directory: %s (ONNX Runtime %s from %s)" % (
        w, json.load(open(pkg))["version"], npm_dir()))
    log = []
    t_start = time.monotonic()

    # 1. The float model and its data (the demo's cached C-trained weights).
    exp = ["export", w]
    if os.environ.get("QCAL_ORT_TRAIN_IMAGES"):
        exp += ["--train-images", os.environ["QCAL_ORT_TRAIN_IMAGES"]]
    if os.environ.get("QCAL_ORT_EPOCHS"):
        exp += ["--epochs", os.environ["QCAL_ORT_EPOCHS"]]
    print(run(DEPLOY, *exp, log=log).stdout.strip())
    P = lambda *p: os.path.join(w, *p)
    labels = np.load(P("labels.npy")).astype(np.int64)
    onnx.checker.check_model(onnx.load(P("model.onnx")), full_check=True)
    ort(P("model.onnx"), P("test.npy"), log, out=P("ort_float.npy"))
    f_ort, f_qcal = np.load(P("ort_float.npy")), np.load(P("float_logits.npy"))
    float_top1 = top1(f_ort, labels)
    print("float: ONNX Runtime top-1 %.2f%%, qcal f32 %.2f%%, max |logit difference| %.2e, "
          "predictions equal on %.2f%%" % (float_top1, top1(f_qcal, labels),
                                          float(np.abs(f_ort - f_qcal).max()), agree(f_ort, f_qcal)))
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)
        return "OK" if ok else "MISSED"

    check(agree(f_ort, f_qcal) >= 99.95, "ONNX Runtime's float model differs from qcal's f32 forward")
    rules = P("rules.txt")
    with open(rules, "w") as f:
        # the model input quantized with minmax in every row, as the demo does (docs/demo.md,
        # "The model input"); the observer under test calibrates every other tensor
        f.write("input activation minmax\n")

    rows = []
    for profile in ["ort", "tensorrt"]:
        exposed, lst, dump = P("exposed_%s.onnx" % profile), P("list_%s.txt" % profile), P("dump_%s" % profile)
        run(BIN, "onnx-expose", P("model.onnx"), "-o", exposed, "--profile", profile, "--list", lst, log=log)
        names = open(lst, encoding="utf-8").read().splitlines()
        outs = [o.name for o in onnx.load(exposed).graph.output]
        check(set(names) <= set(outs) and "logits" in outs, "%s: --list names not all outputs" % profile)
        # the demo's calibration batches: 10 x 100 images
        ort(exposed, P("calib.npy"), log, dump=dump, batch="100")
        print("profile %s: %d tensors exposed: %s" % (profile, len(names), ", ".join(names)))
        for kind in kinds:
            tag = "%s_%s" % (profile, kind)
            table, qdq, opt = P("table_%s.json" % tag), P("qdq_%s.onnx" % tag), P("opt_%s.onnx" % tag)
            run(BIN, "calibrate", dump, "-o", table, "--rules", rules, "--observer", kind, log=log)
            run(BIN, "qdq", P("model.onnx"), "--table", table, "-o", qdq, "--profile", profile, log=log)
            onnx.checker.check_model(onnx.load(qdq), full_check=True)
            t0 = time.monotonic()
            ort(qdq, P("test.npy"), log, out=P("ort_%s.npy" % tag), optimized=opt, level="all",
                precision="high")
            ort_s = time.monotonic() - t0
            z = np.load(P("ort_%s.npy" % tag))
            ops = op_counts(opt)
            n_int8 = sum(ops[o] for o in INT8_OPS)
            n_float = sum(ops[o] for o in FLOAT_OPS)
            r = {"profile": profile, "observer": kind, "top1": top1(z, labels),
                 "delta": top1(z, labels) - float_top1, "agree": agree(z, f_ort),
                 "int8_ops": {o: ops[o] for o in sorted(INT8_OPS) if ops[o]},
                 "float_ops": {o: ops[o] for o in sorted(FLOAT_OPS) if ops[o]}, "ort_s": ort_s}
            if profile == "ort":
                want = sum(CONV_LINEAR.values())
                r["fused"] = check(ops["QLinearConv"] == CONV_LINEAR["Conv"] and
                                   ops["QGemm"] + ops["QLinearMatMul"] == CONV_LINEAR["Gemm"] and
                                   n_int8 == want and n_float == 0,
                                   "%s: optimized graph ops %s" % (tag, dict(ops)))
                r["acc"] = check(r["delta"] >= -0.15 and r["agree"] >= 99.3,
                                 "%s: top-1 %.2f (%+.2f), agreement %.2f" % (tag, r["top1"], r["delta"], r["agree"]))
                # ONNX Runtime's default x86 kernels, for the record: on CPUs without VNNI
                # their u8 x s8 pair sums saturate at 16 bits (docs/onnx.md)
                ort(qdq, P("test.npy"), log, out=P("ortdef_%s.npy" % tag), level="all")
                zdef = np.load(P("ortdef_%s.npy" % tag))
                r["default_precision_top1"] = top1(zdef, labels)
                r["default_precision_agree"] = agree(zdef, z)
                dn = P("onednn_%s.npy" % kind)
                run(DEPLOY, "int8", w, "--table", table, "--out", dn, log=log)
                zd = np.load(dn)
                r["onednn_top1"] = top1(zd, labels)
                r["ort_vs_onednn"] = agree(z, zd)
                r["engines"] = check(abs(r["top1"] - r["onednn_top1"]) <= 0.1 and r["ort_vs_onednn"] >= 99.8,
                                     "%s: ONNX Runtime %.2f vs oneDNN %.2f, agreement %.2f" % (
                                         tag, r["top1"], r["onednn_top1"], r["ort_vs_onednn"]))
            else:
                r["acc"] = check(r["delta"] >= -0.3,
                                 "%s: top-1 %.2f (%+.2f)" % (tag, r["top1"], r["delta"]))
            rows.append(r)
            print("  %-8s %-22s top-1 %.2f%% (%+.2f) agree %.2f%% | int8 ops %s float ops %s%s | "
                  "ONNX Runtime %.1f s" % (
                      profile, kind, r["top1"], r["delta"], r["agree"], r["int8_ops"], r["float_ops"],
                      " | oneDNN %.2f%%, same prediction %.2f%% | default kernels %.2f%% (%.2f%% same)" % (
                          r["onednn_top1"], r["ort_vs_onednn"], r["default_precision_top1"],
                          r["default_precision_agree"]) if "onednn_top1" in r else "", ort_s), flush=True)

    summary = {"float_top1": float_top1, "qcal_float_top1": top1(f_qcal, labels),
               "test_images": int(labels.shape[0]), "rows": rows,
               "total_s": time.monotonic() - t_start}
    with open(P("summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    slow = sorted(log, key=lambda c: -c[1])[:3]
    print("whole test %.1f s; slowest steps: %s" % (summary["total_s"], "; ".join(
        "%.1f s %s" % (s, c[:90]) for c, s in slow)))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures) + "\n(files kept in %s)" % w)
        return 1
    print("all targets met (%d rows); summary %s" % (len(rows), P("summary.json")))
    if not keep:
        shutil.rmtree(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
