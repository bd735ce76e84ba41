#!/usr/bin/python3
"""Writes the hand-made part of the libFuzzer seed corpora in tests/fuzz/corpus/<target>/.

Run from the repository root: /usr/bin/python3 tests/fuzz/make_seeds.py
(Plain Python; the .npy seeds are copies of tests/data/npy files, made by .ci/run's author
once with cp, and the calibration-table seeds copies of tests/data/calib/*.json.)
Seeds are small on purpose: libFuzzer mutates them, so each one shows a structure
(every dtype, metadata, gzip, each rules key, each subcommand), not a volume of data."""
import gzip
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- safetensors ----
def safetensors(tensors, metadata=None, pad=True):
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(payload)]}
        blobs.append(payload)
        off += len(payload)
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


f32 = struct.pack("<4f", 1.0, -2.5, 3.25, float("inf"))
f16 = struct.pack("<3H", 0x3C00, 0x7E00, 0x0001)        # 1.0, NaN, smallest subnormal
bf16 = struct.pack("<2H", 0x3F80, 0xFF80)              # 1.0, -inf
f64 = struct.pack("<2d", 1e300, -1e-300)
i64 = struct.pack("<q", -7)
put("fuzz_safetensors", "mixed.safetensors",
    safetensors([("a", "F32", [2, 2], f32), ("b.weight", "F16", [3], f16),
                 ("c", "BF16", [2, 1], bf16), ("d", "F64", [2], f64), ("e", "I64", [], i64)],
                metadata={"format": "pt"}))
put("fuzz_safetensors", "empty_tensor.safetensors", safetensors([("z", "F32", [0, 4], b"")]))
put("fuzz_safetensors", "scalar.safetensors", safetensors([("s", "F32", [], f32[:4])]))
put("fuzz_safetensors", "no_tensors.safetensors", safetensors([], metadata={}))
put("fuzz_safetensors", "unpadded.safetensors",
    safetensors([("x", "F32", [4], f32)], pad=False))
put("fuzz_safetensors", "big_shape.safetensors",
    safetensors([("x", "F32", [4294967296, 4294967296], b"")]))

