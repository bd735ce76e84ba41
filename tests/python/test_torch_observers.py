"""qcal.torch: drop-in torch.ao observers (suite python; needs python3-torch)."""
import copy
import io
import os
import subprocess
import sys
import tempfile
import unittest
import warnings

import numpy as np

try:
    import torch
    from torch.ao.quantization import observer as tob
except ImportError:  # meson treats exit code 77 as "skipped"
    print("skipped: PyTorch (python3-torch) is not installed")
    sys.exit(77)

import qcal
import qcal.torch as qt

warnings.filterwarnings("ignore", message=".*reduce_range will be deprecated.*")

PAIRS = [
    (qt.MinMaxObserver, tob.MinMaxObserver, {}),
    (qt.MinMaxObserver, tob.MinMaxObserver, dict(reduce_range=True)),
    (qt.MinMaxObserver, tob.MinMaxObserver,
     dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)),
    (qt.MinMaxObserver, tob.MinMaxObserver, dict(quant_min=0, quant_max=15)),
    (qt.MovingAverageMinMaxObserver, tob.MovingAverageMinMaxObserver,
     dict(averaging_constant=0.1)),
    (qt.PerChannelMinMaxObserver, tob.PerChannelMinMaxObserver,
     dict(ch_axis=1, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)),
    (qt.PerChannelMinMaxObserver, tob.PerChannelMinMaxObserver,
     dict(ch_axis=0, qscheme=torch.per_channel_affine_float_qparams)),
    (qt.MovingAveragePerChannelMinMaxObserver, tob.MovingAveragePerChannelMinMaxObserver,
     dict(ch_axis=1)),
]


def batches(seed=0, n=4, shape=(4, 8, 5, 5)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) * (1 + i) + 0.3 * i for i in range(n)]


class MinMaxParity(unittest.TestCase):
    def test_same_qparams_and_buffers_as_pytorch(self):
        for Q, T, kw in PAIRS:
            with self.subTest(cls=Q.__name__, **{k: str(v) for k, v in kw.items()}):
                a, b = Q(**kw), T(**kw)
                for x in batches():
                    self.assertIs(a(x), x)
                    b(x)
                sa, za = a.calculate_qparams()
                sb, zb = b.calculate_qparams()
                self.assertEqual(sa.dtype, sb.dtype)
                self.assertEqual(za.dtype, zb.dtype)
                self.assertEqual(sa.shape, sb.shape)
                self.assertTrue(torch.equal(sa, sb), f"{sa} vs {sb}")
                self.assertTrue(torch.equal(za, zb), f"{za} vs {zb}")
                self.assertTrue(torch.equal(a.min_val, b.min_val))
                self.assertTrue(torch.equal(a.max_val, b.max_val))
                self.assertEqual(a.quant_min, b.quant_min)
                self.assertEqual(a.quant_max, b.quant_max)
                self.assertIsInstance(a, tob.ObserverBase)

    def test_empty_observer_like_pytorch(self):
        a = qt.MinMaxObserver()
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            s, z = a.calculate_qparams()
        self.assertEqual(s.tolist(), [1.0])
        self.assertEqual(z.tolist(), [0])
        self.assertEqual(float(a.min_val), float("inf"))
        self.assertEqual(a(torch.empty(0)).numel(), 0)  # empty input skipped, as PyTorch
        self.assertEqual(a.qcal_observer.batches, 0)

    def test_with_args_and_bad_arguments(self):
        f = qt.HistogramObserver.with_args(reduce_range=True, bins=512)
        o1, o2 = f(), f()
        self.assertIsNot(o1, o2)
        self.assertEqual(o1.bins, 512)
        self.assertEqual(o1.quant_max, 127)
        with self.assertRaises(NotImplementedError):
            qt.MinMaxObserver(qscheme=torch.per_channel_affine)
        with self.assertRaises(NotImplementedError):
            qt.PerChannelMinMaxObserver(qscheme=torch.per_tensor_affine)
        with self.assertRaises(NotImplementedError):
            qt.HistogramObserver(dtype=torch.quint4x2)
        with self.assertRaises(NotImplementedError):
            qt.MinMaxObserver(dtype=torch.quint4x2, qscheme=torch.per_tensor_symmetric)
        with self.assertRaises(qcal.Error):
            qt.HistogramObserver(bins=0)
        o = qt.MinMaxObserver()
        with self.assertRaises(TypeError):
            o(torch.arange(10))          # integer tensor
        with self.assertRaises(TypeError):
            o("not a tensor")


