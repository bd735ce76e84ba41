"""qcal.torch's fake-quant modules, default objects and qconfig helpers against torch 1.13
(suite python; needs python3-torch): FusedMovingAvgObsFakeQuantize equals torch's fused
kernel bit for bit, and the qconfig helpers build the same modules on qcal's classes."""
import copy
import sys
import unittest
import warnings

try:
    import torch
    import torch.ao.quantization as tq
except ImportError:  # meson treats exit code 77 as "skipped"
    print("skipped: PyTorch (python3-torch) is not installed")
    sys.exit(77)

import qcal.torch as qt

warnings.filterwarnings("ignore", message=".*reduce_range will be deprecated.*")


def equal(tc, a, b, what):
    tc.assertEqual(a.dtype, b.dtype, what)
    tc.assertEqual(a.shape, b.shape, what)
    if not torch.equal(a, b):
        d = (a.double() - b.double()).abs().reshape(-1)
        i = int(d.argmax())
        tc.fail(f"{what}: worst element {i}: {a.reshape(-1)[i]} != {b.reshape(-1)[i]}")


FUSED = [
    ({}, False),
    (dict(quant_min=-128, quant_max=127, dtype=torch.qint8,
          qscheme=torch.per_tensor_symmetric), False),
    (dict(reduce_range=True, averaging_constant=0.3), False),
    (dict(quant_min=0, quant_max=15), False),
    (dict(quant_min=-128, quant_max=127, dtype=torch.qint8,
          qscheme=torch.per_channel_symmetric), True),
    (dict(quant_min=0, quant_max=255, averaging_constant=0.5), True),
]


def data(step, g, shape=(6, 9)):
    kind = step % 6
    x = torch.randn(*shape, generator=g) * (1 + step) + step * 0.3
    if kind == 3:
        x = x.abs() + 0.5                 # all positive: the range is extended to 0
    elif kind == 4:
        x = torch.full(shape, -2.5)       # constant negative
    elif kind == 5:
        x = x * 1e-7                      # scale below ATen's SMALL_SCALE_THRESHOLD
    return x


