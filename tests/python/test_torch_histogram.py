"""qcal.torch.HistogramObserver(grid="torch") against the live torch.ao HistogramObserver
(histogram buffer, min_val, max_val, scale, zero-point after every batch, bit for bit),
`histogram`, torch.ao state_dicts loaded into qcal.torch observers, and the docs' PyTorch
numbers (tests/data/docs/pytorch_numbers.txt) against the live torch."""
import os
import sys
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
warnings.simplefilter("ignore")


def bits(t):
    return t.detach().contiguous().numpy().view(np.uint32)


class TorchGrid(unittest.TestCase):
    def run_pair(self, batches, **kw):
        t = tob.HistogramObserver(**kw)
        q = qt.HistogramObserver(grid="torch", **kw)
        for j, x in enumerate(batches):
            xt = torch.from_numpy(x)
            t(xt)
            q(xt)
            where = f"batch {j} of {len(batches)} ({kw})"
            self.assertTrue(np.array_equal(bits(q.histogram), bits(t.histogram)), where)
            self.assertEqual(q.min_val.item(), t.min_val.item(), where)
            self.assertEqual(q.max_val.item(), t.max_val.item(), where)
            (s1, z1), (s2, z2) = q.calculate_qparams(), t.calculate_qparams()
            self.assertEqual(s1.item(), s2.item(), where)
            self.assertEqual(int(z1.item()), int(z2.item()), where)
        return q, t

    def test_sequences_both_orders(self):
        rng = np.random.default_rng(25)
        cases = 0
        for trial in range(6):
            n = int(rng.integers(100, 20000))
            scales = rng.uniform(0.05, 8.0, size=int(rng.integers(2, 6)))
            shifts = rng.uniform(-2.0, 2.0, size=scales.size)
            kind = trial % 3
            batches = []
            for s, m in zip(scales, shifts):
                x = rng.standard_normal(n) * s + m
                if kind == 1:
                    x = np.maximum(x, 0)
                elif kind == 2:
                    x = rng.standard_t(1.5, n) * s
                batches.append(x.astype(np.float32))
            for order in (batches, batches[::-1]):
                for kw in (dict(), dict(bins=255), dict(bins=100, dtype=torch.qint8,
                                                        qscheme=torch.per_tensor_symmetric)):
                    self.run_pair(order, **kw)
                    cases += 1
        self.assertEqual(cases, 36)

    def test_order_dependence_reproduced(self):
        rng = np.random.default_rng(7)
        a = (rng.standard_normal(5000) * 1.0).astype(np.float32)
        b = (rng.standard_normal(5000) * 4.0).astype(np.float32)
        q1, _ = self.run_pair([a, b])
        q2, _ = self.run_pair([b, a])
        # PyTorch's answer depends on the order; so does grid="torch" (same numbers).
        self.assertNotEqual(q1.max_val.item(), q2.max_val.item())

    def test_quint8_symmetric_reduce_range(self):
        kw = dict(dtype=torch.quint8, qscheme=torch.per_tensor_symmetric, reduce_range=True)
        rng = np.random.default_rng(3)
        q, t = self.run_pair([rng.standard_normal(3000).astype(np.float32)], **kw)
        self.assertEqual((q.quant_min, q.quant_max), (0, 127))
        # grid="torch": PyTorch's numbers, zero-point 128 outside [0, 127] included.
        self.assertEqual(int(q.calculate_qparams()[1].item()), 128)
        self.assertEqual(int(t.calculate_qparams()[1].item()), 128)
        sq = torch.jit.script(q)
        self.assertEqual(int(sq.calculate_qparams()[1].item()), 128)
        lat = qt.HistogramObserver(**kw)   # the lattice accepts it too, zero-point 64
        lat(torch.tensor([-1.0, 0.5, 3.0]))
        z = lat.calculate_qparams()[1]
        self.assertEqual(int(z.item()), 64)
        o = qcal.Observer("histogram", dtype="quint8", qscheme="per_tensor_symmetric",
                          reduce_range=True)
        o.update(np.array([-1.0, 0.5, 3.0], np.float32))
        self.assertEqual(int(o.qparams()[1][0]), 64)
        with self.assertRaises(NotImplementedError):
            qt.MinMaxObserver(**kw)
        with self.assertRaises(NotImplementedError):
            tob.MinMaxObserver(**kw)

    def test_upsample_rate_and_merge(self):
        with self.assertRaises(NotImplementedError):
            qt.HistogramObserver(grid="torch", upsample_rate=64)
        a, b = qt.HistogramObserver(grid="torch"), qt.HistogramObserver(grid="torch")
        a(torch.randn(100))
        b(torch.randn(100))
        with self.assertRaises(qcal.Error):
            a.merge(b)
        e = qt.HistogramObserver(grid="torch")
        e.merge(a)   # an empty side: a copy
        self.assertTrue(torch.equal(e.histogram, a.histogram))
        with self.assertRaises(qcal.Error):
            qt.PercentileObserver(grid="torch")

    def test_numpy_api(self):
        x = np.linspace(-3, 5, 1001, dtype=np.float32)
        o = qcal.Observer("histogram", grid="torch")
        o.update(x)
        t = tob.HistogramObserver()
        t(torch.from_numpy(x))
        s, z = o.qparams()
        self.assertEqual(s[0], t.calculate_qparams()[0].item())
        self.assertEqual(qcal.Observer.load(o.save()).qparams()[0][0], s[0])


