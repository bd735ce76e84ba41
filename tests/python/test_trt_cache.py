"""qcal's TensorRT calibration cache read the way NVIDIA ModelOpt reads one (suite python).

ModelOpt's ONNX PTQ takes a TensorRT cache through --calibration_cache_path: it skips the
header line, splits each line on ": " and decodes the value with bytes.fromhex and
struct.unpack("!f"). bytes.fromhex needs an even number of digits, so every scale must be
written as its 8 hex digits, including the subnormal scales of tiny ranges. The caches here
are written by `qcal calibrate --format tensorrt` (and the Python Table) from dumps with
ordinary, zero, tiny, subnormal and huge ranges."""
import os
import struct
import subprocess
import tempfile
import unittest

import numpy as np

import qcal

BIN = os.environ.get("QCAL_BIN")
F32 = np.float32


def modelopt_read(path):
    """The cache reader of ModelOpt's --calibration_cache_path, as it parses: line 1 is the
    header; every other line "name: hex" with the big-endian float32 bits."""
    scales = {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines[1:]:
        name, value = line.split(": ")
        scales[name] = struct.unpack("!f", bytes.fromhex(value))[0]
    return lines[0], scales


# name -> the batch fed to the minmax observer (amax = max |x|)
TENSORS = {
    "normal": np.random.default_rng(3).standard_normal((4, 8)).astype(F32),
    "zero": np.zeros((2, 5), F32),                                  # amax 0 -> scale 1/127
    "tiny": np.array([[1e-30, -2e-30]], F32),                       # scale 1.6e-32, 8 digits
    "subnormal": np.array([[1e-36, 0.0]], F32),                     # scale 7.9e-39: 0x0055..
    "deep_subnormal": np.array([[F32(1e-41)]], F32),                # scale 0x0000000X
    "huge": np.array([[3.0e38, -1.0]], F32),                        # scale 2.4e36
    "negative_only": np.array([[-7.5, -0.25]], F32),
    "/conv1/Conv_output_0": np.array([[0.0, 6.0]], F32),          # ONNX-style name
}


def expected_scale(x):
    amax = F32(np.max(np.abs(x)))
    if amax == 0:
        amax = F32(1.0)   # qcal's documented rule for an all-zero range
    return F32(amax / F32(127.0))


def percent(name):
    return "".join(c if c.isalnum() or c in "._-" else "%%%02X" % ord(c) for c in name)


@unittest.skipUnless(BIN, "QCAL_BIN is not set (built without tools)")
class TensorRTCache(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dump = os.path.join(self.tmp.name, "dump")
        os.mkdir(self.dump)
        for name, x in TENSORS.items():
            np.save(os.path.join(self.dump, percent(name) + ".npy"), x)

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, path):
        header, scales = modelopt_read(path)
        self.assertTrue(header.startswith("TRT-"), header)
        self.assertEqual(set(scales), set(TENSORS))
        with open(path, encoding="utf-8") as f:
            for line in f.read().splitlines()[1:]:
                value = line.rsplit(": ", 1)[1]
                self.assertRegex(value, r"^[0-9a-f]{8}$", line)
        for name, x in TENSORS.items():
            want = expected_scale(x)
            got = F32(scales[name])
            self.assertEqual(got.tobytes(), want.tobytes(),
                             "%s: read %r, want amax/127 = %r" % (name, got, want))
            self.assertGreater(got, 0, name)
        return scales

    def test_cli_cache_parses_with_fromhex(self):
        out = os.path.join(self.tmp.name, "trt.cache")
        subprocess.run([BIN, "calibrate", self.dump, "-o", out, "--format", "tensorrt",
                        "--observer", "minmax"], check=True, capture_output=True, text=True)
        scales = self.check(out)
        # the subnormal scales really are short numbers padded to 8 digits
        with open(out, encoding="utf-8") as f:
            text = f.read()
        self.assertIn("subnormal: 0055", text)
        self.assertEqual(struct.pack("!f", scales["deep_subnormal"]).hex()[:6], "000000")

    def test_cli_trt10_header_and_every_format_run(self):
        out = os.path.join(self.tmp.name, "out")
        subprocess.run([BIN, "calibrate", self.dump, "-o", out, "--format", "json,tensorrt",
                        "--observer", "minmax", "--trt-version", "100300"], check=True,
                       capture_output=True, text=True)
        header, _ = modelopt_read(os.path.join(out, "tensorrt.cache"))
        self.assertEqual(header, "TRT-100300-MinMaxCalibration")
        self.check(os.path.join(out, "tensorrt.cache"))

    def test_python_table_cache(self):
        s = qcal.Session(observer="minmax")
        for name, x in TENSORS.items():
            s.observe(name, x)
        out = os.path.join(self.tmp.name, "py.cache")
        s.table().write(out, format="tensorrt")
        self.check(out)
        self.assertEqual(qcal.calibrate(self.dump, observer="minmax").format("tensorrt"),
                         open(out, encoding="utf-8").read())


if __name__ == "__main__":
    unittest.main()
