"""qcal.Table / qcal.calibrate against the CLI (suite python): the table-writing options of
`qcal calibrate` (trt_version, trt_algorithm, skip_unrepresentable, several formats),
calibrate(weights=...) as --weights, the entries' fqn key, readable reprs."""
import json
import os
import struct
import subprocess
import tempfile
import unittest
import warnings

import numpy as np

import qcal

BIN = os.environ.get("QCAL_BIN")


def make_dump(d):
    """A dump with two activations (one name holds a space) and one weight."""
    r = np.random.default_rng(5)
    dump = os.path.join(d, "dump")
    os.makedirs(dump)
    for b in range(2):
        os.makedirs(os.path.join(dump, "conv1.output"), exist_ok=True)
        np.save(os.path.join(dump, "conv1.output", f"{b}.npy"),
                (r.standard_normal(256) * (b + 1)).astype(np.float32))
    np.save(os.path.join(dump, "odd name.npy"), np.linspace(-1, 3, 64, dtype=np.float32))
    np.save(os.path.join(dump, "fc.weight.npy"), r.standard_normal((4, 8)).astype(np.float32))
    return dump


def write_safetensors(path, tensors):
    """A .safetensors file: 8-byte little-endian header length, JSON header, data."""
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def cli(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, check=True)


def read(path):
    with open(path, "rb") as f:
        return f.read()


