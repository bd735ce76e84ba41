"""qcal equalize's bias correction against a numpy reference (suite python).

Models are written with onnx.helper: Conv -> Relu -> depthwise Conv -> Relu -> Gemm, and a
Conv -> BatchNormalization -> Relu -> Conv. The empirical correction reads a dump directory
of .npy batches written here; the reference recomputes bias - (W_q - W) E[x] in numpy with
PyTorch's qint8 qparams (per-channel symmetric, per-tensor affine) and round half to even,
with and without equalization (E[x] divided by the equalization scale s, recovered from the
weights). The analytic correction is checked against E[relu(N(beta, gamma^2))] of the folded
BatchNorm. Skips (exit 77) without numpy, onnx or the qcal binary."""
import math
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper, TensorProto
except ImportError as e:
    print(f"python.bias_correction: skipped: {e}")
    sys.exit(77)

QCAL = os.environ.get("QCAL_BIN")
if not QCAL or not os.path.exists(QCAL):
    print("python.bias_correction: skipped: QCAL_BIN not set")
    sys.exit(77)

rng = np.random.default_rng(7)


def init(name, a):
    return numpy_helper.from_array(np.asarray(a, dtype=np.float32), name)


def chain_model(path):
    w1 = rng.normal(size=(8, 3, 3, 3)) * np.logspace(-2, 1, 8)[:, None, None, None]
    b1 = rng.normal(size=8)
    w2 = rng.normal(size=(8, 1, 3, 3))          # depthwise
    b2 = rng.normal(size=8) * 0.1
    w3 = rng.normal(size=(8, 5))                # Gemm, transB = 0: [in, out]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="dw", group=8, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w3"], ["y"], name="fc"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5])],
                          [init("w1", w1), init("b1", b1), init("w2", w2), init("b2", b2), init("w3", w3)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)


def weights(path):
    m = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in m.graph.initializer}
    out = {}
    for n in m.graph.node:
        if n.op_type in ("Conv", "Gemm"):
            w = inits[n.input[1]]
            b = inits[n.input[2]] if len(n.input) > 2 and n.input[2] else np.zeros(
                w.shape[0] if n.op_type == "Conv" else w.shape[1], np.float32)
            out[n.name] = (w, b, n.input[0])
    return out


def qparams(lo, hi, symmetric):
    # PyTorch 1.13 _calculate_qparams for qint8 [-128, 127], eps = FLT_EPSILON, float32
    lo = np.minimum(lo, 0).astype(np.float32)
    hi = np.maximum(hi, 0).astype(np.float32)
    eps = np.float32(np.finfo(np.float32).eps)
    if symmetric:
        amax = np.maximum(-lo, hi)
        scale = np.maximum(amax / np.float32(255 / 2), eps).astype(np.float32)
        zp = np.zeros_like(scale, dtype=np.int64)
    else:
        scale = np.maximum((hi - lo) / np.float32(255), eps).astype(np.float32)
        zp = np.clip(-128 - np.round(lo / scale).astype(np.int64), -128, 127)
    return scale, zp


def fake_quant(w2d, per_channel, symmetric):
    if per_channel:
        scale, zp = qparams(w2d.min(1), w2d.max(1), symmetric)
        scale, zp = scale[:, None], zp[:, None]
    else:
        scale, zp = qparams(np.array([w2d.min()]), np.array([w2d.max()]), symmetric)
    inv = (np.float32(1) / scale).astype(np.float32)
    q = np.clip(np.round((w2d * inv).astype(np.float32)) + zp, -128, 127)
    return ((q - zp) * scale).astype(np.float32)