class HistogramFamily(unittest.TestCase):
    def test_equals_qcal_observer_and_cli(self):
        xs = batches(1)
        with tempfile.TemporaryDirectory() as d:
            files = []
            for i, x in enumerate(xs):
                p = os.path.join(d, f"b{i}.npy")
                np.save(p, x.numpy())
                files.append(p)
            qbin = os.environ.get("QCAL_BIN")
            for Q, kind, kw, cli in [
                (qt.HistogramObserver, "histogram", {}, []),
                (qt.PercentileObserver, "percentile", dict(percentile=99.9),
                 ["--percentile", "99.9"]),
                (qt.EntropyObserver, "entropy", {}, []),
                (qt.MSEObserver, "mse", dict(dtype=torch.qint8,
                                             qscheme=torch.per_tensor_symmetric),
                 ["--dtype", "qint8", "--qscheme", "per_tensor_symmetric"]),
            ]:
                with self.subTest(kind=kind):
                    o = Q(**kw)
                    ref = qcal.Observer(kind, **{k: (v if not isinstance(v, torch.dtype)
                                                     and not str(v).startswith("torch.")
                                                     else str(v)[6:])
                                                 for k, v in kw.items()})
                    for x in xs:
                        o(x)
                        ref.update(x.numpy())
                    s, z = o.calculate_qparams()
                    rs, rz = ref.qparams()
                    self.assertEqual(s.numpy().tobytes(), rs.tobytes())
                    self.assertEqual(z.tolist(), rz.tolist())
                    if qbin:
                        out = subprocess.run([qbin, "observe", "--observer", kind] + cli + files,
                                             capture_output=True, text=True, check=True).stdout
                        import json
                        j = json.loads(out)
                        self.assertEqual(np.float32(j["scale"][0]), s.item())
                        self.assertEqual(j["zero_point"][0], z.item())

    def test_state_dict_round_trip_and_to(self):
        xs = batches(2)
        for Q in (qt.HistogramObserver, qt.EntropyObserver, qt.PerChannelMinMaxObserver):
            with self.subTest(cls=Q.__name__):
                a = Q() if Q is not qt.PerChannelMinMaxObserver else Q(ch_axis=1)
                for x in xs[:2]:
                    a(x)
                sd = a.state_dict()
                self.assertIn("qcal_state", sd)
                self.assertIn("min_val", sd)
                buf = io.BytesIO()
                torch.save(sd, buf)
                buf.seek(0)
                b = Q() if Q is not qt.PerChannelMinMaxObserver else Q(ch_axis=1)
                b.load_state_dict(torch.load(buf))
                self.assertTrue(torch.equal(a.calculate_qparams()[0], b.calculate_qparams()[0]))
                self.assertTrue(torch.equal(a.min_val, b.min_val))
                # both continue identically
                for x in xs[2:]:
                    a(x)
                    b(x)
                self.assertTrue(torch.equal(a.calculate_qparams()[1], b.calculate_qparams()[1]))
                c = copy.deepcopy(a).to("cpu")
                self.assertTrue(torch.equal(a.calculate_qparams()[0], c.calculate_qparams()[0]))

    def test_load_state_of_other_kind_is_an_error(self):
        a = qt.HistogramObserver()
        a(torch.randn(100))
        b = qt.EntropyObserver()
        with self.assertRaises(RuntimeError) as cm:
            b.load_state_dict(a.state_dict())
        self.assertIn("histogram", str(cm.exception))

    def test_merge_equals_one_observer(self):
        xs = batches(3, n=6)
        whole = qt.HistogramObserver()
        parts = [qt.HistogramObserver(), qt.HistogramObserver()]
        for i, x in enumerate(xs):
            whole(x)
            parts[i % 2](x)
        parts[0].merge(parts[1])
        self.assertTrue(torch.equal(whole.calculate_qparams()[0],
                                    parts[0].calculate_qparams()[0]))