class Histogram(unittest.TestCase):
    def test_lattice_histogram(self):
        o = qt.HistogramObserver(bins=16)
        self.assertEqual(o.histogram.shape, (16,))
        self.assertEqual(float(o.histogram.sum()), 0.0)
        x = torch.randn(5000)
        o(x)
        h, e = o.histogram, o.histogram_edges()
        self.assertEqual(h.shape, (16,))
        self.assertEqual(e.shape, (17,))
        self.assertEqual(float(h.sum()), 5000.0)
        self.assertEqual(e[0].item(), x.min().item())
        self.assertEqual(e[-1].item(), x.max().item())

    def test_torch_edges(self):
        o = qt.HistogramObserver(bins=8, grid="torch")
        self.assertEqual(o.histogram_edges().numel(), 0)
        o(torch.tensor([0.5, 1.0, 2.5, 3.0]))
        e = o.histogram_edges()
        self.assertEqual((e[0].item(), e[-1].item()), (0.5, 3.0))


class StateDicts(unittest.TestCase):
    def test_histogram_from_torch(self):
        t = tob.HistogramObserver()
        t(torch.randn(3000))
        t(torch.randn(3000) * 3)
        q = qt.HistogramObserver(grid="torch")
        q.load_state_dict(t.state_dict())   # strict: torch.ao's keys are accepted
        self.assertEqual(q.calculate_qparams(), t.calculate_qparams())
        # and it goes on as torch does
        x = torch.randn(3000) * 5
        t(x)
        q(x)
        self.assertTrue(torch.equal(q.histogram, t.histogram))
        self.assertEqual(q.calculate_qparams(), t.calculate_qparams())

    def test_histogram_refused_on_lattice(self):
        t = tob.HistogramObserver()
        t(torch.randn(100))
        for grid in ("lattice", "first_batch"):
            with self.assertRaisesRegex(RuntimeError, "grid='torch'"):
                qt.HistogramObserver(grid=grid).load_state_dict(t.state_dict())
        with self.assertRaises(RuntimeError):
            qt.PercentileObserver().load_state_dict(t.state_dict(), strict=False)

    def test_minmax_family(self):
        x1, x2 = torch.tensor([-1.0, 3.0]), torch.tensor([-2.0, 1.0])
        srcs = [tob.MinMaxObserver(), tob.MovingAverageMinMaxObserver()]
        for s in srcs:
            s(x1)
            s(x2)
        for s in srcs:
            for qcls, tcls in ((qt.MinMaxObserver, tob.MinMaxObserver),
                               (qt.MovingAverageMinMaxObserver,
                                tob.MovingAverageMinMaxObserver)):
                q, t = qcls(), tcls()
                q.load_state_dict(s.state_dict(), strict=False)
                t.load_state_dict(s.state_dict(), strict=False)
                self.assertEqual(q.calculate_qparams(), t.calculate_qparams(),
                                 f"{type(s).__name__} -> {qcls.__name__}")
                # and the next batch continues as torch's
                q(x1 * 2)
                t(x1 * 2)
                self.assertEqual(q.calculate_qparams(), t.calculate_qparams())
        # qcal's own states across the family
        a = qt.MovingAverageMinMaxObserver()
        a(x1)
        b = qt.MinMaxObserver()
        b.load_state_dict(a.state_dict())
        self.assertEqual(b.calculate_qparams(), a.calculate_qparams())
        # per channel
        pc = tob.PerChannelMinMaxObserver()
        pc(torch.randn(3, 4))
        q = qt.MovingAveragePerChannelMinMaxObserver()
        q.load_state_dict(pc.state_dict(), strict=False)
        s1, z1 = q.calculate_qparams()
        s2, z2 = pc.calculate_qparams()
        self.assertTrue(torch.equal(s1, s2) and torch.equal(z1.long(), z2.long()))
        # an empty torch observer's state: empty, default qparams with the warning
        q = qt.MinMaxObserver()
        q.load_state_dict(tob.MinMaxObserver().state_dict(), strict=False)
        self.assertEqual(q.calculate_qparams()[0].item(), 1.0)


class Quint4x2(unittest.TestCase):
    def test_min_max_observers(self):
        x = torch.randn(6, 16) * 3
        cases = [(tob.PerChannelMinMaxObserver, qt.PerChannelMinMaxObserver,
                  dict(qscheme=torch.per_channel_affine_float_qparams)),
                 (tob.MovingAveragePerChannelMinMaxObserver,
                  qt.MovingAveragePerChannelMinMaxObserver,
                  dict(qscheme=torch.per_channel_affine_float_qparams, ch_axis=1)),
                 (tob.PerChannelMinMaxObserver, qt.PerChannelMinMaxObserver,
                  dict(qscheme=torch.per_channel_affine)),
                 (tob.MinMaxObserver, qt.MinMaxObserver, dict()),
                 (tob.MovingAverageMinMaxObserver, qt.MovingAverageMinMaxObserver, dict())]
        for tcls, qcls, kw in cases:
            t, q = tcls(dtype=torch.quint4x2, **kw), qcls(dtype=torch.quint4x2, **kw)
            self.assertEqual((q.quant_min, q.quant_max), (t.quant_min, t.quant_max))
            for b in (x, x * 2 - 1):
                t(b)
                q(b)
            (s1, z1), (s2, z2) = t.calculate_qparams(), q.calculate_qparams()
            self.assertTrue(torch.equal(s1, s2), qcls.__name__)
            self.assertTrue(torch.equal(z1, z2), qcls.__name__)
            self.assertEqual(z1.dtype, z2.dtype)


class DocNumbers(unittest.TestCase):
    def test_committed_numbers_are_torch(self):
        import gen_doc_numbers
        path = os.path.join(HERE, "..", "data", "docs", "pytorch_numbers.txt")
        with open(path) as f:
            committed = f.read()
        self.assertEqual(gen_doc_numbers.render(), committed,
                         "run /usr/bin/python3 tests/ref/gen_doc_numbers.py and fix the docs")


if __name__ == "__main__":
    unittest.main()