class WriteOptions(unittest.TestCase):
    def test_trt_header_options(self):
        with tempfile.TemporaryDirectory() as d:
            dump = make_dump(d)
            t = qcal.calibrate(dump)   # tensorrt holds 'odd name' (spaces are fine there)
            self.assertTrue(t.format("tensorrt").startswith("TRT-8601-EntropyCalibration2\n"))
            for ver, head in (("10.3.0", "100300"), ("8.6.1", "8601"), ("8501", "8501"),
                              (100300, "100300")):
                with self.subTest(ver=ver):
                    txt = t.format("tensorrt", trt_version=ver,
                                   trt_algorithm="MinMaxCalibration")
                    self.assertEqual(txt.split("\n")[0], f"TRT-{head}-MinMaxCalibration")
            for bad in ("8.6", "08601", "10.3.0.1", "", "v8"):
                with self.subTest(bad=bad):
                    with self.assertRaises(qcal.InvalidArgumentError) as cm:
                        t.write(os.path.join(d, "x.cache"), "tensorrt", trt_version=bad)
                    self.assertIn("trt_version", str(cm.exception))
            with self.assertRaises(qcal.InvalidArgumentError) as cm:
                t.write(os.path.join(d, "x.cache"), "tensorrt", trt_algorithm="Entropy")
            self.assertIn("EntropyCalibration2, MinMaxCalibration", str(cm.exception))
            with self.assertRaises(TypeError):
                t.write(os.path.join(d, "x.cache"), "tensorrt", trt_version=8.6)
            self.assertFalse(os.path.exists(os.path.join(d, "x.cache")))
            if not BIN:
                self.skipTest("QCAL_BIN not set")
            out = os.path.join(d, "py.cache")
            t.write(out, "tensorrt", trt_version="10.3.0", trt_algorithm="MinMaxCalibration")
            cli("calibrate", dump, "--format", "tensorrt", "-o", os.path.join(d, "cli.cache"),
                "--trt-version", "10.3.0", "--trt-algorithm", "MinMaxCalibration")
            self.assertEqual(read(out), read(os.path.join(d, "cli.cache")))

    def test_skip_unrepresentable(self):
        """A name with a space: ncnn and onnxruntime cannot hold it. Without the option the
        error says which keyword to pass; with it one RuntimeWarning per format and the
        files equal the CLI's --skip-unrepresentable output."""
        with tempfile.TemporaryDirectory() as d:
            dump = make_dump(d)
            t = qcal.calibrate(dump)
            self.assertEqual([e["fqn"] for e in t.entries],
                             ["conv1.output", "fc.weight", "odd name"])
            out = os.path.join(d, "py.table")
            with self.assertRaises(qcal.UnsupportedError) as cm:
                t.write(out, "ncnn")
            self.assertIn("cannot hold 1 name: 'odd name' (white space)", str(cm.exception))
            self.assertIn("skip_unrepresentable", str(cm.exception))
            self.assertFalse(os.path.exists(out))
            with warnings.catch_warnings():
                warnings.simplefilter("error")   # the warning comes first: nothing written
                with self.assertRaises(RuntimeWarning):
                    t.write(out, "ncnn", skip_unrepresentable=True)
            self.assertFalse(os.path.exists(out))
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t.write(out, "ncnn", skip_unrepresentable=True)
            msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
            self.assertEqual(msgs, ["left 1 name out of the ncnn output: 'odd name' "
                                    "(white space)"])
            text = read(out).decode()
            self.assertNotIn("odd", text)
            self.assertEqual(text.count("\n"), 2)   # fc_param_0 and conv1.output
            # Several formats at once: a directory, as --format json,ncnn,onnxruntime -o DIR.
            pyd = os.path.join(d, "py_all")
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t.write(pyd, ["json", "ncnn", "onnxruntime"], skip_unrepresentable=True)
            msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
            self.assertEqual(len(msgs), 2, msgs)   # ncnn and onnxruntime, not json
            files = ["qcal_table.json", "ncnn.table", "calibration.json",
                     "calibration.flatbuffers", "calibration.cache"]
            self.assertEqual(sorted(os.listdir(pyd)), sorted(files))
            self.assertEqual(read(os.path.join(pyd, "ncnn.table")), read(out))
            if not BIN:
                self.skipTest("QCAL_BIN not set")
            r = subprocess.run([BIN, "calibrate", dump, "-o", os.path.join(d, "cli_all"),
                                "--format", "json,ncnn,onnxruntime", "--skip-unrepresentable"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            for f in files:
                self.assertEqual(read(os.path.join(pyd, f)),
                                 read(os.path.join(d, "cli_all", f)), f)

    def test_formats_argument(self):
        with tempfile.TemporaryDirectory() as d:
            t = qcal.calibrate(make_dump(d))
            a, b = os.path.join(d, "a"), os.path.join(d, "b")
            t.write(a, "json,tensorrt")
            t.write(b, ("json", "tensorrt"))
            self.assertEqual(sorted(os.listdir(a)), ["qcal_table.json", "tensorrt.cache"])
            for f in os.listdir(a):
                self.assertEqual(read(os.path.join(a, f)), read(os.path.join(b, f)))
            with self.assertRaises(qcal.InvalidArgumentError) as cm:
                t.write(os.path.join(d, "c"), "json,json")
            self.assertIn("json listed twice", str(cm.exception))
            with self.assertRaises(qcal.InvalidArgumentError):
                t.write(os.path.join(d, "c"), "json,")
            with self.assertRaises(TypeError):
                t.write(os.path.join(d, "c"), 3)
            self.assertFalse(os.path.exists(os.path.join(d, "c")))
            # One single-file format onto a directory, and onnxruntime onto a file: refused,
            # nothing destroyed.
            f = os.path.join(d, "file")
            with open(f, "w") as fp:
                fp.write("keep")
            with self.assertRaises(qcal.FileError):
                t.write(f, "onnxruntime", skip_unrepresentable=True)
            with self.assertRaises(qcal.Error):
                t.write(a, "json")
            self.assertEqual(read(f), b"keep")
            self.assertEqual(sorted(os.listdir(a)), ["qcal_table.json", "tensorrt.cache"])


class CalibrateWeights(unittest.TestCase):
    def test_weights_as_cli(self):
        with tempfile.TemporaryDirectory() as d:
            dump = make_dump(d)
            st = os.path.join(d, "model.safetensors")
            r = np.random.default_rng(9)
            write_safetensors(st, {"lin.weight": r.standard_normal((6, 5)).astype(np.float32),
                                   "lin.bias": r.standard_normal(6).astype(np.float32),
                                   "steps": np.arange(3, dtype=np.int64)})
            out = os.path.join(d, "py.json")
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t = qcal.calibrate(dump, out, weights=st)
            msgs = [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]
            self.assertEqual(msgs, [f"'{st}': skipping 'steps' (dtype I64)"])
            e = {x["fqn"]: x for x in t.entries}
            self.assertEqual(sorted(e), ["conv1.output", "fc.weight", "lin.weight", "odd name"])
            self.assertEqual((e["lin.weight"]["role"], e["lin.weight"]["qscheme"],
                              e["lin.weight"]["scale"].shape), ("weight",
                                                                "per_channel_symmetric", (6,)))
            # weights only, a list of files, and the session method itself
            t2 = qcal.calibrate(weights=[st])
            self.assertEqual([x["fqn"] for x in t2.entries], ["lin.weight"])
            s = qcal.Session()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.assertEqual(s.observe_safetensors(st), (1, 1))
            with self.assertRaises(qcal.NotFoundError):
                s.observe_safetensors(os.path.join(d, "missing.safetensors"))
            if BIN:
                cli("calibrate", dump, "--weights", st, "-o", os.path.join(d, "cli.json"))
                self.assertEqual(read(out), read(os.path.join(d, "cli.json")))

    def test_clear_errors(self):
        with tempfile.TemporaryDirectory() as d:
            dump = make_dump(d)
            with self.assertRaises(TypeError) as cm:
                qcal.calibrate(dump, weight="model.safetensors")
            msg = str(cm.exception)
            self.assertIn("calibrate() got unexpected keyword argument 'weight'", msg)
            self.assertIn("observer=KIND", msg)
            with self.assertRaises(TypeError) as cm:
                qcal.calibrate()
            self.assertIn("weights=", str(cm.exception))
            with self.assertRaises(TypeError) as cm:
                qcal.calibrate(dump, trt_version="10.3.0")
            self.assertIn("output=PATH", str(cm.exception))


class Entries(unittest.TestCase):
    def test_fqn_key_as_json(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "t.json")
            t = qcal.calibrate(make_dump(d), out)
            with open(out) as f:
                doc = json.load(f)
            rows = doc["entries"] if isinstance(doc, dict) else doc
            self.assertEqual([x["fqn"] for x in t.entries], [x["fqn"] for x in rows])
            for x in t.entries:
                self.assertEqual(x["name"], x["fqn"])   # the earlier key, kept as an alias


class Reprs(unittest.TestCase):
    def test_table_repr(self):
        s = qcal.Session(observer="minmax")
        s.observe("a.out", np.array([-1.0, 3.0], np.float32))
        s.observe("w", np.array([[1.0, -2.0], [0.5, 0.25]], np.float32), role="weight")
        self.assertEqual(repr(s), "<qcal.Session: 2 tensors; observer='minmax'>")
        t = s.table()
        self.assertEqual(repr(t), "<qcal.Table: 2 entries (1 activation, 1 weight)\n"
                         "  'a.out' activation minmax quint8 per_tensor_affine scale 0.0156863 "
                         "zero_point 64\n"
                         "  'w' weight per_channel_minmax qint8 per_channel_symmetric axis 0, "
                         "2 channels (scale[0] 0.0156863 zero_point[0] 0)>")
        big = qcal.Session(rules_text="* activation minmax\n# note\n", max_memory=1 << 30)
        for i in range(10):
            big.observe(f"t{i}", np.array([0.0, 1.0], np.float32))
        self.assertEqual(repr(big), "<qcal.Session: 10 tensors; rules_text=<1 rule> "
                                    "max_memory=1G>")
        r = repr(big.table()).split("\n")
        self.assertEqual(r[0], "<qcal.Table: 10 entries (10 activations, 0 weights)")
        self.assertEqual(len(r), 10)
        self.assertEqual(r[-1], "  ... 2 more>")
        self.assertEqual(repr(qcal.Session()), "<qcal.Session: 0 tensors>")


if __name__ == "__main__":
    unittest.main(verbosity=2)