class TensorInputs(unittest.TestCase):
    """Tensors read in place (data_ptr) or converted give the numbers of the contiguous
    float32 numpy copy; bad tensors raise TypeError / qcal.Error, never a crash."""

    def test_layouts_views_and_grad(self):
        g = torch.Generator().manual_seed(11)
        base = torch.randn(4, 6, 5, 3, generator=g)
        variants = {
            "contiguous": base,
            "offset slice": base[1:3],
            "transposed": base.transpose(1, 2),
            "channels_last": base.contiguous(memory_format=torch.channels_last),
            "negated view": torch._neg_view(base),
            "requires_grad": base.clone().requires_grad_(),
            "parameter": torch.nn.Parameter(base.clone()),
            "float64": base.double(),
            "bfloat16": base.bfloat16(),
            "0-d": base[0, 0, 0, 0],
            "expanded": base[:1].expand(3, 6, 5, 3),
        }
        for name, t in variants.items():
            with self.subTest(variant=name):
                want = np.ascontiguousarray(t.detach().resolve_neg().float().numpy())
                for kind, cfg in (("minmax", {}), ("histogram", {}),
                                  ("per_channel_minmax", {"axis": 0})):
                    if t.dim() == 0 and kind == "per_channel_minmax":
                        continue
                    a, b = qcal.Observer(kind, **cfg), qcal.Observer(kind, **cfg)
                    a.update(t)
                    b.update(want)
                    self.assertEqual(a.save(), b.save(), kind)
                self.assertEqual(qcal.sqnr(t.detach(), want), float("inf"))
        o = qt.HistogramObserver()
        x = base.clone().requires_grad_()
        self.assertIs(o(x), x)               # returned as is, graph untouched
        self.assertTrue(x.requires_grad)

    def test_threads_share_an_observer(self):
        """Tensors read in place with the GIL released: 4 threads feeding one qcal.torch
        observer give the serial result (the histogram family does not depend on order)."""
        import threading
        g = torch.Generator().manual_seed(16)
        xs = [torch.randn(1 << 15, generator=g) * (1 + i % 5) for i in range(16)]
        shared, serial = qt.HistogramObserver(), qt.HistogramObserver()
        for x in xs:
            serial(x)
        ts = [threading.Thread(target=lambda c: [shared(x) for x in c], args=(xs[i::4],))
              for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(shared.qcal_observer.batches, 16)
        for u, v in zip(shared.calculate_qparams(), serial.calculate_qparams()):
            self.assertTrue(torch.equal(u, v))
        self.assertTrue(torch.equal(shared.min_val, serial.min_val))

    def test_bad_tensors(self):
        bad = [torch.arange(10), torch.tensor([True]), torch.zeros(3, dtype=torch.cfloat),
               torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8),
               torch.rand(4).to_sparse(), torch.empty(3, device="meta")]
        for t in bad:
            for f in (qcal.Observer("minmax").update, qt.HistogramObserver(),
                      qt.MinMaxObserver(), lambda v: qcal.fake_quant(v, 0.1, 0, 0, 255)):
                with self.subTest(tensor=str(t.dtype) + "/" + str(t.layout) + "/" +
                                  str(t.device), f=repr(f)[:40]):
                    with self.assertRaises(TypeError):
                        f(t)
        o = qt.HistogramObserver()
        for v in (None, "x", b"x", [1.0, "a"]):
            with self.assertRaises((TypeError, ValueError)):
                o(v)
        self.assertEqual(o.qcal_observer.batches, 0)
        self.assertEqual(o(torch.empty(0, 3)).shape, (0, 3))   # empty: skipped (PyTorch)
        nan = torch.full((8,), float("nan"))
        o(nan)                                                 # all NaN: skipped, counted
        self.assertEqual(o.qcal_observer.nonfinite, 8)
        s, z = o.calculate_qparams()
        self.assertEqual((s.item(), z.item()), (1.0, 0))
        strict = qt.HistogramObserver(nonfinite="error")
        with self.assertRaises(qcal.NonFiniteError):
            strict(nan)

    def test_junk_state_in_state_dict(self):
        a = qt.HistogramObserver()
        a(torch.randn(100))
        sd = a.state_dict()
        for junk in (torch.zeros(0, dtype=torch.uint8), torch.arange(50, dtype=torch.uint8),
                     sd["qcal_state"][:-5]):
            with self.subTest(n=junk.numel()):
                b = qt.HistogramObserver()
                bad = dict(sd)
                bad["qcal_state"] = junk
                with self.assertRaises(RuntimeError) as cm:
                    b.load_state_dict(bad)
                self.assertIn("qcal_state", str(cm.exception))
                self.assertEqual(b.qcal_observer.batches, 0)   # unchanged

    def test_buffers_follow_the_observer(self):
        g = torch.Generator().manual_seed(12)
        for Q, kw in ((qt.MinMaxObserver, {}), (qt.HistogramObserver, {}),
                      (qt.PerChannelMinMaxObserver, dict(ch_axis=1))):
            with self.subTest(cls=Q.__name__):
                o = Q(**kw)
                x = torch.randn(4, 3, 5, generator=g)
                o(x)
                dims = (0, 2) if Q is qt.PerChannelMinMaxObserver else None
                lo = x.amin(dim=dims) if dims else x.min()
                hi = x.amax(dim=dims) if dims else x.max()
                self.assertTrue(torch.equal(dict(o.named_buffers())["min_val"], lo))
                self.assertTrue(torch.equal(o.state_dict()["max_val"], hi))
                o(x * 3)
                self.assertTrue(torch.equal(o.max_val, hi * 3))   # resynced
                o.to(torch.float64)                               # buffers change dtype
                o(x * 4)
                self.assertEqual(o.max_val.dtype, torch.float64)
                self.assertTrue(torch.equal(o.max_val, (hi * 4).double()))
                o.reset_min_max_vals()
                self.assertTrue(torch.all(torch.isinf(o.min_val)) or o.min_val.numel() == 0)

    def test_whole_module_pickling(self):
        """torch.save of the module itself (not its state_dict) and deepcopy: the copy has
        its own observer and its buffers follow it."""
        g = torch.Generator().manual_seed(15)
        for Q in (qt.HistogramObserver, qt.PerChannelMinMaxObserver):
            with self.subTest(cls=Q.__name__):
                o = Q()
                x = torch.randn(4, 5, generator=g)
                o(x)
                buf = io.BytesIO()
                torch.save(o, buf)
                buf.seek(0)
                o2 = torch.load(buf)
                self.assertIsNot(o2.qcal_observer, o.qcal_observer)
                self.assertEqual(o2.qcal_observer.save(), o.qcal_observer.save())
                self.assertTrue(torch.equal(o2.min_val, o.min_val))
                def amax(t):
                    return t.max() if Q is qt.HistogramObserver else t.amax(dim=1)
                o2(x * 10)
                self.assertTrue(torch.equal(o2.max_val, amax(x * 10)))
                self.assertTrue(torch.equal(o.max_val, amax(x)))       # original untouched
                o3 = copy.deepcopy(o2)
                o3(x * 100)
                self.assertTrue(torch.equal(o2.max_val, amax(x * 10)))
                self.assertTrue(torch.equal(o3.max_val, amax(x * 100)))

    def test_classes_are_named_qcal_torch(self):
        """The classes live in python/qcal/_torch_observers.py and name qcal.torch as their
        module: type names, reprs, TorchScript names and torch.save pickles say
        qcal.torch.X (as when torch.py defined them), and X is qcal.torch's attribute."""
        import pickletools
        import zipfile
        public = [getattr(qt, n) for n in qt.__all__ if isinstance(getattr(qt, n), type)
                  and n != "ActivationLoggers"]     # (its module: qcal._torch_loggers)
        self.assertEqual(len(public), 10)      # the 8 observers and the 2 fake-quants
        for cls in public + [qt._Buffers, qt._QcalObserver, qt._HistogramFamily,
                             qt.all_reduce_observer]:
            self.assertEqual(cls.__module__, "qcal.torch", cls)
            self.assertIs(getattr(qt, cls.__qualname__), cls)
        self.assertEqual(repr(qt.MSEObserver), "<class 'qcal.torch.MSEObserver'>")
        self.assertEqual(qt.MinMaxObserver._jit_override_qualname,
                         "__torch__.qcal.torch.quantization.observer."
                         "PerChannelMinMaxObserver.MinMaxObserver")

        class Mine(qt.MinMaxObserver):           # a user's subclass keeps its own module
            pass
        self.assertEqual(Mine.__module__, __name__)
        self.assertTrue(Mine._jit_override_qualname.startswith(f"__torch__.{__name__}."))
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(3))
        for n in ("MinMaxObserver", "MovingAveragePerChannelMinMaxObserver",
                  "HistogramObserver", "FusedMovingAvgObsFakeQuantize"):
            with self.subTest(cls=n):
                o = getattr(qt, n)()
                o(x)
                buf = io.BytesIO()
                torch.save(o, buf)
                with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
                    pkl = z.read(next(m for m in z.namelist() if m.endswith("/data.pkl")))
                names = {a.replace(" ", ".") for op, a, _ in
                         pickletools.genops(pkl) if op.name == "GLOBAL" and "qcal" in a}
                want = {"qcal.Observer", f"qcal.torch.{n}", "qcal.torch._Buffers"}
                if n == "FusedMovingAvgObsFakeQuantize":
                    want.add("qcal.torch.MovingAverageMinMaxObserver")
                self.assertEqual(names, want)
                o2 = torch.load(io.BytesIO(buf.getvalue()))
                self.assertIs(type(o2), type(o))
                self.assertEqual(list(o2.state_dict()), list(o.state_dict()))
                for a, b in zip(o2.calculate_qparams(), o.calculate_qparams()):
                    self.assertTrue(torch.equal(a, b))

    def test_no_import_circle(self):
        """_torch_observers imports neither qcal.torch nor _torch_qat; _torch_qat imports
        _torch_observers, not qcal.torch (issue 33: qcal.torch is the facade over them)."""
        for mod, absent in (("qcal._torch_observers", ["qcal.torch", "qcal._torch_qat",
                                                        "qcal._torch_loggers"]),
                            ("qcal._torch_qat", ["qcal.torch", "qcal._torch_loggers"]),
                            ("qcal._torch_loggers", ["qcal.torch", "qcal._torch_qat",
                                                     "qcal._torch_observers"])):
            with self.subTest(mod=mod):
                out = subprocess.run(
                    [sys.executable, "-c", f"import sys, {mod}; print(sorted(m for m in "
                     "sys.modules if m.startswith('qcal')))"],
                    capture_output=True, text=True, check=True).stdout
                loaded = eval(out)
                self.assertIn(mod, loaded)
                for m in absent:
                    self.assertNotIn(m, loaded)

    def test_grid(self):
        xs = batches(4)
        for Q in (qt.HistogramObserver, qt.PercentileObserver, qt.EntropyObserver,
                  qt.MSEObserver):
            for grid in ("lattice", "first_batch", "first-batch"):
                with self.subTest(cls=Q.__name__, grid=grid):
                    o = Q(grid=grid)
                    self.assertEqual(o.grid, grid)
                    self.assertEqual(o.qcal_observer.config["grid"], grid.replace("-", "_"))
                    ref = qcal.Observer(o._kind, grid=grid)
                    for x in xs:
                        o(x)
                        ref.update(x.numpy())
                    s, z = o.calculate_qparams()
                    self.assertEqual(s.numpy().tobytes(), ref.qparams()[0].tobytes())
                    self.assertEqual(z.item(), int(ref.qparams()[1][0]))
            with self.assertRaises(qcal.Error):
                Q(grid="hexagonal")
        f = qt.HistogramObserver.with_args(grid="first_batch", bins=256)
        self.assertEqual(f().grid, "first_batch")
        # the two grids differ on data whose range grows (the point of the lattice)
        a, b = qt.HistogramObserver(grid="lattice"), qt.HistogramObserver(grid="first_batch")
        for x in xs:
            a(x)
            b(x)
        self.assertNotEqual(a.qcal_observer.save(), b.qcal_observer.save())


