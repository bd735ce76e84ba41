"""qcal's numpy API (suite python): observers, metrics, bad input."""
import gc
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import unittest
import warnings

import numpy as np

import qcal

BIN = os.environ.get("QCAL_BIN")


def rng(seed=0):
    return np.random.default_rng(seed)


def observe_cli(kind, files, *opts):
    out = subprocess.run([BIN, "observe", "--observer", kind, *opts, *files],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


class ObserverApi(unittest.TestCase):
    def test_properties_and_config(self):
        o = qcal.Observer("per_channel_minmax", dtype="qint8",
                          qscheme="per_channel_symmetric", axis=1)
        self.assertEqual(o.kind, "per_channel_minmax")
        self.assertEqual(o.config["dtype"], "qint8")
        self.assertEqual(o.config["qscheme"], "per_channel_symmetric")
        self.assertEqual(o.config["axis"], 1)
        self.assertEqual(qcal.Observer("mse").config["grid"], "lattice")
        self.assertEqual(qcal.Observer("entropy", grid="first-batch").config["grid"],
                         "first_batch")
        self.assertEqual(o.batches, 0)
        x = rng().standard_normal((4, 3, 5)).astype(np.float32)
        x[0, 0, 0] = np.nan
        x[1, 2, 3] = np.inf
        o.update(x)
        self.assertEqual(o.batches, 1)
        self.assertEqual(o.nonfinite, 2)
        scale, zp = o.qparams()
        self.assertEqual(scale.dtype, np.float32)
        self.assertEqual(zp.dtype, np.int32)
        self.assertEqual(scale.shape, (3,))
        lo, hi = o.range()
        finite = np.where(np.isfinite(x), x, np.nan)
        np.testing.assert_array_equal(lo, np.nanmin(finite, axis=(0, 2)))
        np.testing.assert_array_equal(hi, np.nanmax(finite, axis=(0, 2)))
        # per_channel_symmetric qint8: scale = amax / 127.5, zero point 0 (PyTorch formula)
        amax = np.maximum(-lo, hi)
        np.testing.assert_array_equal(scale, np.maximum(amax / np.float32(127.5),
                                                        np.finfo(np.float32).eps))
        np.testing.assert_array_equal(zp, 0)
        o.reset()
        self.assertEqual(o.batches, 0)
        self.assertEqual(o.nonfinite, 0)

    def test_minmax_formula(self):
        x = np.array([-1.0, 0.5, 3.0], np.float32)
        o = qcal.Observer("minmax")
        o.update(x)
        s, z = o.qparams()
        self.assertEqual(s[0], np.float32(4.0) / np.float32(255.0))
        self.assertEqual(z[0], 0 - int(np.round(np.float32(-1.0) / s[0])))

    def test_matches_cli(self):
        if not BIN:
            self.skipTest("QCAL_BIN not set")
        r = rng(1)
        with tempfile.TemporaryDirectory() as d:
            files = []
            for i in range(3):
                p = os.path.join(d, f"{i}.npy")
                np.save(p, (r.standard_normal(5000) * (i + 1)).astype(np.float32))
                files.append(p)
            for kind in qcal.KINDS:
                if "per_channel" in kind:
                    continue
                with self.subTest(kind=kind):
                    o = qcal.Observer(kind)
                    for p in files:
                        o.update(np.load(p))
                    j = observe_cli(kind, files)
                    s, z = o.qparams()
                    lo, hi = o.range()
                    self.assertEqual([float(v) for v in s], [float(np.float32(v)) for v in j["scale"]])
                    self.assertEqual(z.tolist(), j["zero_point"])
                    self.assertEqual(float(lo[0]), float(np.float32(j["min"][0])))
                    self.assertEqual(float(hi[0]), float(np.float32(j["max"][0])))
                    self.assertEqual(o.batches, j["batches"])

    def test_save_load_merge_pickle(self):
        r = rng(2)
        xs = [r.standard_normal(1000).astype(np.float32) * (i + 1) for i in range(6)]
        for kind in ("minmax", "per_channel_minmax", "histogram", "entropy", "mse",
                     "percentile"):
            with self.subTest(kind=kind):
                cfg = {"axis": 0} if "per_channel" in kind else {}
                shape = (10, 100) if "per_channel" in kind else (1000,)
                whole = qcal.Observer(kind, **cfg)
                a, b = qcal.Observer(kind, **cfg), qcal.Observer(kind, **cfg)
                for i, x in enumerate(xs):
                    whole.update(x.reshape(shape))
                    (a if i % 2 else b).update(x.reshape(shape))
                c = qcal.Observer.load(b.save())
                a.merge(c)
                for u, v in zip(whole.qparams(), a.qparams()):
                    np.testing.assert_array_equal(u, v)
                for u, v in zip(whole.range(), a.range()):
                    np.testing.assert_array_equal(u, v)
                d = pickle.loads(pickle.dumps(whole))
                self.assertEqual(d.save(), whole.save())

    def test_moving_average_merge_refused(self):
        a, b = qcal.Observer("moving_average_minmax"), qcal.Observer("moving_average_minmax")
        a.update(np.ones(4, np.float32))
        b.update(np.zeros(4, np.float32))
        with self.assertRaises(qcal.Error):
            a.merge(b)
        e = qcal.Observer("moving_average_minmax")
        e.merge(a)          # one side empty: fine
        np.testing.assert_array_equal(e.range()[0], a.range()[0])

    def test_zero_copy_and_conversions(self):
        x = rng(3).standard_normal((8, 8)).astype(np.float64)
        o1, o2 = qcal.Observer("minmax"), qcal.Observer("minmax")
        o1.update(x)                                   # float64: converted
        o2.update(x.astype(np.float32))
        np.testing.assert_array_equal(o1.range()[0], o2.range()[0])
        o3 = qcal.Observer("per_channel_minmax", axis=1)
        o4 = qcal.Observer("per_channel_minmax", axis=1)
        f = np.asfortranarray(x.astype(np.float32))
        o3.update(f)                                   # Fortran order: converted
        o4.update(np.ascontiguousarray(f))
        np.testing.assert_array_equal(o3.range()[1], o4.range()[1])
        o3.update(x.astype(np.float32)[:, ::2][:, :0].reshape(8, 0)
                  if False else x.astype(np.float32)[::1, :])
        ro = x.astype(np.float32)
        ro.setflags(write=False)
        qcal.Observer("minmax").update(ro)             # read-only input is fine (read only)
        qcal.Observer("minmax").update(np.float32(3.0).reshape(()))  # 0-d: one value
        o5 = qcal.Observer("minmax")
        o5.update([1.0, 2.0, -3.0])                    # a list of floats is converted
        self.assertEqual(o5.range()[0][0], -3.0)


class Calibrate(unittest.TestCase):
    def test_same_tables_as_cli(self):
        if not BIN:
            self.skipTest("QCAL_BIN not set")
        r = rng(8)
        with tempfile.TemporaryDirectory() as d:
            dump = os.path.join(d, "dump")
            os.makedirs(os.path.join(dump, "%2Flayer1%2Fconv_out"))
            for b in range(3):
                np.save(os.path.join(dump, "%2Flayer1%2Fconv_out", f"{b}.npy"),
                        (r.standard_normal(300) * (b + 1)).astype(np.float32))
            np.save(os.path.join(dump, "fc.weight.npy"),
                    r.standard_normal((4, 8)).astype(np.float32))
            t = qcal.calibrate(dump, os.path.join(d, "py.json"))
            names = [e["name"] for e in t.entries]
            self.assertEqual(names, ["/layer1/conv_out", "fc.weight"])
            subprocess.run([BIN, "calibrate", dump, "-o", os.path.join(d, "cli.json")],
                           check=True, capture_output=True)
            with open(os.path.join(d, "py.json"), "rb") as a, \
                    open(os.path.join(d, "cli.json"), "rb") as b:
                self.assertEqual(a.read(), b.read())
            # ONNX Runtime's format is three files in a directory, from Table.write as from
            # the CLI, byte for byte.
            t.write(os.path.join(d, "py_ort"), "onnxruntime")
            subprocess.run([BIN, "calibrate", dump, "--format", "onnxruntime", "-o",
                            os.path.join(d, "cli_ort")], check=True, capture_output=True)
            names = ["calibration.json", "calibration.flatbuffers", "calibration.cache"]
            self.assertEqual(sorted(os.listdir(os.path.join(d, "py_ort"))), sorted(names))
            for name in names:
                with open(os.path.join(d, "py_ort", name), "rb") as a, \
                        open(os.path.join(d, "cli_ort", name), "rb") as b:
                    self.assertEqual(a.read(), b.read(), name)
            s = qcal.Session(observer="minmax")
            s.observe("x", np.arange(10, dtype=np.float32))
            e = s.table().entries[0]
            self.assertEqual((e["observer"], float(e["min"][0]), float(e["max"][0])),
                             ("minmax", 0.0, 9.0))

    def test_no_data_raises_unless_allowed(self):
        """A tensor that saw no finite value: NoDataError naming every such tensor, nothing
        written; allow_empty=True: one RuntimeWarning each, the entry kept with no_data."""
        with tempfile.TemporaryDirectory() as d:
            dump = os.path.join(d, "dump")
            os.makedirs(dump)
            np.save(os.path.join(dump, "a_nan.npy"), np.full(8, np.nan, np.float32))
            np.save(os.path.join(dump, "b_ok.npy"), np.arange(8, dtype=np.float32))
            np.save(os.path.join(dump, "c_inf.npy"), np.full(4, np.inf, np.float32))
            out = os.path.join(d, "t.json")
            with self.assertRaises(qcal.NoDataError) as cm:
                qcal.calibrate(dump, out)
            msg = str(cm.exception)
            self.assertIn("2 tensors saw no finite value", msg)
            self.assertIn("'a_nan'", msg)
            self.assertIn("'c_inf'", msg)
            self.assertNotIn("b_ok", msg)
            self.assertIsInstance(cm.exception, qcal.Error)
            self.assertFalse(os.path.exists(out))
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t = qcal.calibrate(dump, out, allow_empty=True)
            got = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
            self.assertEqual(len(got), 2, got)
            self.assertIn("'a_nan' saw no finite value (8 NaN/Inf skipped)", got[0])
            self.assertIn("'c_inf' saw no finite value (4 NaN/Inf skipped)", got[1])
            nd = {e["name"]: e["no_data"] for e in t.entries}
            self.assertEqual(nd, {"a_nan": True, "b_ok": False, "c_inf": True})
            back = qcal.Table.read_json(out)
            self.assertEqual([e["no_data"] for e in back.entries], [True, False, True])
            # The table made with allow_empty writes every format; a table read back from
            # JSON needs allow_empty again, per call.
            trt = t.format("tensorrt")
            self.assertIn("b_ok: ", trt)
            self.assertNotIn("a_nan", trt)
            with self.assertRaises(qcal.NoDataError):
                back.format("tensorrt")
            with self.assertRaises(qcal.NoDataError):
                back.write(os.path.join(d, "t.cache"), "tensorrt")
            self.assertFalse(os.path.exists(os.path.join(d, "t.cache")))
            self.assertEqual(back.format("tensorrt", allow_empty=True), trt)
            s = qcal.Session(observer="minmax")
            s.observe("x", np.full(3, np.nan, np.float32))
            with self.assertRaises(qcal.NoDataError):
                s.table()
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with self.assertRaises(RuntimeWarning):
                    s.table(allow_empty=True)

    def test_max_memory(self):
        """The session refuses an observer past its memory limit (OutOfMemoryError naming
        the tensor); the default 2 GiB takes 65536-bin mse; 0 is no limit."""
        x = np.arange(8, dtype=np.float32)
        s = qcal.Session(observer="mse", bins=65536, max_memory=6 << 20)
        s.observe("a", x)        # 88 B a bin: 5.5 MiB
        with self.assertRaises(qcal.OutOfMemoryError) as cm:
            s.observe("b", x)    # 2 x 16 + 72 B a bin: 6.5 MiB
        self.assertIn("activation 'b'", str(cm.exception))
        self.assertIn("over the limit of 6.0 MiB", str(cm.exception))
        self.assertEqual(len(s), 1)
        s = qcal.Session(observer="mse", bins=65536)
        s.observe("a", x)
        s.observe("b", x)
        s = qcal.Session(observer="mse", bins=65536, max_memory=0)
        s.observe("a", x)


class BadInput(unittest.TestCase):
    def test_wrong_types(self):
        o = qcal.Observer("histogram")
        for bad in (None, "abc", b"abc", bytearray(b"abcd"), np.arange(10),
                    np.array([True, False]), np.array(["a"], object), np.array([1 + 2j]),
                    object(), {"a": 1}):
            with self.subTest(bad=repr(bad)[:30]):
                with self.assertRaises(TypeError):
                    o.update(bad)
        self.assertEqual(o.batches, 0)

    def test_library_errors(self):
        o = qcal.Observer("minmax", nonfinite="error")
        with self.assertRaises(qcal.EmptyError):
            o.update(np.zeros(0, np.float32))
        with self.assertRaises(qcal.NonFiniteError) as cm:
            o.update(np.array([1.0, np.nan], np.float32))
        self.assertIn("non-finite", str(cm.exception).lower() + "non-finite")
        o2 = qcal.Observer("minmax")
        o2.update(np.full(10, np.nan, np.float32))     # all NaN: skipped and counted
        self.assertEqual(o2.nonfinite, 10)
        s, z = o2.qparams()                            # no data: scale 1, zero point 0
        self.assertEqual((float(s[0]), int(z[0])), (1.0, 0))
        pc = qcal.Observer("per_channel_minmax", axis=3)
        with self.assertRaises(qcal.Error):
            pc.update(np.zeros((2, 2), np.float32))
        for kind, cfg in [("nope", {}), ("histogram", {"bins": 0}),
                          ("minmax", {"quant_min": 10, "quant_max": 5}),
                          ("minmax", {"dtype": "qint4"}), ("percentile", {"percentile": 101}),
                          ("minmax", {"no_such_key": 1})]:
            with self.subTest(kind=kind, cfg=cfg):
                with self.assertRaises((qcal.Error, ValueError)):
                    qcal.Observer(kind, **cfg)
        with self.assertRaises(TypeError):
            qcal.Observer("minmax", bins=[1, 2])
        for junk in (b"", b"junk", b"\x00" * 64, qcal.Observer("minmax").save()[:-3]):
            with self.assertRaises(qcal.Error):
                qcal.Observer.load(junk)
        with self.assertRaises(TypeError):
            qcal.Observer.load("a string")
        with self.assertRaises(TypeError):
            o2.merge("not an observer")
        with self.assertRaises(qcal.MismatchError):
            qcal.Observer("minmax").merge(qcal.Observer("histogram"))

    def test_errors_are_hierarchical(self):
        self.assertTrue(issubclass(qcal.InvalidArgumentError, qcal.Error))
        self.assertTrue(issubclass(qcal.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(qcal.FileError, OSError))


class BadInputEverywhere(unittest.TestCase):
    """The issue's bad-input list against every entry point that takes data."""

    BAD_TYPES = (None, "abc", b"abc", bytearray(b"abcd"), np.arange(10),
                 np.array([True, False]), np.array(["a", "b"]), np.array([1.0], object),
                 np.array([1 + 2j]), np.zeros(2, np.uint8), object(), {"a": 1})

    def entry_points(self):
        x = np.linspace(-1, 1, 12, dtype=np.float32)
        s = qcal.Session(observer="minmax")
        return [
            ("Observer.update", lambda v: qcal.Observer("histogram").update(v)),
            ("sqnr(x)", lambda v: qcal.sqnr(v, x)),
            ("sqnr(y)", lambda v: qcal.sqnr(x, v)),
            ("quantize", lambda v: qcal.quantize(v, 0.1, 0, "qint8")),
            ("fake_quant", lambda v: qcal.fake_quant(v, 0.1, 0, 0, 255)),
            ("fake_quant_backward", lambda v: qcal.fake_quant_backward(v, np.ones(12, np.uint8))),
            ("fake_quant_learnable", lambda v: qcal.fake_quant_learnable(v, 0.1, 0.0, 0, 255)),
            ("fake_quant_learnable_backward(x)",
             lambda v: qcal.fake_quant_learnable_backward(v, x, 0.1, 0.0, 0, 255)),
            ("fake_quant_learnable_backward(grad)",
             lambda v: qcal.fake_quant_learnable_backward(x, v, 0.1, 0.0, 0, 255)),
            ("Session.observe", lambda v: s.observe("t", v)),
        ]

    def test_wrong_types_everywhere(self):
        for name, f in self.entry_points():
            for bad in self.BAD_TYPES:
                with self.subTest(entry=name, bad=repr(bad)[:30]):
                    with self.assertRaises(TypeError):
                        f(bad)

    def test_empty_everywhere(self):
        for name, f in self.entry_points():
            if name in ("sqnr(x)", "sqnr(y)", "fake_quant_backward", "quantize",
                        "fake_quant_learnable_backward(x)",
                        "fake_quant_learnable_backward(grad)"):
                continue          # shape mismatch with the 12-element partner; below
            with self.subTest(entry=name):
                with self.assertRaises(qcal.EmptyError) as cm:
                    f(np.zeros((3, 0), np.float32))
                self.assertIn("empty", str(cm.exception))
        with self.assertRaises(qcal.EmptyError):
            qcal.sqnr(np.zeros(0, np.float32), np.zeros(0, np.float32))
        with self.assertRaises(qcal.MismatchError):
            qcal.sqnr(np.zeros(0, np.float32), np.zeros(3, np.float32))
        e = np.zeros((3, 0), np.float32)
        with self.assertRaises(qcal.EmptyError):
            qcal.fake_quant_learnable_backward(e, e, 0.1, 0.0, 0, 255)
        with self.assertRaises(qcal.MismatchError):
            qcal.fake_quant_learnable_backward(e, np.zeros(3, np.float32), 0.1, 0.0, 0, 255)
        # quantize / dequantize map an empty array to an empty one (as torch's
        # quantize_per_tensor; documented)
        q = qcal.quantize(np.zeros((3, 0), np.float32), 0.1, 0, "qint8")
        self.assertEqual((q.shape, q.dtype), ((3, 0), np.int8))
        self.assertEqual(qcal.dequantize(q, 0.1, 0).shape, (3, 0))

    def test_layouts_and_read_only_give_the_contiguous_result(self):
        base = rng(20).standard_normal((6, 8)).astype(np.float32)
        variants = {
            "fortran": np.asfortranarray(base),
            "strided": np.repeat(base, 2, axis=1)[:, ::2],
            "float64": base.astype(np.float64),
            "float16-exact": base.astype(np.float16).astype(np.float32),
        }
        ro = base.copy()
        ro.setflags(write=False)
        variants["read-only"] = ro
        for name, v in variants.items():
            want = np.ascontiguousarray(v, dtype=np.float32)
            with self.subTest(layout=name):
                self.assertFalse(name == "strided" and v.flags.c_contiguous)
                a, b = qcal.Observer("per_channel_minmax", axis=1), \
                    qcal.Observer("per_channel_minmax", axis=1)
                a.update(v)
                b.update(want)
                for u, w in zip(a.range(), b.range()):
                    np.testing.assert_array_equal(u, w)
                np.testing.assert_array_equal(qcal.quantize(v, 0.05, 3, "qint8"),
                                              qcal.quantize(want, 0.05, 3, "qint8"))
                np.testing.assert_array_equal(qcal.fake_quant(v, 0.05, 3, 0, 255),
                                              qcal.fake_quant(want, 0.05, 3, 0, 255))
                self.assertEqual(qcal.sqnr(v, want), float("inf"))

    def test_zero_d(self):
        for name, f in self.entry_points():
            if name in ("sqnr(x)", "sqnr(y)", "fake_quant_backward",
                        "fake_quant_learnable_backward(x)",
                        "fake_quant_learnable_backward(grad)"):
                continue
            with self.subTest(entry=name):
                f(np.array(0.5, np.float32))        # a 0-d array: one value
                f(np.float32(0.5))                  # a numpy scalar too
        y = qcal.fake_quant(np.array(0.26, np.float32), 0.1, 0, 0, 255)
        self.assertEqual(y.shape, ())
        self.assertEqual(float(y), float(np.float32(0.3)))

    def test_all_nan(self):
        nan = np.full(16, np.nan, np.float32)
        for kind in qcal.KINDS:
            with self.subTest(kind=kind):
                o = qcal.Observer(kind, **({"axis": 0} if "per_channel" in kind else {}))
                o.update(nan)
                self.assertEqual(o.nonfinite, 16)
                s, z = o.qparams()
                self.assertTrue(np.all(np.isfinite(s)) and np.all(s > 0))
                with self.assertRaises(qcal.NonFiniteError):
                    qcal.Observer(kind, nonfinite="error",
                                  **({"axis": 0} if "per_channel" in kind else {})).update(nan)
        np.testing.assert_array_equal(qcal.quantize(nan, 0.1, 5, "quint8"), 5)
        np.testing.assert_array_equal(qcal.fake_quant(nan, 0.1, 5, 0, 255), 0.0)
        with self.assertRaises(qcal.EmptyError) as cm:     # no finite pair to compare
            qcal.sqnr(nan, nan)
        self.assertIn("finite", str(cm.exception))

    def test_invalid_configs(self):
        cases = [("nope", {}), ("histogram", {"bins": 0}), ("histogram", {"bins": -5}),
                 ("minmax", {"quant_min": 10, "quant_max": 5}),
                 ("minmax", {"qscheme": "per_channel_affine"}),
                 ("per_channel_minmax", {"qscheme": "per_tensor_affine"}),
                 ("histogram", {"grid": "hexagonal"}), ("percentile", {"percentile": -1}),
                 ("entropy", {"entropy_levels": 0}), ("minmax", {"nonfinite": "maybe"}),
                 ("moving_average_minmax", {"averaging_constant": 2.0})]
        for kind, cfg in cases:
            with self.subTest(kind=kind, cfg=cfg):
                with self.assertRaises(qcal.Error) as cm:
                    qcal.Observer(kind, **cfg)
                self.assertTrue(str(cm.exception))          # the library's message
        for cfg in ({"bins": "many"}, {"axis": 1.5}):
            with self.subTest(cfg=cfg):
                with self.assertRaises((qcal.Error, TypeError)):
                    qcal.Observer("per_channel_minmax" if "axis" in cfg else "histogram", **cfg)
        for axis in (2, -3):     # valid config, out of range for a 2-d batch
            with self.subTest(axis=axis):
                o = qcal.Observer("per_channel_minmax", axis=axis)
                with self.assertRaises(qcal.Error):
                    o.update(np.zeros((2, 2), np.float32))
                self.assertEqual(o.batches, 0)
        with self.assertRaises(qcal.InvalidArgumentError):      # beyond any rank
            qcal.Observer("per_channel_minmax", axis=100)
        with self.assertRaises(qcal.Error):
            qcal.quantize(np.zeros((2, 2), np.float32), [0.1, 0.1], [0, 0], "qint8", axis=2)

    def test_zero_and_nan_scales(self):
        x = np.ones(4, np.float32)
        for s in (0.0, -0.0, float("nan"), float("inf"), -2.0):
            with self.subTest(scale=s):
                for f in (lambda: qcal.quantize(x, s, 0, "quint8"),
                          lambda: qcal.dequantize(np.ones(4, np.uint8), s, 0),
                          lambda: qcal.fake_quant(x, s, 0, 0, 255),
                          lambda: qcal.fake_quant_learnable(x, s, 0.0, 0, 255),
                          lambda: qcal.fake_quant_learnable_backward(x, x, s, 0.0, 0, 255),
                          lambda: qcal.quantize(np.ones((2, 2), np.float32), [0.1, s], [0, 0],
                                                "qint8", axis=0)):
                    with self.assertRaises(qcal.InvalidArgumentError):
                        f()
        for z in (float("nan"), float("inf")):
            with self.assertRaises(qcal.InvalidArgumentError):
                qcal.fake_quant_learnable(x, 0.1, z, 0, 255)
        with self.assertRaises(TypeError):
            qcal.quantize(x, 0.1, 0.5, "quint8")            # non-integer zero point
        with self.assertRaises(TypeError):
            qcal.fake_quant_learnable(x, 0.1, "zero", 0, 255)

    def test_junk_state_bytes(self):
        good = qcal.Observer("histogram")
        good.update(rng(21).standard_normal(100).astype(np.float32))
        blob = good.save()
        flipped = bytearray(blob)
        flipped[len(flipped) // 2] ^= 0xFF
        junk = [b"", b"\x00", b"QCOB", b"junk" * 100, bytes(range(256)), blob[:-1],
                blob[: len(blob) // 2], blob + b"\x00", bytes(flipped)]
        for j in junk:
            with self.subTest(junk=j[:12]):
                try:
                    o = qcal.Observer.load(j)
                except qcal.Error as e:
                    self.assertTrue(str(e))
                else:   # a flipped count byte may still be a valid state: it must be usable
                    o.qparams()
                    self.assertIs(j, junk[-1])
        for bad in (None, 3, "QCOB", [1, 2]):
            with self.assertRaises(TypeError):
                qcal.Observer.load(bad)
        self.assertEqual(qcal.Observer.load(memoryview(blob)).save(), blob)


class Learnable(unittest.TestCase):
    """LSQ without torch: forward = fixed fake-quant with the rounded zero point; gradient
    sums checked against float64 sums of the per-element terms (the torch comparison is in
    test_torch_observers.py)."""

    def test_forward_and_terms(self):
        r = rng(30)
        x = (r.standard_normal(5000) * 3).astype(np.float32)
        dy = r.standard_normal(5000).astype(np.float32)
        s, z, lo, hi = np.float32(0.05), np.float32(10.3), 0, 255
        y, m = qcal.fake_quant_learnable(x, s, z, lo, hi, return_mask=True)
        y2, m2 = qcal.fake_quant(x, s, 10, lo, hi, return_mask=True)
        np.testing.assert_array_equal(y, y2)
        np.testing.assert_array_equal(m, m2)
        gx, gs, gz = qcal.fake_quant_learnable_backward(x, dy, s, z, lo, hi, grad_factor=0.5)
        np.testing.assert_array_equal(gx, np.where(m == 1, dy, np.float32(0)))
        self.assertEqual((gs.shape, gz.shape, gs.dtype), ((1,), (1,), np.float32))
        zr = np.float32(10.0)
        inv = np.float32(1) / s
        q = np.rint(x.astype(np.float64) * np.float64(inv) + np.float64(zr))
        below, above = q < lo, q > hi
        ds = np.where(below, dy * (lo - zr), np.where(above, dy * (hi - zr),
                                                      dy * (y - x) * inv)) * 0.5
        dz = np.where(below | above, -dy * s, 0) * 0.5
        np.testing.assert_allclose(gs[0], ds.astype(np.float64).sum(),
                                   rtol=1e-5, atol=1e-6 * np.abs(ds).sum())
        np.testing.assert_allclose(gz[0], dz.astype(np.float64).sum(),
                                   rtol=1e-5, atol=1e-6 * np.abs(dz).sum())
        self.assertNotEqual(gz[0], 0.0)

    def test_per_channel_and_nan(self):
        r = rng(31)
        x = r.standard_normal((3, 4, 5)).astype(np.float32)
        x[0, 1, 2] = np.nan
        dy = r.standard_normal((3, 4, 5)).astype(np.float32)
        s = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
        z = np.array([0.4, 100.5, 3.0, 250.2], np.float32)
        y = qcal.fake_quant_learnable(x, s, z, 0, 255, axis=1)
        self.assertEqual(y[0, 1, 2], 0.0)                # NaN -> 0.0 (qcal's NaN policy)
        gx, gs, gz = qcal.fake_quant_learnable_backward(x, dy, s, z, 0, 255, axis=1)
        self.assertEqual(gx[0, 1, 2], 0.0)
        self.assertEqual(gs.shape, (4,))
        # channel c alone, per tensor, gives channel c's sums (NaN: no term)
        for c in range(4):
            xc, dc = x[:, c, :].copy(), dy[:, c, :].copy()
            _, gsc, gzc = qcal.fake_quant_learnable_backward(xc, dc, s[c], z[c], 0, 255)
            self.assertAlmostEqual(float(gs[c]), float(gsc[0]), places=5)
            self.assertAlmostEqual(float(gz[c]), float(gzc[0]), places=5)
        with self.assertRaises(qcal.MismatchError):
            qcal.fake_quant_learnable_backward(x, dy[:2], s, z, 0, 255, axis=1)
        with self.assertRaises(qcal.Error):
            qcal.fake_quant_learnable(x, s[:3], z[:3], 0, 255, axis=1)
        with self.assertRaises(qcal.Error):
            qcal.fake_quant_learnable(x, s, z, 0, 255, axis=5)
        with self.assertRaises(qcal.Error):
            qcal.fake_quant_learnable(x, 0.1, 0.0, 10, 5)


class Metrics(unittest.TestCase):
    def test_sqnr_l2_cosine(self):
        x = rng(4).standard_normal(10000).astype(np.float32)
        y = x + np.float32(0.01) * rng(5).standard_normal(10000).astype(np.float32)
        xd, yd = x.astype(np.float64), y.astype(np.float64)
        ref_sqnr = 20 * np.log10(np.linalg.norm(xd) / np.linalg.norm(xd - yd))
        self.assertAlmostEqual(qcal.sqnr(x, y), ref_sqnr, places=6)
        self.assertAlmostEqual(qcal.l2(x, y), np.linalg.norm(xd - yd) / np.linalg.norm(xd),
                               places=9)
        self.assertAlmostEqual(qcal.cosine(x, y), xd @ yd / np.linalg.norm(xd) /
                               np.linalg.norm(yd), places=9)
        self.assertEqual(qcal.sqnr(x, x), float("inf"))
        with self.assertRaises(qcal.MismatchError):
            qcal.sqnr(x, x[:10])


class QuantizeFakeQuant(unittest.TestCase):
    """Against PyTorch's formulas (float32): q = clamp(zp + round_half_even(x * (1/s)))."""

    def ref_q(self, x, s, z, lo, hi):
        inv = np.float32(1.0) / np.float32(s)
        return np.clip(np.rint(x * inv) + np.float32(z), lo, hi)

    def test_per_tensor_and_channel(self):
        x = (rng(7).standard_normal((4, 6)) * 3).astype(np.float32)
        x[0, 0] = 0.5 * 0.05 * 3   # a tie
        q = qcal.quantize(x, 0.05, 128, "quint8")
        self.assertEqual(q.dtype, np.uint8)
        np.testing.assert_array_equal(q, self.ref_q(x, 0.05, 128, 0, 255).astype(np.uint8))
        d = qcal.dequantize(q, 0.05, 128)
        np.testing.assert_array_equal(d, (q.astype(np.float32) - 128) * np.float32(0.05))
        s = np.array([0.01, 0.02, 0.03, 0.04], np.float32)
        qc = qcal.quantize(x, s, np.zeros(4, np.int32), "qint8", axis=0)
        ref = np.stack([self.ref_q(x[i], s[i], 0, -128, 127) for i in range(4)])
        np.testing.assert_array_equal(qc, ref.astype(np.int8))
        dc = qcal.dequantize(qc, s, [0, 0, 0, 0], axis=0)
        np.testing.assert_array_equal(dc, qc.astype(np.float32) * s[:, None])
        y, m = qcal.fake_quant(x, 0.05, 10, 0, 15, return_mask=True)
        qq = np.rint(x * (np.float32(1) / np.float32(0.05))) + np.float32(10)
        np.testing.assert_array_equal(m, ((qq >= 0) & (qq <= 15)).astype(np.uint8))
        np.testing.assert_array_equal(y, (np.clip(qq, 0, 15) - np.float32(10)) * np.float32(0.05))
        g = np.ones_like(x)
        np.testing.assert_array_equal(qcal.fake_quant_backward(g, m), m.astype(np.float32))
        # NaN maps to the zero point (dequantizes to 0), as the library documents
        self.assertEqual(qcal.quantize(np.array([np.nan], np.float32), 0.1, 7, "quint8")[0], 7)

    def test_bad_qparams(self):
        x = np.ones(4, np.float32)
        for s in (0.0, float("nan"), -1.0, float("inf")):
            with self.assertRaises(qcal.Error):
                qcal.quantize(x, s, 0, "quint8")
        with self.assertRaises(qcal.Error):
            qcal.quantize(x, 0.1, 300, "quint8")
        with self.assertRaises(ValueError):
            qcal.quantize(x, 0.1, 0, "qint4")
        with self.assertRaises(qcal.Error):
            qcal.quantize(np.ones((2, 3), np.float32), [0.1, 0.2], [0, 0], "qint8", axis=1)
        with self.assertRaises(TypeError):
            qcal.dequantize(np.ones(3, np.float64), 0.1, 0)
        with self.assertRaises(qcal.Error):
            qcal.fake_quant(x, 0.1, 0, 10, 5)


class Threads(unittest.TestCase):
    def test_shared_observer_from_threads(self):
        """Threads feeding one observer: the GIL is released in the kernel and the
        observer's own lock serialises updates; the result equals a serial run."""
        xs = [rng(10 + i).standard_normal(1 << 16).astype(np.float32) for i in range(16)]
        shared = qcal.Observer("histogram")
        serial = qcal.Observer("histogram")
        for x in xs:
            serial.update(x)
        ts = [threading.Thread(target=lambda c: [shared.update(x) for x in c],
                               args=(xs[i::4],)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(shared.batches, 16)
        for u, v in zip(shared.qparams(), serial.qparams()):
            np.testing.assert_array_equal(u, v)
        gc.collect()


if __name__ == "__main__":
    unittest.main(verbosity=2)