class TestFused(unittest.TestCase):
    def run_pair(self, kw, per_channel, script, steps=14):
        g = torch.Generator().manual_seed(7)
        qkw, tkw = dict(kw), dict(kw)
        if per_channel:
            qkw["observer"] = qt.MovingAveragePerChannelMinMaxObserver
            tkw["observer"] = tq.MovingAveragePerChannelMinMaxObserver
        a = qt.FusedMovingAvgObsFakeQuantize(**qkw)
        b = tq.FusedMovingAvgObsFakeQuantize(**tkw)
        if script:
            a = torch.jit.script(a)
        for i in range(steps):
            x = data(i, g)
            # observer and fake-quant switched on and off (qparams follow the kernel: they
            # change only while fake-quant is on)
            for m in (a, b):
                m.observer_enabled[0] = int(i % 5 != 2)
                m.fake_quant_enabled[0] = int(i % 4 != 1)
            xa = x.clone().requires_grad_()
            xb = x.clone().requires_grad_()
            ya, yb = a(xa), b(xb)
            what = f"{kw} per_channel={per_channel} script={script} step {i}"
            equal(self, ya, yb, what + " output")
            equal(self, a.scale, b.scale, what + " scale")
            equal(self, a.zero_point, b.zero_point, what + " zero_point")
            equal(self, a.activation_post_process.min_val, b.activation_post_process.min_val,
                  what + " min_val")
            equal(self, a.activation_post_process.max_val, b.activation_post_process.max_val,
                  what + " max_val")
            (ya * x).sum().backward()
            (yb * x).sum().backward()
            equal(self, xa.grad, xb.grad, what + " grad")
        qa, qb = a.calculate_qparams(), b.calculate_qparams()
        equal(self, qa[0], qb[0], "calculate_qparams scale")

    def test_same_as_torch(self):
        for kw, per_channel in FUSED:
            for script in (False, True):
                with self.subTest(kw=kw, per_channel=per_channel, script=script):
                    self.run_pair(kw, per_channel, script)

    def test_scripted_switches(self):
        # torch.ao's enable/disable functions find scripted qcal fake-quant modules
        x = torch.randn(5, 7)
        for cls, ref in ((qt.FusedMovingAvgObsFakeQuantize, tq.FusedMovingAvgObsFakeQuantize),
                         (qt.FakeQuantize, tq.FakeQuantize)):
            a, b = torch.jit.script(cls()), torch.jit.script(ref())
            for m in (a, b):
                m(x)
                tq.disable_observer(m)
                tq.disable_fake_quant(m)
            self.assertEqual(int(a.observer_enabled[0]), 0, cls.__name__)
            self.assertEqual(int(a.fake_quant_enabled[0]), 0, cls.__name__)
            y = x * 3
            equal(self, a(y), b(y), cls.__name__ + " both off")
            for m in (a, b):
                tq.enable_fake_quant(m)
            equal(self, a(y), b(y), cls.__name__ + " fake-quant on, observer off")

        class Sub(qt.FakeQuantize):
            pass
        self.assertNotEqual(torch.jit.script(Sub())._c.qualified_name.split(".")[-1],
                            "FakeQuantize")

    def test_checks_like_torch(self):
        with self.assertRaisesRegex(AssertionError, "only works with MovingAverage"):
            qt.FusedMovingAvgObsFakeQuantize(observer=qt.MinMaxObserver)
        m = qt.FusedMovingAvgObsFakeQuantize(quant_min=0, quant_max=255, dtype=torch.quint8,
                                             reduce_range=True)
        self.assertEqual((m.activation_post_process.quant_min,
                          m.activation_post_process.quant_max), (0, 127))
        m = qt.FusedMovingAvgObsFakeQuantize()
        m.observer_enabled[0] = 0              # fake-quant before any data: torch's error
        with self.assertRaisesRegex(RuntimeError, "min should be less than or equal"):
            m(torch.randn(4))
        self.assertEqual(m(torch.zeros(0)).numel(), 0)
        tq.disable_observer(m)
        tq.disable_fake_quant(m)
        x = torch.randn(3)
        y = m(x)
        self.assertTrue(torch.equal(x, y) and y is not x)

    def test_state_dict_and_deepcopy(self):
        m = qt.FusedMovingAvgObsFakeQuantize()
        m(torch.randn(20))
        n = qt.FusedMovingAvgObsFakeQuantize()
        n.load_state_dict(m.state_dict())
        c = copy.deepcopy(m)
        x = torch.randn(20)
        y = m(x)
        equal(self, n(x), y, "loaded")
        equal(self, c(x), y, "deepcopy")


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv = torch.nn.Conv2d(2, 4, 3)
        self.relu = torch.nn.ReLU()
        self.fc = torch.nn.Linear(36, 3)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.relu(self.conv(self.quant(x)))
        return self.dequant(self.fc(x.flatten(1)))


