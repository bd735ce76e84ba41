"""FP8 in the Python API (suite python): qcal.Observer with dtype float8_e4m3fn /
float8_e5m2, qcal.quantize (uint8 codes), qcal.dequantize(dtype=...), qcal.fakequant
(= fake_quant) with dtype; bits checked against an independent nearest-grid search."""
import math
import unittest

import numpy as np

import qcal

FMT = {"float8_e4m3fn": (3, 7, 0x7E), "float8_e5m2": (2, 15, 0x7B)}


def grid(code, name):
    mb, bias, _ = FMT[name]
    e, m = code >> mb, code & ((1 << mb) - 1)
    return math.ldexp(m, 1 - bias - mb) if e == 0 else math.ldexp((1 << mb) + m, e - bias - mb)


def ref_code(v, name):
    """Nearest grid value, ties to the even code, saturating; NaN -> sign | 0x7F."""
    maxc = FMT[name][2]
    sign = 0x80 if math.copysign(1.0, v) < 0 else 0
    if math.isnan(v):
        return sign | 0x7F
    a = abs(v)
    if a >= grid(maxc, name):
        return sign | maxc
    lo, hi = 0, maxc
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if grid(mid, name) <= a:
            lo = mid
        else:
            hi = mid
    dl, dh = a - grid(lo, name), grid(hi, name) - a
    c = lo if dl < dh else hi if dh < dl else (hi if lo & 1 else lo)
    return sign | c


class Fp8(unittest.TestCase):
    def values(self):
        r = np.random.default_rng(5)
        bits = r.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
        x = np.concatenate([bits.view(np.float32),
                            (r.standard_normal(5000) * 50).astype(np.float32),
                            np.array([0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 480, 57344,
                                      61440, 2**-9, 2**-10, 2**-16, 2**-17, 17, 19],
                                     np.float32)])
        return x

    def test_quantize_codes(self):
        x = self.values()
        for name in FMT:
            for scale in (1.0, 0.25):
                c = qcal.quantize(x, scale, 0, name)
                self.assertEqual(c.dtype, np.uint8)
                self.assertEqual(c.shape, x.shape)
                v = (x / np.float32(scale)).astype(np.float32)
                want = np.array([ref_code(float(t), name) for t in v], np.uint8)
                bad = np.nonzero(c != want)[0]
                self.assertEqual(bad.size, 0, f"{name} scale {scale}: first x {x[bad[:1]]}")

    def test_dequantize_and_fakequant(self):
        x = self.values()
        for name in FMT:
            c = qcal.quantize(x, 0.5, 0, name)
            d = qcal.dequantize(c, 0.5, 0, dtype=name)
            y, m = qcal.fakequant(x, 0.5, 0, dtype=name, return_mask=True)
            np.testing.assert_array_equal(d.view(np.uint32), y.view(np.uint32))
            finite = c & 0x7F != 0x7F
            want = np.array([math.copysign(grid(int(k) & 0x7F, name), -1.0 if k & 0x80 else 1.0)
                             for k in c[finite]], np.float32) * np.float32(0.5)
            np.testing.assert_array_equal(d[finite].view(np.uint32), want.view(np.uint32))
            bound = 464.0 if name == "float8_e4m3fn" else 61440.0
            a = np.abs(x / np.float32(0.5))
            inside = (a <= bound) if name == "float8_e4m3fn" else (a < bound)
            np.testing.assert_array_equal(m, inside.astype(np.uint8))
            g = qcal.fake_quant_backward(np.ones_like(x), m)
            np.testing.assert_array_equal(g, inside.astype(np.float32))
            self.assertIs(qcal.fakequant, qcal.fake_quant)

    def test_per_channel(self):
        x = np.random.default_rng(2).standard_normal((6, 33)).astype(np.float32)
        s = np.linspace(0.001, 0.02, 33, dtype=np.float32)
        c = qcal.quantize(x, s, np.zeros(33, np.int32), "float8_e4m3fn", axis=1)
        for j in range(33):
            np.testing.assert_array_equal(c[:, j], qcal.quantize(x[:, j], s[j], 0, "float8_e4m3fn"))
        y = qcal.fakequant(x, s, np.zeros(33, np.int32), axis=-1, dtype="float8_e4m3fn")
        np.testing.assert_array_equal(y, qcal.dequantize(c, s, np.zeros(33, np.int32), axis=1,
                                                         dtype="float8_e4m3fn"))

    def test_observer(self):
        x = np.random.default_rng(3).standard_normal((4, 100)).astype(np.float32)
        o = qcal.Observer("minmax", dtype="float8_e4m3fn")
        o.update(x)
        s, z = o.qparams()
        self.assertEqual(s[0], np.float32(np.abs(x).max()) / np.float32(448))
        self.assertEqual(z[0], 0)
        o = qcal.Observer("per_channel_minmax", dtype="float8_e5m2", axis=0)
        o.update(x)
        s, z = o.qparams()
        np.testing.assert_array_equal(s, np.abs(x).max(axis=1) / np.float32(57344))
        np.testing.assert_array_equal(z, 0)

    def test_errors(self):
        x = np.ones(4, np.float32)
        with self.assertRaises(qcal.Error):
            qcal.quantize(x, 1.0, 3, "float8_e5m2")
        with self.assertRaises(ValueError):
            qcal.fakequant(x, 1.0, 0, 0, 255, dtype="float8_e4m3fn")
        with self.assertRaises(ValueError):
            qcal.fakequant(x, 1.0, 0, dtype="qint8")
        with self.assertRaises(TypeError):
            qcal.dequantize(np.zeros(4, np.int8), 1.0, 0, dtype="float8_e4m3fn")


if __name__ == "__main__":
    unittest.main()