class LearnableVsTorch(unittest.TestCase):
    """qcal.fake_quant_learnable(_backward) against torch._fake_quantize_learnable_per_*:
    y and grad_x bit-identical; grad_scale / grad_zero_point within 2e-6 of the sum of the
    |terms| (PyTorch sums in float, qcal in double over fixed blocks). NaN-free data (the
    NaN policies differ by design, see docs/fakequant.md); zero points >= 0 (PyTorch 1.13's
    per-tensor backward rounds negative ones differently from its forward)."""

    def check(self, name, got, want, terms):
        tol = 2e-6 * float(terms) + 1e-12
        self.assertLessEqual(abs(float(got) - float(want)), tol,
                             f"{name}: qcal {got} torch {want} (tolerance {tol})")

    def test_per_tensor(self):
        g = torch.Generator().manual_seed(13)
        x = torch.randn(5000, generator=g) * 3
        dy = torch.randn(5000, generator=g)
        for s, z, lo, hi, gf in [(0.05, 10.3, 0, 255, 1.0), (0.02, 127.6, 0, 255, 0.25),
                                 (0.1, 0.0, -128, 127, 1.0), (0.03, 3.0, 0, 15, 0.5),
                                 (0.004, 2.2, 0, 255, 1 / (5000 * 255) ** 0.5)]:
            with self.subTest(scale=s, zero_point=z, qrange=(lo, hi)):
                xs = x.clone().requires_grad_()
                st = torch.tensor([s], requires_grad=True)
                zt = torch.tensor([z], requires_grad=True)
                y = torch._fake_quantize_learnable_per_tensor_affine(xs, st, zt, lo, hi, gf)
                y.backward(dy)
                yq = qcal.fake_quant_learnable(x, s, z, lo, hi)
                gx, gs, gz = qcal.fake_quant_learnable_backward(x, dy, s, z, lo, hi,
                                                                grad_factor=gf)
                self.assertEqual(yq.tobytes(), y.detach().numpy().tobytes())
                self.assertEqual(gx.tobytes(), xs.grad.numpy().tobytes())
                terms = (dy.abs() * (x.abs() + 300 * s)).sum() * gf / s
                self.check("grad_scale", gs[0], st.grad[0], terms)
                self.check("grad_zero_point", gz[0], zt.grad[0], dy.abs().sum() * s * gf)

    def test_per_channel(self):
        g = torch.Generator().manual_seed(14)
        for axis, shape in ((1, (4, 6, 5)), (0, (8, 3, 3, 3)), (-1, (10, 7))):
            with self.subTest(axis=axis, shape=shape):
                x = torch.randn(*shape, generator=g) * 2
                dy = torch.randn(*shape, generator=g)
                ch = shape[axis]
                sc = torch.rand(ch, generator=g) * 0.05 + 0.01
                zc = torch.rand(ch, generator=g) * 200
                xs, st, zt = (x.clone().requires_grad_(), sc.clone().requires_grad_(),
                              zc.clone().requires_grad_())
                y = torch._fake_quantize_learnable_per_channel_affine(
                    xs, st, zt, axis % x.dim(), 0, 255, 0.5)
                y.backward(dy)
                yq = qcal.fake_quant_learnable(x, sc, zc, 0, 255, axis=axis)
                gx, gs, gz = qcal.fake_quant_learnable_backward(x, dy, sc, zc, 0, 255,
                                                                axis=axis, grad_factor=0.5)
                self.assertEqual(yq.tobytes(), y.detach().numpy().tobytes())
                self.assertEqual(gx.tobytes(), xs.grad.numpy().tobytes())
                self.assertEqual(gs.shape, (ch,))
                for c in range(ch):
                    terms = float(dy.abs().sum()) * (float(x.abs().max()) / float(sc[c]) + 300)
                    self.check(f"grad_scale[{c}]", gs[c], st.grad[c], terms)
                    self.check(f"grad_zero_point[{c}]", gz[c], zt.grad[c],
                               float(dy.abs().sum()) * float(sc[c]))
                self.assertTrue(torch.any(zt.grad != 0))   # some values were clamped


