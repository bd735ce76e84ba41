#!/usr/bin/python3
"""The MobileNet-style network's int8 table (docs/models.md), in the shape of Krishnamoorthi
(2018), Table 3: float; weights per-tensor asymmetric; per-channel symmetric; per-channel
asymmetric; activations only; then every activation observer with per-channel symmetric
weights; then the cures (cross-layer equalization, bias correction) with per-tensor weights.

Each row is measured twice on the same QDQ model (`qcal qdq`):
  - ONNX Runtime (tests/ort/ort_run.cjs, graph optimizations 'all', its int8 kernels,
    session.x64quantprecision=1 as the ort tests use it);
  - qcal's fake-quant: the QDQ model interpreted in PyTorch (float32 Conv / Gemm), every
    QuantizeLinear -> DequantizeLinear pair computed by qcal.fake_quant, every weight and
    bias by its DequantizeLinear.

Flow: BatchNorm folded into the convolutions on the ONNX graph by qcal (`qcal equalize
--no-equalize`) -> `qcal onnx-expose` -> ONNX Runtime dumps the exposed tensors on 1000
training images (seeded choice) -> `qcal calibrate --observer KIND` -> `qcal qdq
[--weight-qscheme Q | --float-weights]` -> both evaluations on the test images. The cures:
`qcal equalize` (CLE, ReLU6 -> ReLU) and `qcal equalize --bias-correction DUMP
--weight-qscheme per_tensor_affine` (DUMP: the BN-folded model's dump above), each
exposed, dumped and calibrated again.

    PYTHONPATH=build/python /usr/bin/python3 examples/mobilenet/table.py \
        --qcal build/tools/qcal [--work DIR] [--images N] [--rows LIST] [--json OUT]

--rows: comma list of row keys (default all; see ROWS); --demo: DEMO_ROWS. --no-fakequant
leaves qcal's column out. Without node / onnxruntime-node (which make the calibration
dumps), torch, onnx or the dataset: one line and exit 77.
    /usr/bin/python3 examples/mobilenet/table.py --markdown SUMMARY.json   # docs' tables"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
KINDS = ["minmax", "moving_average_minmax", "histogram", "percentile", "entropy", "mse"]
# key: (label, activation observer, qdq weight options, model: folded / cle / cle_bc)
ROWS = [
    ("float", ("float", None, None, "folded")),
    ("w_pt_asym", ("weights per-tensor asymmetric", "minmax", ["--weight-qscheme", "per_tensor_affine"], "folded")),
    ("w_pc_sym", ("weights per-channel symmetric", "minmax", [], "folded")),
    ("w_pc_asym", ("weights per-channel asymmetric", "minmax", ["--weight-qscheme", "per_channel_affine"], "folded")),
    ("act_only", ("activations only (float weights)", "minmax", ["--float-weights"], "folded")),
] + [("obs_" + k, ("per-channel symmetric, activations " + k, k, [], "folded")) for k in KINDS[1:]] + [
    ("cle_float", ("float, equalized (ReLU6 -> ReLU)", None, None, "cle")),
    ("cle_pt", ("per-tensor asymmetric + CLE", "minmax", ["--weight-qscheme", "per_tensor_affine"], "cle")),
    ("cle_bc_pt", ("per-tensor asymmetric + CLE + bias correction", "minmax",
                   ["--weight-qscheme", "per_tensor_affine"], "cle_bc")),
]

DEMO_ROWS = ["float", "w_pt_asym", "w_pc_sym", "w_pc_asym", "act_only", "cle_float", "cle_pt", "cle_bc_pt"]


def log(*a):
    print(*a, flush=True)


def run(*cmd, ok=(0,)):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode not in ok:
        raise SystemExit("FAILED (exit %d): %s\n%s%s" % (r.returncode, " ".join(map(str, cmd)),
                                                        r.stdout[-3000:], r.stderr[-3000:]))
    return r


def npm_dir():
    d = os.environ.get("QCAL_NPM_DIR")
    if d:
        return d
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache")
    return os.path.join(cache, "qcal", "npm")


# ---- qcal's fake-quant: the QDQ model interpreted in PyTorch ----

def _attrs(node):
    import onnx
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def interpret(model_path, x, batch=500):
    """Runs the ONNX model at model_path on x (N, 1, 28, 28) float32 in PyTorch: Conv, Gemm,
    Clip, Relu, Add, GlobalAveragePool, Flatten, Reshape as float32; Q -> DQ pairs as
    qcal.fake_quant (quant_min/max from the zero-point type), DequantizeLinear of an
    initializer as (q - zero_point) * scale. Returns the first output (N, ...)."""
    import onnx
    import torch
    import torch.nn.functional as F
    from onnx import numpy_helper
    import qcal
    m = onnx.load(model_path)
    g = m.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    nodes = list(g.node)
    out_name = g.output[0].name
    outs = []
    for i0 in range(0, len(x), batch):
        env = {g.input[0].name: torch.from_numpy(np.ascontiguousarray(x[i0:i0 + batch]))}

        def val(name):
            if name in env:
                return env[name]
            if name in inits:
                return inits[name]
            raise KeyError(name)

        for n in nodes:
            a = _attrs(n)
            op = n.op_type
            if op == "QuantizeLinear":
                # kept as (x, scale, zero-point array) for the DequantizeLinear that follows
                env[n.output[0]] = ("Q", val(n.input[0]), inits[n.input[1]], inits[n.input[2]], a.get("axis", 1))
                continue
            if op == "DequantizeLinear":
                src = env.get(n.input[0])
                s, z = inits[n.input[1]], inits[n.input[2]]
                if isinstance(src, tuple):
                    _, xv, qs, qz = src[:4]
                    if not (np.array_equal(qs, s) and np.array_equal(qz, z)):
                        raise SystemExit("interpret: Q and DQ of %s differ" % n.input[0])
                    info = np.iinfo(z.dtype)
                    xs = xv.detach().numpy().astype(np.float32)
                    if s.ndim == 0:
                        y = qcal.fake_quant(xs, float(s), int(z), info.min, info.max)
                    else:
                        y = qcal.fake_quant(xs, s.astype(np.float32), z.astype(np.int32), info.min, info.max,
                                            axis=src[4])
                    env[n.output[0]] = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float32))
                else:
                    q = inits[n.input[0]].astype(np.float64)
                    ax = a.get("axis", 1)
                    if s.ndim == 1 and s.size > 1:
                        shape = [1] * q.ndim
                        shape[ax] = -1
                        s2, z2 = s.reshape(shape), z.reshape(shape)
                    else:
                        s2, z2 = s, z
                    inits[n.output[0]] = ((q - z2.astype(np.float64)) * s2.astype(np.float32)).astype(np.float32)
                continue
            ins = [val(i) if i else None for i in n.input]
            # writable C-order arrays (initializers from onnx are read-only; torch warns on those)
            ins = [torch.from_numpy(np.require(v, requirements=["C", "W"])) if isinstance(v, np.ndarray)
                   else v for v in ins]
            if op == "Conv":
                pads = a.get("pads", [0, 0, 0, 0])
                if pads[0] != pads[2] or pads[1] != pads[3]:
                    raise SystemExit("interpret: asymmetric pads")
                y = F.conv2d(ins[0], ins[1], ins[2] if len(ins) > 2 else None, stride=a.get("strides", [1, 1]),
                             padding=pads[:2], dilation=a.get("dilations", [1, 1]), groups=a.get("group", 1))
            elif op == "Gemm":
                A, B = ins[0], ins[1]
                if a.get("transA", 0):
                    A = A.t()
                y = A @ (B.t() if a.get("transB", 0) else B)
                y = y * a.get("alpha", 1.0)
                if len(ins) > 2 and ins[2] is not None:
                    y = y + a.get("beta", 1.0) * ins[2]
            elif op == "Clip":
                lo = float(ins[1]) if len(ins) > 1 and ins[1] is not None else -np.inf
                hi = float(ins[2]) if len(ins) > 2 and ins[2] is not None else np.inf
                y = torch.clamp(ins[0], lo, hi)
            elif op == "Relu":
                y = torch.relu(ins[0])
            elif op == "Add":
                y = ins[0] + ins[1]
            elif op == "GlobalAveragePool":
                y = ins[0].mean(dim=(2, 3), keepdim=True)
            elif op == "Flatten":
                y = torch.flatten(ins[0], a.get("axis", 1))
            elif op == "Reshape":
                y = ins[0].reshape([int(d) if d != 0 else ins[0].shape[k] for k, d in enumerate(ins[1].tolist())])
            elif op == "BatchNormalization":
                sc, b, mu, var = ins[1], ins[2], ins[3], ins[4]
                k = sc / torch.sqrt(var + a.get("epsilon", 1e-5))
                y = ins[0] * k[None, :, None, None] + (b - mu * k)[None, :, None, None]
            else:
                raise SystemExit("interpret: op %s not supported" % op)
            env[n.output[0]] = y
        outs.append(env[out_name].detach().numpy())
    return np.concatenate(outs)


def fold_bn_numpy(src, dst):
    """Conv -> BatchNormalization folded (w * k, (b - mean) * k + beta, k = gamma / sqrt(var +
    eps)): only for a qcal without `equalize`."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(src)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    prod = {o: n for n in g.node for o in n.output}
    drop = []
    for n in g.node:
        if n.op_type != "BatchNormalization":
            continue
        c = prod[n.input[0]]
        gam, beta, mu, var = (numpy_helper.to_array(inits[i]).astype(np.float64) for i in n.input[1:5])
        k = gam / np.sqrt(var + _attrs(n).get("epsilon", 1e-5))
        w = numpy_helper.to_array(inits[c.input[1]]).astype(np.float64)
        b = numpy_helper.to_array(inits[c.input[2]]).astype(np.float64) if len(c.input) > 2 else np.zeros(len(k))
        inits[c.input[1]].CopyFrom(numpy_helper.from_array((w * k[:, None, None, None]).astype(np.float32), c.input[1]))
        bname = c.input[1] + "_folded_bias"
        g.initializer.append(numpy_helper.from_array(((b - mu) * k + beta).astype(np.float32), bname))
        if len(c.input) > 2:
            c.input[2] = bname
        else:
            c.input.append(bname)
        c.output[0] = n.output[0]
        drop.append(n)
    for n in drop:
        g.node.remove(n)
    onnx.save(m, dst)


