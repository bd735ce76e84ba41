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
            qt.MinMaxObserver(dtype=torch.quint4x2)
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