class TestQconfigs(unittest.TestCase):
    def classes(self, model):
        return sorted(f"{n}:{type(m).__name__}" for n, m in model.named_modules()
                      if "activation_post_process" in n or "fake_quant" in n)

    def test_qat_same_modules_and_numbers(self):
        g = torch.Generator().manual_seed(3)
        for backend in ("fbgemm", "qnnpack"):
            for version in (0, 1):
                with self.subTest(backend=backend, version=version):
                    torch.manual_seed(0)
                    base = TinyModel().train()
                    models = []
                    for get in (qt.get_default_qat_qconfig, tq.get_default_qat_qconfig):
                        m = copy.deepcopy(base)
                        m.qconfig = get(backend, version)
                        models.append(tq.prepare_qat(m))
                    a, b = models
                    self.assertEqual(self.classes(a), self.classes(b))
                    for n, mod in a.named_modules():
                        if n.endswith("weight_fake_quant"):
                            self.assertTrue(type(mod).__module__ == "qcal.torch", n)
                            self.assertTrue(type(mod.activation_post_process).__module__
                                            == "qcal.torch", n)
                    for step in range(6):
                        x = torch.randn(2, 2, 5, 5, generator=g) * (step + 1)
                        if step == 3:
                            a.apply(tq.disable_observer)
                            b.apply(tq.disable_observer)
                        if step == 4:
                            a.apply(tq.disable_fake_quant)
                            b.apply(tq.disable_fake_quant)
                        if step == 5:
                            a.apply(tq.enable_fake_quant)
                            b.apply(tq.enable_fake_quant)
                        equal(self, a(x), b(x), f"{backend} v{version} step {step}")
                    a.eval()
                    b.eval()
                    qa = tq.convert(a)
                    qb = tq.convert(b)
                    x = torch.rand(2, 2, 5, 5, generator=g)
                    equal(self, qa(x), qb(x), f"{backend} v{version} converted")

    def test_ptq_qconfig_and_mappings(self):
        for backend in ("fbgemm", "qnnpack", "x86"):
            qc = qt.get_default_qconfig(backend)
            ref = tq.get_default_qconfig(backend)
            a, b = qc.activation(), ref.activation()
            self.assertIsInstance(a, qt.HistogramObserver)
            self.assertEqual(a.grid, "torch")
            self.assertEqual((a.quant_min, a.quant_max, a.reduce_range, a.dtype),
                             (b.quant_min, b.quant_max, b.reduce_range, b.dtype))
            g = torch.Generator().manual_seed(5)
            for i in range(3):                 # torch's numbers (grid="torch")
                x = torch.randn(300, generator=g) * (i + 1) + 0.5 * i
                a(x)
                b(x)
            for u, v in zip(a.calculate_qparams(), b.calculate_qparams()):
                equal(self, u, v, backend + " activation qparams")
            w, wr = qc.weight(), ref.weight()
            self.assertEqual(type(w).__name__, type(wr).__name__)
            self.assertEqual(type(w).__module__, "qcal.torch")
            x = torch.randn(8, 5)
            w(x)
            wr(x)
            for u, v in zip(w.calculate_qparams(), wr.calculate_qparams()):
                equal(self, u, v, backend + " weight qparams")
            for get, ref_get in ((qt.get_default_qconfig_mapping,
                                  tq.get_default_qconfig_mapping),
                                 (qt.get_default_qat_qconfig_mapping,
                                  tq.get_default_qat_qconfig_mapping)):
                m, r = get(backend), ref_get(backend)
                self.assertEqual(list(m.object_type_qconfigs), list(r.object_type_qconfigs))
                act = m.global_qconfig.activation()
                self.assertEqual(type(act).__module__, "qcal.torch")
                fixed = m.object_type_qconfigs[torch.nn.Sigmoid]
                # fixed-qparams observers stay torch's
                self.assertIs(fixed.activation.p.func,
                              r.object_type_qconfigs[torch.nn.Sigmoid].activation.p.func)

    def test_default_objects(self):
        self.assertIsInstance(qt.default_observer(), qt.MinMaxObserver)
        self.assertEqual(qt.default_observer().quant_max, tq.default_observer().quant_max)
        self.assertIsInstance(qt.default_per_channel_weight_observer(),
                              qt.PerChannelMinMaxObserver)
        fq = qt.default_fused_per_channel_wt_fake_quant()
        self.assertIsInstance(fq, qt.FusedMovingAvgObsFakeQuantize)
        self.assertIsInstance(fq.activation_post_process,
                              qt.MovingAveragePerChannelMinMaxObserver)
        self.assertIsInstance(qt.default_fake_quant(), qt.FakeQuantize)
        self.assertIsInstance(qt.default_qat_qconfig.weight().activation_post_process,
                              qt.MovingAverageMinMaxObserver)
        x = torch.randn(4, 6)
        a, b = qt.default_weight_fake_quant(), tq.default_weight_fake_quant()
        equal(self, a(x), b(x), "default_weight_fake_quant")


if __name__ == "__main__":
    unittest.main()