# ---- per-layer weight ranges after folding ----

def range_ratios(model_path):
    """[(node, op, groups, channels, min range, max range, ratio)] for every Conv / Gemm:
    range = max |w| over the output channel's weights (what a symmetric quantizer covers)."""
    import onnx
    from onnx import numpy_helper
    m = onnx.load(model_path)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    rows = []
    for n in m.graph.node:
        if n.op_type not in ("Conv", "Gemm") or n.input[1] not in inits:
            continue
        w = inits[n.input[1]].astype(np.float64)
        r = np.abs(w.reshape(w.shape[0], -1)).max(1)
        grp = _attrs(n).get("group", 1)
        rows.append((n.name or n.output[0], n.op_type, grp, w.shape[0], float(r.min()), float(r.max()),
                     float(r.max() / r.min()) if r.min() > 0 else float("inf")))
    return rows


def top1(z, y):
    return 100.0 * float(np.mean(z.argmax(1) == y))


def markdown(summary_path):
    """The docs' tables (docs/models.md) from a --json summary."""
    s = json.load(open(summary_path))
    print("| row | ONNX Runtime int8 top-1 (agreement with float) | qcal fake-quant top-1 (agreement) |")
    print("|---|---|---|")
    for r in s["rows"]:
        f = lambda k, g: "%.2f%% (%.2f%%)" % (r[k], r[g]) if k in r and g in r else "%.2f%%" % r[k] if k in r else "-"
        print("| %s | %s | %s |" % (r["label"], f("ort_top1", "ort_agree"), f("fq_top1", "fq_agree")))
    for mkey, rr in s["range_ratios"].items():
        print("\n%s model: largest / smallest per-channel max |w|\n" % mkey)
        print("| layer | op | channels | min | max | ratio |")
        print("|---|---|---|---|---|---|")
        for t in rr:
            print("| %s | %s | %d | %.3g | %.3g | %.1f |" % (t[0], "depthwise Conv" if t[2] > 1 else t[1], t[3],
                                                          t[4], t[5], t[6]))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--markdown":
        markdown(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--qcal", default=os.path.join(ROOT, "build", "tools", "qcal"))
    ap.add_argument("--model", default=os.path.join(HERE, "mobilenet.onnx"))
    ap.add_argument("--work")
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--calib-images", type=int, default=1000)
    ap.add_argument("--rows", default="all")
    ap.add_argument("--no-fakequant", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--demo", action="store_true",
                    help="the demo's selection: Table 3's rows and the cures (DEMO_ROWS), both columns")
    ap.add_argument("--threads", default=os.environ.get("OMP_NUM_THREADS", "2"))
    a = ap.parse_args()
    try:
        import onnx  # noqa: F401
        import torch
        import qcal  # noqa: F401
    except ImportError as e:
        log("mobilenet table: skipped: %s (needs /usr/bin/python3 with onnx, torch and qcal on PYTHONPATH)" % e)
        return 77
    torch.set_num_threads(1)
    import train
    if not os.path.exists(os.path.join(train.DATA, "t10k-images-idx3-ubyte.gz")):
        log("mobilenet table: skipped: Fashion-MNIST not found in %s" % train.DATA)
        return 77
    runner = os.path.join(ROOT, "tests", "ort", "ort_run.cjs")
    # ONNX Runtime makes the calibration dumps: without it nothing can be measured
    use_ort = True
    if not shutil.which("node"):
        log("mobilenet table: skipped: node not found (apt-get install nodejs npm; ./run.sh installs ONNX Runtime)")
        return 77
    if not os.path.exists(os.path.join(npm_dir(), "node_modules", "onnxruntime-node", "package.json")):
        log("mobilenet table: skipped: onnxruntime-node not in %s (./run.sh demo|test installs it)" % npm_dir())
        return 77
    if a.demo and a.rows == "all":
        a.rows = ",".join(DEMO_ROWS)
    rows = ROWS if a.rows == "all" else [r for r in ROWS if r[0] in a.rows.split(",")]
    w = a.work or tempfile.mkdtemp(prefix="qcal-mnet-")
    os.makedirs(w, exist_ok=True)
    P = lambda *p: os.path.join(w, *p)
    t0 = time.monotonic()

    xt, yt = train.load_idx("t10k")
    xt, yt = xt[:a.images], yt[:a.images]
    x, _ = train.load_idx("train")
    pick = np.random.default_rng(train.SEED).choice(len(x), a.calib_images, replace=False)
    np.save(P("test.npy"), xt)
    np.save(P("calib.npy"), x[np.sort(pick)])

    # BatchNorm folded by qcal, then the cured models
    models = {"folded": P("folded.onnx"), "cle": P("cle.onnx"), "cle_bc": P("cle_bc.onnx")}
    if subprocess.run([a.qcal, "equalize", "--help"], capture_output=True).returncode == 0:
        run(a.qcal, "equalize", a.model, "-o", models["folded"], "--no-equalize")
    else:
        log("mobilenet table: this qcal has no 'equalize': BatchNorm folded in numpy, no cure rows")
        fold_bn_numpy(a.model, models["folded"])
        rows = [r for r in rows if r[1][3] == "folded"]
    need = {r[1][3] for r in rows}
    ratios = {"folded": range_ratios(models["folded"])}

    def ort(model, inp, **kw):
        args = ["node", runner, model, inp, "--threads", a.threads]
        for k, v in kw.items():
            args += ["--" + k, v]
        return run(*args)

    def calibrate(model, tag):
        """Dump of model's exposed tensors on the calibration images -> one table per kind."""
        exposed = P("exposed_%s.onnx" % tag)
        run(a.qcal, "onnx-expose", model, "-o", exposed, "--list", P("list_%s.txt" % tag))
        ort(exposed, P("calib.npy"), dump=P("dump_%s" % tag), batch="100")
        return P("dump_%s" % tag)

    dumps = {"folded": calibrate(models["folded"], "folded")}
    if "cle" in need:
        run(a.qcal, "equalize", a.model, "-o", models["cle"])
        ratios["cle"] = range_ratios(models["cle"])
        dumps["cle"] = calibrate(models["cle"], "cle")
    if "cle_bc" in need:
        # empirical bias correction from the original model's dump (qcal divides E[x] by the
        # equalization scales), for the per-tensor affine weights the rows deploy
        run(a.qcal, "equalize", a.model, "-o", models["cle_bc"], "--bias-correction", dumps["folded"],
            "--weight-qscheme", "per_tensor_affine")
        dumps["cle_bc"] = calibrate(models["cle_bc"], "cle_bc")

    results = []
    float_ref = {}
    for key, (label, kind, qopts, mkey) in rows:
        model = models[mkey]
        r = {"row": key, "label": label, "observer": kind, "model": mkey}
        if kind is None:
            qmodel = model
        else:
            table = P("table_%s_%s.json" % (mkey, kind))
            if not os.path.exists(table):
                run(a.qcal, "calibrate", dumps[mkey], "-o", table, "--observer", kind)
            qmodel = P("qdq_%s.onnx" % key)
            run(a.qcal, "qdq", model, "--table", table, "-o", qmodel, *qopts)
        t1 = time.monotonic()
        if use_ort:
            # activations only: ONNX Runtime 1.30 quantizes float weights of a DQ -> Conv -> Q
            # unit itself from optimization level basic on, so that row runs unoptimized
            # (float Conv between the activations' Q/DQ pairs)
            ort(qmodel, P("test.npy"), out=P("ort_%s.npy" % key), level="disabled" if key == "act_only" else "all",
                precision="high", optimized=P("opt_%s.onnx" % key))
            z = np.load(P("ort_%s.npy" % key))
            r["ort_top1"] = top1(z, yt)
            import collections
            ops = collections.Counter(n.op_type for n in onnx.load(P("opt_%s.onnx" % key)).graph.node)
            r["ort_int8_ops"] = sum(ops[o] for o in ("QLinearConv", "QGemm", "QLinearMatMul"))
            r["ort_float_ops"] = sum(ops[o] for o in ("Conv", "Gemm", "FusedConv", "FusedGemm", "MatMul"))
            if key == "float":
                float_ref["ort"] = z
            if "ort" in float_ref:
                r["ort_agree"] = 100.0 * float(np.mean(z.argmax(1) == float_ref["ort"].argmax(1)))
        if not a.no_fakequant:
            zf = interpret(qmodel, xt)
            r["fq_top1"] = top1(zf, yt)
            if key == "float":
                float_ref["fq"] = zf
            if "fq" in float_ref:
                r["fq_agree"] = 100.0 * float(np.mean(zf.argmax(1) == float_ref["fq"].argmax(1)))
            if use_ort:
                r["ort_fq_same"] = 100.0 * float(np.mean(zf.argmax(1) == z.argmax(1)))
        r["seconds"] = time.monotonic() - t1
        results.append(r)
        if len(results) == 1:
            log("  %-46s %-21s %-21s %s" % ("%d test images" % len(yt), "ONNX Runtime (agree)",
                                            "qcal fake-quant", "ORT int8 / float ops"))
        pct = lambda k, g: ("%6.2f%% (%6.2f%%)" % (r[k], r[g]) if g in r else "%6.2f%%          " % r[k]) \
            if k in r else "   -                "
        log("  %-46s %-21s %-21s %s" % (label, pct("ort_top1", "ort_agree"), pct("fq_top1", "fq_agree"),
                                         "%d / %d" % (r["ort_int8_ops"], r["ort_float_ops"]) if "ort_int8_ops" in r else ""))
    for mkey, rr in ratios.items():
        worst = sorted(rr, key=lambda t: -t[6])[:4]
        log("  largest / smallest per-channel weight range (max |w|), %s model: %s" % (
            "BN-folded" if mkey == "folded" else mkey, ", ".join(
                "%s %s %.0f" % (t[0].replace("/features/", "").replace("/Conv", ""),
                                "dw" if t[2] > 1 else t[1], t[6]) for t in worst)))
    summary = {"images": int(len(yt)), "calib_images": a.calib_images, "rows": results,
               "range_ratios": ratios, "seconds": time.monotonic() - t0}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    if not a.work:
        shutil.rmtree(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
