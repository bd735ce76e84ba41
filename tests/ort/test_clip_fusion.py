"""ort.clip_fusion: profile ort fuses Clip (ReLU6 = Clip(0, 6)) into the quantized op before it,
as Relu, so ONNX Runtime's optimized graph has no requantization between an int8 Conv and
its activation.

examples/mobilenet/mobilenet.onnx (MobileNetV2-style: 28 Conv, 19 ReLU6; BN folded by qdq)
is calibrated with minmax on the first 512 Fashion-MNIST training images (onnx-expose ->
ONNX Runtime dump -> calibrate) and quantized by `qcal qdq` twice: by default (Clip fused: no
Q/DQ on the Conv output, the Q after the Clip with a range inside [0, 6], so ONNX Runtime's
ClipQuantFusion drops the Clip) and with --op-types naming every default op type but Clip
(the placement before: Q/DQ on the Conv output, the Clip float, Q/DQ after it), each
exposed and calibrated with its own op types. In ONNX Runtime's optimized graph (level all)
it counts QLinearConv -> DequantizeLinear -> QuantizeLinear chains (a requantization between
two int8 ops): UNFUSED_PAIRS before, at most MAX_PAIRS fused, no Clip left, every Conv a
QLinearConv; top-1 on the 10,000 test images must not drop by more than TOL points. Skips
(exit 77, one line) without node / onnxruntime-node, python3-onnx, numpy or the dataset.

Environment: QCAL_BIN (qcal)."""
import collections
import gzip
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODEL = os.path.join(ROOT, "examples", "mobilenet", "mobilenet.onnx")
DATA = os.environ.get("QCAL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530   # examples/mobilenet/train.py
UNFUSED_PAIRS = 18   # measured before Clip fusion (onnxruntime-node 1.30)
MAX_PAIRS = 0        # measured with it
TOL = 0.1            # points of top-1 (10 images of 10,000)
UNFUSED = "Conv,ConvTranspose,Gemm,MatMul,Add,Mul,AveragePool,GlobalAveragePool,MaxPool,Flatten,Reshape," \
          "Transpose,Squeeze,Unsqueeze"


def skip(why):
    print("ort.clip_fusion: skipped: " + why)
    sys.exit(77)


try:
    import numpy as np
    import onnx
except ImportError as e:
    skip(str(e))
QCAL = os.environ.get("QCAL_BIN", os.path.join(ROOT, "build", "tools", "qcal"))
if not shutil.which("node"):
    skip("node not found")
if not os.path.exists(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")):
    skip("Fashion-MNIST not found in " + DATA)


def load_idx(kind, n):
    """The first n images of a Fashion-MNIST split, normalised as train.py does, and labels."""
    with gzip.open(os.path.join(DATA, "%s-images-idx3-ubyte.gz" % kind), "rb") as f:
        f.read(16)
        px = np.frombuffer(f.read(n * 784), dtype=np.uint8)
    with gzip.open(os.path.join(DATA, "%s-labels-idx1-ubyte.gz" % kind), "rb") as f:
        f.read(8)
        y = np.frombuffer(f.read(n), dtype=np.uint8)
    x = px.astype(np.float32) / np.float32(255.0)
    x = ((x - np.float32(MEAN)) / np.float32(STD)).reshape(-1, 1, 28, 28).astype(np.float32)
    return x, y


def run(*cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode == 77:
        skip(r.stdout.strip())
    if r.returncode != 0:
        raise SystemExit("FAILED (exit %d): %s\n%s%s" % (r.returncode, " ".join(map(str, cmd)), r.stdout[-3000:],
                                                        r.stderr[-3000:]))
    return r


def ort(model, x, out, optimized=None):
    args = ["node", os.path.join(HERE, "ort_run.cjs"), model, x, "--out", out, "--threads", "2",
            "--precision", "high"]
    if optimized:
        args += ["--optimized", optimized, "--level", "all"]
    run(*args)
    return np.load(out)


def requant_pairs(path):
    """(QLinearConv -> DequantizeLinear -> QuantizeLinear chains, op type counts)."""
    g = onnx.load(path).graph
    cons = collections.defaultdict(list)
    for n in g.node:
        for i in n.input:
            cons[i].append(n)
    pairs = 0
    for n in g.node:
        if n.op_type == "QLinearConv":
            for dq in cons[n.output[0]]:
                if dq.op_type == "DequantizeLinear":
                    pairs += sum(q.op_type == "QuantizeLinear" for q in cons[dq.output[0]])
    return pairs, collections.Counter(n.op_type for n in g.node)


def main():
    w = tempfile.mkdtemp(prefix="qcal-clip-")
    P = lambda *p: os.path.join(w, *p)
    xc, _ = load_idx("train", 512)
    xt, y = load_idx("t10k", 10000)
    np.save(P("calib.npy"), xc)
    np.save(P("test.npy"), xt)
    zf = ort(MODEL, P("test.npy"), P("float.npy"))
    res = {}
    for tag, extra in (("unfused", ["--op-types", UNFUSED]), ("fused", [])):
        # each placement exposes (and calibrates) the tensors it quantizes
        run(QCAL, "onnx-expose", MODEL, "-o", P(tag + "_exposed.onnx"), *extra)
        run("node", os.path.join(HERE, "ort_run.cjs"), P(tag + "_exposed.onnx"), P("calib.npy"), "--dump", P(tag + "_dump"),
            "--batch", "128")
        run(QCAL, "calibrate", P(tag + "_dump"), "-o", P(tag + "_table.json"), "--observer", "minmax")
        run(QCAL, "qdq", MODEL, "--table", P(tag + "_table.json"), "-o", P(tag + ".onnx"), *extra)
        z = ort(P(tag + ".onnx"), P("test.npy"), P(tag + ".npy"), optimized=P(tag + "_opt.onnx"))
        pairs, ops = requant_pairs(P(tag + "_opt.onnx"))
        top1 = 100.0 * float(np.mean(z.argmax(1) == y))
        agree = 100.0 * float(np.mean(z.argmax(1) == zf.argmax(1)))
        res[tag] = (pairs, ops["Clip"], top1, ops["QLinearConv"], ops["Conv"] + ops["FusedConv"])
        print("%-8s QLinearConv -> DQ -> Q: %2d, Clip: %2d, QLinearConv: %2d, top-1 %.2f%% (float %.2f%%), "
              "agreement with float %.2f%%" % (tag, pairs, ops["Clip"], ops["QLinearConv"], top1,
                                               100.0 * float(np.mean(zf.argmax(1) == y)), agree))
    fails = []
    if res["unfused"][0] != UNFUSED_PAIRS:
        fails.append("unfused: %d requantization pairs, expected %d" % (res["unfused"][0], UNFUSED_PAIRS))
    if res["fused"][0] > MAX_PAIRS or res["fused"][1] != 0 or res["fused"][3] != 28 or res["fused"][4]:
        fails.append("fused: %d requantization pairs (at most %d), %d Clip (0), %d QLinearConv (28), %d float Conv"
                     % (res["fused"][0], MAX_PAIRS, res["fused"][1], res["fused"][3], res["fused"][4]))
    if res["fused"][2] < res["unfused"][2] - TOL:
        fails.append("fused: top-1 %.2f%% below unfused %.2f%%" % (res["fused"][2], res["unfused"][2]))
    if fails:
        print("FAILED:\n  " + "\n  ".join(fails) + "\n(files kept in %s)" % w)
        return 1
    shutil.rmtree(w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
