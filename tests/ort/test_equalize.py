"""ort.equalize: qcal equalize keeps the float function, checked in ONNX Runtime 1.30.

Graphs exported by torch.onnx (BatchNormalization kept, opset 13): random small nets of
Conv/BN/ReLU, depthwise -> pointwise, a residual branch and Gemm layers over two seeds (with and without the residual),
and torchvision 0.14's mobilenet_v2 (width 0.5, ReLU6 -> ReLU as Nagel et al. do, random
weights and BatchNorm statistics), each run in ONNX Runtime before and after `qcal equalize`:
outputs must agree within 1e-4 relative (max |a - b| / max |a|). The residual chain must be
refused with its message; a ReLU6 net is equalized with Clip -> Relu reported, and with
--keep-clip gives the same function. Skips (exit 77, one line) without torch/torchvision,
node or onnxruntime-node ($QCAL_NPM_DIR)."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def skip(why):
    print("ort.equalize: skipped: " + why)
    sys.exit(77)


try:
    import numpy as np
    import torch
    import torch.nn as nn
except ImportError as e:
    skip(str(e))

QCAL = os.environ.get("QCAL_BIN")
if not QCAL:
    skip("QCAL_BIN not set")
if not shutil.which("node"):
    skip("node not found")


def run(*cmd):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode == 77:
        skip(r.stdout.strip())
    if r.returncode != 0:
        raise SystemExit("FAILED (exit %d): %s\n%s%s" % (r.returncode, " ".join(map(str, cmd)), r.stdout[-3000:],
                                                        r.stderr[-3000:]))
    return r


def ort(model, x, out):
    run("node", os.path.join(HERE, "ort_run.cjs"), model, x, "--out", out)
    return np.load(out)


class Net(nn.Module):
    def __init__(self, act, residual):
        super().__init__()
        self.act, self.residual = act, residual
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.dw, self.b2 = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16)
        self.pw, self.b3 = nn.Conv2d(16, 24, 1, bias=False), nn.BatchNorm2d(24)
        self.c4 = nn.Conv2d(24, 24, 3, padding=1)
        self.fc1, self.fc2 = nn.Linear(24, 32), nn.Linear(32, 10)

    def forward(self, x):
        x = self.act(self.b1(self.c1(x)))
        x = self.act(self.b2(self.dw(x)))
        y = self.act(self.b3(self.pw(x)))
        x = torch.relu(self.c4(y)) + (y if self.residual else 0)
        return self.fc2(torch.relu(self.fc1(x.mean((2, 3)))))


def randomize_bn(m, g):
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            n = mod.num_features
            mod.running_mean.copy_(torch.rand(n, generator=g) * 2 - 1)
            mod.running_var.copy_(torch.rand(n, generator=g) * 3 + 0.2)
            mod.weight.data.copy_(torch.randn(n, generator=g) * torch.logspace(-1.5, 1, n)[torch.randperm(n, generator=g)])
            mod.bias.data.copy_(torch.randn(n, generator=g) * 0.5)


def export(m, x, path):
    m.eval()
    torch.onnx.export(m, x, path, opset_version=13, do_constant_folding=False,
                      training=torch.onnx.TrainingMode.PRESERVE, input_names=["input"], output_names=["out"])


def compare(tmp, name, model, x, extra=()):
    xp = os.path.join(tmp, name + "_x.npy")
    np.save(xp, x.numpy())
    eq = os.path.join(tmp, name + "_eq.onnx")
    r = run(QCAL, "equalize", model, "-o", eq, *extra)
    a = ort(model, xp, os.path.join(tmp, name + "_a.npy"))
    b = ort(eq, xp, os.path.join(tmp, name + "_b.npy"))
    err = float(np.abs(a - b).max() / np.abs(a).max())
    i = int(np.abs(a - b).argmax())
    print(f"{name}: {r.stdout.strip().split(': ', 2)[-1]}; max relative difference {err:.3g}")
    if not err <= 1e-4:
        raise SystemExit(f"{name}: equalized output differs by {err:.3g} relative (worst index {i}: "
                         f"{a.flat[i]} vs {b.flat[i]})")
    return r


def dead_constants(path):
    """Outputs of Constant nodes (and of the Cast / Identity torch.onnx puts between a Constant
    and a Clip) and initializers no node and no graph output reads (python3-onnx)."""
    try:
        import onnx
    except ImportError:
        print("ort.equalize: unread-constant check skipped: no onnx")
        return []
    g = onnx.load(path).graph
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    return [n.output[0] for n in g.node if n.op_type in ("Constant", "Cast", "Identity") and n.output[0] not in read] + \
           [t.name for t in g.initializer if t.name not in read]


def main():
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(2):
            g = torch.Generator().manual_seed(seed)
            torch.manual_seed(seed)
            residual = seed % 2 == 1
            m = Net(torch.relu, residual)
            randomize_bn(m, g)
            x = torch.randn(4, 3, 12, 12, generator=g)
            path = os.path.join(tmp, f"net{seed}.onnx")
            export(m, x, path)
            r = compare(tmp, f"net{seed}", path, x)
            assert "3 BatchNormalizations folded" in r.stdout, r.stdout
            if residual:
                assert "3 chains equalized" in r.stdout, r.stdout
                assert "refused: /Relu_2 (Relu): its output '/Relu_2_output_0' has more than one reader " \
                       "(a residual branch), so /c4/Conv cannot be rescaled alone" in r.stderr, r.stderr
            else:
                assert "4 chains equalized" in r.stdout and "0 chains refused" in r.stdout, r.stdout
        # ReLU6: replaced (reported) by default; --keep-clip refuses and keeps the function
        m = Net(lambda t: torch.clamp(t, 0, 6), False)
        randomize_bn(m, torch.Generator().manual_seed(9))
        x = torch.randn(4, 3, 12, 12)
        path = os.path.join(tmp, "relu6.onnx")
        export(m, x, path)
        r = compare(tmp, "relu6_keep", path, x, ("--keep-clip",))
        assert "would have to become Relu (replacement disabled)" in r.stderr, r.stderr
        r = run(QCAL, "equalize", path, "-o", os.path.join(tmp, "relu6_eq.onnx"))
        assert "note: Clip replaced by Relu: /Clip: Clip(0, 6) -> Relu" in r.stderr, r.stderr
        assert "3 Clips replaced by Relu" in r.stdout, r.stdout
        unread = dead_constants(os.path.join(tmp, "relu6_eq.onnx"))
        assert not unread, "equalize left %d Constants / initializers unread: %s" % (len(unread), unread[:4])
        # a real architecture: torchvision's mobilenet_v2 with ReLU instead of ReLU6
        try:
            import torchvision
        except ImportError:
            print("ort.equalize: mobilenet_v2 part skipped: no torchvision")
            return
        torch.manual_seed(3)
        mb = torchvision.models.mobilenet_v2(width_mult=0.5, num_classes=10)
        for name, mod in list(mb.named_modules()):
            for cname, child in list(mod.named_children()):
                if isinstance(child, nn.ReLU6):
                    setattr(mod, cname, nn.ReLU())
        randomize_bn(mb, torch.Generator().manual_seed(4))
        x = torch.randn(2, 3, 32, 32)
        path = os.path.join(tmp, "mobilenet_v2.onnx")
        export(mb, x, path)
        r = compare(tmp, "mobilenet_v2", path, x, ("--report",))
        assert "52 BatchNormalizations folded" in r.stdout, r.stdout
        assert "34 chains equalized" in r.stdout and "0 chains refused" in r.stdout, r.stdout


main()