# ---- IDX ----
def idx(dims, payload, type_code=0x08):
    hdr = struct.pack(">I", (type_code << 8) | len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    return hdr + payload


labels = idx([5], bytes([0, 1, 2, 9, 3]))
images = idx([2, 3, 3], bytes(range(18)))
put("fuzz_idx", "labels.idx1", labels)
put("fuzz_idx", "images.idx3", images)
put("fuzz_idx", "labels.idx1.gz", gzip.compress(labels, mtime=0))
put("fuzz_idx", "images.idx3.gz", gzip.compress(images, mtime=0))
put("fuzz_idx", "four_dims.idx4", idx([1, 2, 1, 2], bytes(4)))
put("fuzz_idx", "float_type.idx1", idx([2], struct.pack(">2f", 1.0, 2.0), type_code=0x0D))
put("fuzz_idx", "empty.idx1", idx([0], b""))
put("fuzz_idx", "two_members.gz", gzip.compress(labels[:6], mtime=0) + gzip.compress(labels[6:], mtime=0))

# ---- dump manifests ----
put("fuzz_manifest", "layout.json", json.dumps({"tensors": [
    {"name": "/layer1/conv/Conv_output_0", "role": "activation",
     "files": ["b0.npy", "deep/b1.npy"]},
    {"name": "input:0", "files": ["in.npy"]},
    {"name": "fc.weight", "role": "weight", "files": ["w/fc.npy"]}]}, indent=1))
put("fuzz_manifest", "escapes.json", '{"tensors": [{"name": "\\u00e9 \\ud83d\\ude00 \\"q\\"", '
    '"role": "weight", "files": ["a.npy", "a.npy"]}, {"name": "\\u00e9 \\ud83d\\ude00 \\"q\\"", '
    '"role": "activation", "files": ["x/./y.npy"]}]}')
put("fuzz_manifest", "outside.json", '{"tensors": [{"name": "a", "files": ["../x.npy", "/abs.npy"]}]}')
put("fuzz_manifest", "bad_member.json", '{"tensors": [{"name": "a", "files": ["x.npy"], "extra": 1}], "v": 2}')

# ---- rules ----
put("fuzz_rules", "sample.txt",
    "# qcal calibration rules\n"
    "*.weight    weight      per_channel_minmax dtype=qint8 qscheme=per_channel_symmetric\n"
    "fc*         activation  moving_average_minmax averaging_constant=0.01\n"
    "\"conv 1*\"   any         minmax dtype=qint8 qscheme=per_tensor_symmetric  # quoted glob\n"
    "*           activation  minmax\n")
put("fuzz_rules", "all_keys.txt",
    "layer[0-9].* activation histogram bins=256 grid=first-batch reduce_range=true eps=1e-6 nonfinite=skip\n"
    "p* any percentile percentile=99.9 percentile_mode=two_tails quant_min=0 quant_max=127\n"
    "e? weight entropy entropy_levels=64 bins=512 nonfinite=error\n"
    "m\\* activation mse dtype=qint32\n"
    "w weight moving_average_per_channel_minmax axis=-1 averaging_constant=1 "
    "qscheme=per_channel_affine_float_qparams\n")
put("fuzz_rules", "crlf_no_newline.txt", "a activation minmax\r\nb weight per_channel_minmax axis=1")
put("fuzz_rules", "empty.txt", "")

# ---- CLI arguments: mode byte (even = option layer, odd = whole CLI), NUL-separated args ----
def args(mode, *a):
    return bytes([mode]) + b"\0".join(x.encode() for x in a)


put("fuzz_cli_args", "opts_observer", args(0, "--observer", "histogram", "--bins=64", "--quant-min",
                                           "0", "--quant-max", "15", "x.npy", "--", "-y"))
put("fuzz_cli_args", "opts_numbers", args(0, "--scale", "1e-3", "--zero-point=-5", "-f", "0x1p-3",
                                          "--eps", "1e-9", "--percentile", "99.99", "-x"))
put("fuzz_cli_args", "opts_errors", args(0, "--axis", "-1", "--qscheme", "per_channel_symmetric",
                                         "--reduce-range", "--strict", "--dtype", "qint32", "-o"))
# Whole-CLI seeds use the fixtures fuzz_cli_args.c creates in its private directory:
# x.npy (float32), q.npy (uint8), w.safetensors, d/ (a dump), r.txt (rules).
put("fuzz_cli_args", "cli_help", args(1, "--help"))
put("fuzz_cli_args", "cli_version", args(1, "--version"))
put("fuzz_cli_args", "cli_observe", args(1, "observe", "--observer", "entropy", "x.npy", "x.npy"))
put("fuzz_cli_args", "cli_observe_pc", args(1, "observe", "--observer", "per_channel_minmax",
                                            "--axis", "-1", "--strict", "x.npy"))
put("fuzz_cli_args", "cli_quantize", args(1, "quantize", "--scale", "0.1", "--zero-point", "3",
                                          "--dtype", "quint8", "x.npy", "-o", "out.npy"))
put("fuzz_cli_args", "cli_quantize_pc", args(1, "quantize", "--axis", "1", "--scales", "0.1,0.2,0.3",
                                             "--zero-points", "0,1,2", "--dtype", "qint8", "x.npy",
                                             "-o", "out.npy"))
put("fuzz_cli_args", "cli_dequantize", args(1, "dequantize", "--scale", "0.5", "--zero-point", "128",
                                            "q.npy", "--output=o.npy"))
put("fuzz_cli_args", "cli_calibrate", args(1, "calibrate", "d", "--rules", "r.txt", "--format",
                                           "tensorrt", "-o", "t.cache"))
put("fuzz_cli_args", "cli_calibrate_json", args(1, "calibrate", "--observer", "histogram", "d",
                                                "-o", "t.json"))
put("fuzz_cli_args", "cli_stats", args(1, "stats", "--summary", "--csv", "s.csv", "w.safetensors",
                                       "x.npy"))
put("fuzz_cli_args", "cli_compare", args(1, "compare-weights", "w.safetensors", "--min-sqnr", "30",
                                         "--format", "json"))
put("fuzz_cli_args", "cli_fakequant", args(1, "fakequant", "--scale", "0.5", "--zero-point", "2",
                                           "--grad", "x.npy", "--learnable", "x.npy", "-o", "y.npy"))
put("fuzz_cli_args", "cli_help_sub", args(1, "help", "calibrate"))
put("fuzz_cli_args", "cli_merge", args(1, "merge", "x.npy", "--save-state", "m.state"))
put("fuzz_cli_args", "cli_observe_state", args(1, "observe", "--save-state", "o.state", "x.npy"))


# ---- state files (docs/state.md), written from the documented layout ----
# Config defaults as qcal_observer_config_default; kind, dtype and qscheme numbers are the
# enums of qcal/observer.h and qcal/qparams.h.
FLT_EPSILON = 1.1920928955078125e-07
KINDS = {"minmax": 0, "moving_average_minmax": 1, "per_channel_minmax": 2,
         "moving_average_per_channel_minmax": 3, "histogram": 4, "percentile": 5,
         "entropy": 6, "mse": 7}


def qcob(kind, payload, dtype, qscheme, nonfinite=0, batches=1, bins=2048, grid=0,
         levels=128, axis=0, version=2, pmode=0):
    cfg = struct.pack("<IIIII", KINDS[kind], dtype, qscheme, 0, 0)
    cfg += struct.pack("<qq", 0, 0) + struct.pack("<f", FLT_EPSILON)
    cfg += struct.pack("<ifiI", axis, 0.01, bins, grid)
    cfg += struct.pack("<dIII", 99.99, pmode, levels, 0)
    return (b"QCOB" + struct.pack("<I", version) + cfg +
            struct.pack("<QQQ", nonfinite, batches, len(payload)) + payload)


def qcss(entries):
    out = b"QCSS" + struct.pack("<IQ", 1, len(entries))
    for name, role, elements, state in entries:
        n = name.encode()
        out += struct.pack("<I", len(n)) + n + struct.pack("<IQQ", role, elements, len(state)) + state
    return out


# dtype / qscheme numbers as the library writes them (tests/test_state.c checks the layout).
QUINT8, QINT8 = 0, 1
PER_TENSOR_AFFINE, PER_TENSOR_SYMMETRIC, PER_CHANNEL_AFFINE, PER_CHANNEL_SYMMETRIC = 0, 1, 2, 3
mm = qcob("minmax", struct.pack("<ff", -2.25, 3.0), QUINT8, PER_TENSOR_AFFINE, nonfinite=2,
          batches=2)
mm_empty = qcob("minmax", struct.pack("<ff", float("inf"), float("-inf")), QUINT8,
                PER_TENSOR_AFFINE, batches=0)
ma = qcob("moving_average_minmax", struct.pack("<ff", -1.5, 2.5), QUINT8, PER_TENSOR_AFFINE)
pc = qcob("per_channel_minmax",
          struct.pack("<Q", 3) + struct.pack("<6f", -1, 1, -2, 2, float("inf"), float("-inf")),
          QUINT8, PER_CHANNEL_AFFINE)
wpc = qcob("per_channel_minmax", struct.pack("<Q", 2) + struct.pack("<4f", -0.5, 0.25, -1, 1),
           QINT8, PER_CHANNEL_SYMMETRIC)
put("fuzz_state", "minmax.state", mm)
put("fuzz_state", "minmax_empty.state", mm_empty)
put("fuzz_state", "moving_average.state", ma)
put("fuzz_state", "per_channel.state", pc)
put("fuzz_state", "session.state", qcss([("conv1", 0, 64, mm), ("conv1", 1, 8, wpc),
                                         ("fc", 0, 12, pc), ("relu", 0, 0, mm_empty)]))
put("fuzz_state", "session_empty.state", qcss([]))
# Histogram family on the lattice grid (payload in docs/state.md): bins 4 = 8 cells.
# histogram, values -1.5 .. 3.0: e 0 (cells of width 1), jmin -2, 6 cells, 4 values.
lat = struct.pack("<iqIffQ", 0, -2, 6, -1.5, 3.0, 4) + struct.pack("<6Q", 1, 0, 2, 0, 0, 1)
put("fuzz_state", "histogram_lattice.state",
    qcob("histogram", lat, QUINT8, PER_TENSOR_AFFINE, bins=4))
# entropy with a symmetric target (|x| cells from 0), same data: max|x| 3.0 -> e -1 (width
# 0.5), 7 cells; 1.5 in cell 3, 3.0 in cell 6. Version 2 (the state did not change).
lat_abs = struct.pack("<iqIffQ", -1, 0, 7, -1.5, 3.0, 2) + struct.pack("<7Q", 0, 0, 0, 1, 0, 0, 1)
put("fuzz_state", "entropy_lattice.state",
    qcob("entropy", lat_abs, QINT8, PER_TENSOR_SYMMETRIC, bins=4, levels=2))
# entropy with an affine target keeps x, as histogram (version 3), and percentile mode auto.
put("fuzz_state", "entropy_signed_lattice.state",
    qcob("entropy", lat, QUINT8, PER_TENSOR_AFFINE, bins=4, levels=2, version=3))
put("fuzz_state", "percentile_auto_lattice.state",
    qcob("percentile", lat, QUINT8, PER_TENSOR_AFFINE, bins=4, version=3, pmode=2))


# ---- ONNX models (fuzz_onnx): built with python3-onnx when it is there ----
def onnx_seeds():
    try:
        import numpy as np
        import onnx
        from onnx import TensorProto as T
        from onnx import helper as h
        from onnx import numpy_helper as nh
    except ImportError:
        print("make_seeds.py: python3-onnx missing, fuzz_onnx seeds not written")
        return
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return nh.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    def model(nodes, inputs, outputs, inits, opset=13, value_info=()):
        g = h.make_graph(nodes, "g", inputs, outputs, inits, value_info=list(value_info))
        m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
        m.ir_version = 8
        return m.SerializeToString()

    x = h.make_tensor_value_info("input", T.FLOAT, ["N", 1, 6, 6])
    cnn = model([
        h.make_node("Conv", ["input", "c.w", "c.b"], ["/c/Conv_output_0"], name="/c/Conv", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["/c/Conv_output_0"], ["/r/Relu_output_0"], name="/r/Relu"),
        h.make_node("MaxPool", ["/r/Relu_output_0"], ["/p/MaxPool_output_0"], name="/p/MaxPool",
                    kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("Flatten", ["/p/MaxPool_output_0"], ["/f/Flatten_output_0"], name="/f/Flatten"),
        h.make_node("Gemm", ["/f/Flatten_output_0", "fc.w", "fc.b"], ["logits"], name="/fc/Gemm", transB=1),
    ], [x], [h.make_tensor_value_info("logits", T.FLOAT, ["N", 3])],
        [w("c.w", 2, 1, 3, 3), w("c.b", 2), w("fc.w", 3, 18), w("fc.b", 3)])
    put("fuzz_onnx", "cnn.onnx", cnn)
    put("fuzz_onnx", "cnn_truncated.onnx", cnn[: len(cnn) // 2])
    # MatMul [K, N], residual Add, Add with a constant, Reshape with a shape initializer,
    # float16 and float64 weights, names with spaces, colons, quotes and non-ASCII.
    y = h.make_tensor_value_info("x:0", T.FLOAT, [2, 4])
    res = model([
        h.make_node("MatMul", ["x:0", "w 1"], ["y/\"q\""], name="mm"),
        h.make_node("Add", ["y/\"q\"", "x:0"], ["s\u00e9"], name="res"),
        h.make_node("Add", ["s\u00e9", "c"], ["t"], name="bias"),
        h.make_node("Reshape", ["t", "shape"], ["z"], name="rs"),
        h.make_node("MatMul", ["z", "w16"], ["o"], name="mm16"),
    ], [y], [h.make_tensor_value_info("o", T.FLOAT16, [2, 4])],
        [w("w 1", 4, 4), w("c", 4), nh.from_array(np.array([2, 4], np.int64), "shape"),
         nh.from_array(rng.standard_normal((4, 4)).astype(np.float16), "w16")], opset=17)
    put("fuzz_onnx", "residual_names.onnx", res)
    # If with subgraphs reading an outer name; Conv with a float64 weight in typed fields.
    then_g = h.make_graph([h.make_node("Relu", ["a"], ["ta"])], "then", [],
                          [h.make_tensor_value_info("ta", T.FLOAT, [1, 1, 2, 2])])
    else_g = h.make_graph([h.make_node("Neg", ["a"], ["ea"])], "else", [],
                          [h.make_tensor_value_info("ea", T.FLOAT, [1, 1, 2, 2])])
    cond = h.make_tensor_value_info("cond", T.BOOL, [])
    xi = h.make_tensor_value_info("xi", T.FLOAT, [1, 1, 2, 2])
    wd = h.make_tensor("wd", T.DOUBLE, [1, 1, 1, 1], [0.5])
    iff = model([
        h.make_node("Conv", ["xi", "wd64"], ["a"], name="conv"),
        h.make_node("If", ["cond"], ["out"], name="if", then_branch=then_g, else_branch=else_g),
    ], [xi, cond], [h.make_tensor_value_info("out", T.FLOAT, [1, 1, 2, 2])],
        [h.make_tensor("wd64", T.FLOAT, [1, 1, 1, 1], [0.5]), wd])
    put("fuzz_onnx", "if_subgraph.onnx", iff)
    # External data (refused by the buffer reader) and opset 11 (refused by qdq).
    ext = onnx.load_from_string(cnn)
    t = ext.graph.initializer[2]
    t.ClearField("raw_data")
    t.data_location = T.EXTERNAL
    for k, v in (("location", "../weights.bin"), ("offset", "0"), ("length", "216")):
        e = t.external_data.add()
        e.key, e.value = k, v
    put("fuzz_onnx", "external_escape.onnx", ext.SerializeToString())
    old = onnx.load_from_string(cnn)
    old.opset_import[0].version = 11
    put("fuzz_onnx", "opset11.onnx", old.SerializeToString())
    # BatchNorm folding and equalization (qcal_onnx_equalize): Conv -> BN -> Clip(0, 6) with
    # Constant -> Cast bounds (as torch.onnx writes them) -> depthwise Conv -> BN -> Relu ->
    # pointwise Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Relu -> Gemm.
    r2 = np.random.default_rng(24)

    def w2(name, *shape):
        return nh.from_array((r2.standard_normal(shape) * 0.5).astype(np.float32), name)

    def bn(prefix, c):
        return [w2(prefix + ".s", c), w2(prefix + ".b", c), w2(prefix + ".m", c),
                nh.from_array(r2.uniform(0.5, 2.0, c).astype(np.float32), prefix + ".v")]

    six = h.make_tensor("six", T.FLOAT, [], [6.0])
    zero = h.make_tensor("zero", T.FLOAT, [], [0.0])
    bnc = model([
        h.make_node("Conv", ["x", "c1.w"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c1", "bn1.s", "bn1.b", "bn1.m", "bn1.v"], ["b1"], name="bn1"),
        h.make_node("Constant", [], ["lo0"], name="k0", value=zero),
        h.make_node("Constant", [], ["hi0"], name="k1", value=six),
        h.make_node("Cast", ["lo0"], ["lo"], name="cast0", to=T.FLOAT),
        h.make_node("Cast", ["hi0"], ["hi"], name="cast1", to=T.FLOAT),
        h.make_node("Clip", ["b1", "lo", "hi"], ["r1"], name="relu6"),
        h.make_node("Conv", ["r1", "dw.w"], ["c2"], name="dw", group=4, pads=[1, 1, 1, 1]),
        h.make_node("BatchNormalization", ["c2", "bn2.s", "bn2.b", "bn2.m", "bn2.v"], ["b2"], name="bn2"),
        h.make_node("Relu", ["b2"], ["r2"], name="relu2"),
        h.make_node("Conv", ["r2", "pw.w", "pw.b"], ["c3"], name="pw"),
        h.make_node("Relu", ["c3"], ["r3"], name="relu3"),
        h.make_node("GlobalAveragePool", ["r3"], ["p"], name="gap"),
        h.make_node("Flatten", ["p"], ["f"], name="flat"),
        h.make_node("Gemm", ["f", "fc1.w", "fc1.b"], ["g1"], name="fc1", transB=1),
        h.make_node("Relu", ["g1"], ["r4"], name="relu4"),
        h.make_node("Gemm", ["r4", "fc2.w"], ["logits"], name="fc2"),
    ], [h.make_tensor_value_info("x", T.FLOAT, ["N", 2, 5, 5])],
        [h.make_tensor_value_info("logits", T.FLOAT, ["N", 3])],
        [w2("c1.w", 4, 2, 3, 3), w2("dw.w", 4, 1, 3, 3), w2("pw.w", 6, 4, 1, 1), w2("pw.b", 6),
         w2("fc1.w", 5, 6), w2("fc1.b", 5), w2("fc2.w", 5, 3)] + bn("bn1", 4) + bn("bn2", 4))
    put("fuzz_onnx", "bn_chain.onnx", bnc)


onnx_seeds()