DIST_KINDS = ("HistogramObserver", "MinMaxObserver", "MovingAverageMinMaxObserver")


def _dist_worker(rank, world, store, out_dir):
    """One torch.distributed rank (gloo, file store): for each class of DIST_KINDS, its share
    of the batches into an observer, then qcal.torch.all_reduce_observer; writes the state
    bytes and qparams (or the error) of each."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=world)
    try:
        out = {}
        for name in DIST_KINDS:
            o = getattr(qt, name)()
            for i, x in enumerate(batches(21, n=6)):
                if i % world == rank:
                    o(x)
            try:
                qt.all_reduce_observer(o)
                out[name] = {"state": o.qcal_observer.save(),
                             "scale": o.calculate_qparams()[0].tolist(),
                             "min_val": o.min_val.tolist()}
            except qcal.Error as e:
                out[name] = {"error": str(e)}
        with open(os.path.join(out_dir, f"rank{rank}.pt"), "wb") as f:
            torch.save(out, f)
    finally:
        dist.destroy_process_group()


class Distributed(unittest.TestCase):
    """all_reduce_observer across 2 gloo ranks (processes): every rank ends with the state
    of one observer fed every batch (commuting kinds); moving averages refused."""

    def test_all_reduce(self):
        import torch.multiprocessing as mp
        with tempfile.TemporaryDirectory() as d:
            mp.spawn(_dist_worker, args=(2, os.path.join(d, "store"), d), nprocs=2,
                     join=True)
            ranks = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(2)]
        for name in ("HistogramObserver", "MinMaxObserver"):
            with self.subTest(cls=name):
                whole = getattr(qt, name)()
                for x in batches(21, n=6):
                    whole(x)
                for r in ranks:
                    self.assertNotIn("error", r[name])
                    self.assertEqual(r[name]["scale"], whole.calculate_qparams()[0].tolist())
                    self.assertEqual(r[name]["min_val"], whole.min_val.tolist())
                # identical states on both ranks (batch counts included)
                self.assertEqual(ranks[0][name]["state"], ranks[1][name]["state"])
                self.assertEqual(qcal.Observer.load(ranks[0][name]["state"]).batches, 6)
        for r in ranks:      # two non-empty moving averages: merge refused on every rank
            self.assertIn("error", r["MovingAverageMinMaxObserver"])
            self.assertIn("moving", r["MovingAverageMinMaxObserver"]["error"].lower())


class FxPtq(unittest.TestCase):
    """prepare_fx / convert_fx with qcal.torch's min/max observers give the same converted
    model as with PyTorch's own."""

    def model(self):
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(16 * 5 * 5, 10)).eval()

    def convert(self, act, weight, data):
        from torch.ao.quantization import QConfig, QConfigMapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
        qmap = QConfigMapping().set_global(QConfig(activation=act, weight=weight))
        m = prepare_fx(self.model(), qmap, example_inputs=(data[0],))
        with torch.no_grad():
            for x in data:
                m(x)
        return convert_fx(m)

    def test_same_converted_model(self):
        torch.backends.quantized.engine = "onednn" if "onednn" in \
            torch.backends.quantized.supported_engines else "qnnpack"
        g = torch.Generator().manual_seed(5)
        data = [torch.rand(8, 1, 28, 28, generator=g) for _ in range(4)]
        wkw = dict(dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
        ours = self.convert(qt.MinMaxObserver.with_args(reduce_range=False),
                            qt.PerChannelMinMaxObserver.with_args(**wkw), data)
        ref = self.convert(tob.MinMaxObserver.with_args(reduce_range=False),
                           tob.PerChannelMinMaxObserver.with_args(**wkw), data)
        sa, sb = ours.state_dict(), ref.state_dict()
        self.assertEqual(sorted(sa), sorted(sb))
        compared = 0
        for k in sa:
            a, b = sa[k], sb[k]
            if isinstance(a, torch.Tensor) and a.is_quantized:
                self.assertTrue(torch.equal(a.int_repr(), b.int_repr()), k)
                self.assertTrue(torch.equal(a.q_per_channel_scales(), b.q_per_channel_scales()), k)
                compared += 1
            elif isinstance(a, torch.Tensor):
                self.assertTrue(torch.equal(a, b), k)
                compared += 1
            elif isinstance(a, tuple):  # packed params: (weight, bias)
                for u, v in zip(a, b):
                    if isinstance(u, torch.Tensor) and u.is_quantized:
                        self.assertTrue(torch.equal(u.int_repr(), v.int_repr()), k)
                    elif isinstance(u, torch.Tensor):
                        self.assertTrue(torch.equal(u, v), k)
                compared += 1
        self.assertGreater(compared, 6)
        x = torch.rand(16, 1, 28, 28, generator=g)
        with torch.no_grad():
            self.assertTrue(torch.equal(ours(x), ref(x)))

    def test_histogram_observer_in_fx(self):
        from torch.ao.quantization import QConfig, QConfigMapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
        g = torch.Generator().manual_seed(6)
        data = [torch.rand(8, 1, 28, 28, generator=g) for _ in range(3)]
        qmap = QConfigMapping().set_global(QConfig(
            activation=qt.HistogramObserver.with_args(reduce_range=True),
            weight=qt.PerChannelMinMaxObserver.with_args(
                dtype=torch.qint8, qscheme=torch.per_channel_symmetric)))
        m = prepare_fx(self.model(), qmap, example_inputs=(data[0],))
        with torch.no_grad():
            for x in data:
                m(x)
        q = convert_fx(m)
        with torch.no_grad():
            f = self.model()(data[0])
            y = q(data[0])
        self.assertGreater(qcal.sqnr(f.numpy(), y.numpy()), 15.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