def expected_bias(w, b, mean, gemm, groups, per_channel, symmetric):
    if gemm:
        w = w.T          # [out, in]
    o = w.shape[0]
    w2d = w.reshape(o, -1)
    d = (fake_quant(w2d, per_channel, symmetric).astype(np.float64) - w2d).reshape(w.shape[0], w.shape[1], -1).sum(2)
    cin = w.shape[1]
    cout = o // groups
    shift = np.array([sum(d[j, c] * mean[(j // cout) * cin + c] for c in range(cin)) for j in range(o)])
    return (b.astype(np.float64) - shift).astype(np.float32)


def write_dump(d, tensors):
    for name, batches in tensors.items():
        sub = os.path.join(d, name)
        os.makedirs(sub)
        for i, a in enumerate(batches):
            np.save(os.path.join(sub, f"b{i}.npy"), a.astype(np.float32))


def run(*args):
    r = subprocess.run([QCAL, "equalize", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"qcal equalize {' '.join(args)}: exit {r.returncode}: {r.stderr}")
    return r


def check(a, b, what, tol=2e-6):
    err = np.abs(a - b).max() / max(1e-6, np.abs(b).max())
    if err > tol:
        i = int(np.abs(a - b).argmax())
        raise SystemExit(f"{what}: relative error {err:.3g} (worst index {i}: {a.flat[i]} vs {b.flat[i]})")
    return err


def main():
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "m.onnx")
        chain_model(model)
        dump = os.path.join(tmp, "dump")
        inputs = {"x": [rng.normal(size=(4, 3, 6, 6)) + 0.5, rng.normal(size=(2, 3, 6, 6))],
                  "r1": [np.abs(rng.normal(size=(3, 8, 6, 6))) * np.arange(1, 9)[None, :, None, None]],
                  "f": [np.abs(rng.normal(size=(5, 8))) + 1.0]}
        write_dump(dump, inputs)
        means = {k: np.concatenate([a.reshape(a.shape[0], a.shape[1], -1).transpose(1, 0, 2).reshape(a.shape[1], -1)
                                    for a in v], axis=1).mean(1) for k, v in inputs.items()}
        orig = weights(model)
        worst = 0.0
        for qs, pc, sym in [("per_channel_symmetric", True, True), ("per_tensor_affine", False, False),
                            ("per_tensor_symmetric", False, True), ("per_channel_affine", True, False)]:
            out = os.path.join(tmp, f"bc_{qs}.onnx")
            r = run(model, "-o", out, "--no-equalize", "--bias-correction", dump, "--weight-qscheme", qs)
            assert "3 biases corrected" in r.stdout, r.stdout
            got = weights(out)
            for name, groups in [("conv1", 1), ("dw", 8), ("fc", 1)]:
                w, b, x = orig[name]
                assert np.array_equal(got[name][0], w), f"{name}: weights changed by --no-equalize"
                want = expected_bias(w, b, means[x], name == "fc", groups, pc, sym)
                worst = max(worst, check(got[name][1], want, f"{qs} {name} bias"))
        # with equalization: E[x] of an equalized tensor is divided by s (s = W_folded / W_eq)
        eq = os.path.join(tmp, "eq.onnx")
        run(model, "-o", eq)
        eqbc = os.path.join(tmp, "eqbc.onnx")
        run(model, "-o", eqbc, "--bias-correction", dump)
        e0, e1 = weights(eq), weights(eqbc)
        s1 = orig["conv1"][0].reshape(8, -1)[:, 0] / e0["conv1"][0].reshape(8, -1)[:, 0]
        s2 = (np.abs(orig["dw"][0].reshape(8, -1)).max(1) * s1) / np.abs(e0["dw"][0].reshape(8, -1)).max(1)
        assert not np.allclose(s1, 1), "the test model should need equalization"
        for name, groups, mean in [("conv1", 1, means["x"]), ("dw", 8, means["r1"] / s1), ("fc", 1, means["f"] / s2)]:
            w, b, _ = e0[name]
            assert np.array_equal(e1[name][0], w)
            want = expected_bias(w, b, mean, name == "fc", groups, True, True)
            worst = max(worst, check(e1[name][1], want, f"equalized {name} bias", tol=1e-5))

        # analytic: Conv -> BN -> Relu -> Conv, E[x] = mu Phi(mu / sigma) + sigma phi(mu / sigma)
        w1 = rng.normal(size=(6, 2, 1, 1)); w2 = rng.normal(size=(4, 6, 3, 3)); b2 = rng.normal(size=4)
        gamma = rng.normal(size=6); beta = rng.normal(size=6); mu = rng.normal(size=6); var = rng.uniform(0.5, 2, 6)
        nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
                 helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["bn"], name="bn"),
                 helper.make_node("Relu", ["bn"], ["r"], name="relu"),
                 helper.make_node("Conv", ["r", "w2", "b2"], ["y"], name="conv2")]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [init("w1", w1), init("w2", w2), init("b2", b2), init("g", gamma), init("be", beta),
                               init("mu", mu), init("var", var)])
        bnm = os.path.join(tmp, "bn.onnx")
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), bnm)
        an = os.path.join(tmp, "an.onnx")
        r = run(bnm, "-o", an, "--no-equalize", "--analytic-bias-correction")
        assert "1 BatchNormalization folded" in r.stdout and "1 bias corrected" in r.stdout, r.stdout
        got = weights(an)
        folded_w1 = (w1 * (gamma / np.sqrt(var + 1e-5))[:, None, None, None]).astype(np.float32)
        check(got["conv1"][0], folded_w1, "folded conv1 weight")
        m, s = beta.astype(np.float32).astype(np.float64), np.abs(gamma.astype(np.float32).astype(np.float64))
        ex = np.array([mi * 0.5 * math.erfc(-(mi / si) / math.sqrt(2)) + si * math.exp(-0.5 * (mi / si) ** 2) /
                       math.sqrt(2 * math.pi) for mi, si in zip(m, s)])
        want = expected_bias(w2.astype(np.float32), b2.astype(np.float32), ex, False, 1, True, True)
        worst = max(worst, check(got["conv2"][1], want, "analytic conv2 bias"))
        print(f"python.bias_correction: ok (worst relative error {worst:.3g})")


main()
