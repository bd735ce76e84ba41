"""FP8 serving checkpoints end to end on a small Llama-shaped decoder (suite python).

tests/data/llama/tinyllama.safetensors (tests/python/tinyllama.py, trained on Debian's licence
texts) -> qcal.torch.add_activation_loggers dumps every decoder linear's input (and the k/v
projections' outputs) over held-out calibration text -> `qcal calibrate --format
compressed-tensors` (and modelopt) -> the checkpoint is read back with numpy only (the
safetensors header parsed by hand, float8_e4m3fn decoded from its bit fields), every name,
dtype and shape checked against the layout of docs/fp8.md, and the model is run with the
dequantized FP8 weights and FP8 fake-quantized linear inputs (and k/v outputs: the FP8 KV
cache): next-token logits' cosine with float >= 0.995 and held-out loss within 2%.
Prints the figures per observer, and int8 per-channel weights for comparison.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("skipped: PyTorch (python3-torch) is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinyllama as T  # noqa: E402

import qcal.torch as qt  # noqa: E402

BIN = os.environ.get("QCAL_BIN")
DATA = os.environ.get("QCAL_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
MODEL = os.path.join(DATA, "llama", "tinyllama.safetensors")
CONFIG = os.path.join(DATA, "llama", "config.json")
CTX = T.CONFIG["ctx"]
CALIB_WINDOWS, EVAL_WINDOWS = 32, 96
OBSERVERS = ["minmax", "histogram", "percentile", "entropy", "mse"]
PROJ = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


# ---- an independent float8_e4m3fn codec (bit fields, no qcal) --------------------------

def e4m3_values():
    """The 256 codes' values: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7F/0xFF NaN."""
    c = np.arange(256)
    s = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = c & 7
    v = np.where(e == 0, m / 8.0 * 2.0 ** -6, (1 + m / 8.0) * 2.0 ** (e - 7.0)) * s
    v[(c & 0x7F) == 0x7F] = np.nan
    return v


LUT = e4m3_values()
GRID = LUT[:127]          # codes 0..126: every finite non-negative value, increasing


def e4m3_round(v):
    """v (float64) to the nearest E4M3 value, ties to the even code, saturating at 448."""
    a = np.minimum(np.abs(v), 448.0)
    hi = np.clip(np.searchsorted(GRID, a), 1, 126)
    lo = hi - 1
    dlo, dhi = a - GRID[lo], GRID[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.sign(v) * GRID[pick]


def fake_fp8(x, scale):
    """FP8 fake-quant of a float32 tensor with a per-tensor scale: round(x / s) * s."""
    q = e4m3_round((x.double() / float(scale)).numpy())
    return torch.from_numpy((q * float(scale)).astype(np.float32))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_json(path):
    with open(path) as f:
        return json.load(f)


def vllm_quant_config(model_dir):
    """How vLLM decides the quantization of a local model directory, transcribed (no vllm
    import: it needs CUDA, transformers 5): returns (quant_method, config), config the fields
    ModelOptFp8Config is built from, or (None, None) for an unquantized model.

    - vllm/transformers_utils/config.py get_config: quantization_config from config.json;
      when it has none and hf_quant_config.json exists, that file's dict.
    - vllm/config/model.py ModelConfig._parse_quant_hf_config: producer.name "modelopt"
      sets quant_method "modelopt" (quant_algo FP8) or "modelopt_fp4" (NVFP4); another
      ModelOpt quant_algo raises. Then _verify_quantization lower-cases quant_method and
      asks the override methods, among them ModelOptFp8Config.override_quantization_method
      (model_executor/layers/quantization/modelopt.py: quant_method starting with
      "modelopt" and quantization.quant_algo upper-cased "FP8" -> "modelopt").
    - model_executor/model_loader/weight_utils.py get_quant_config passes the dict hf_config
      carries (get_config put it there) to from_config; its fallback that reads the file
      itself requires producer.name "modelopt" as well.
    - modelopt.py ModelOptQuantConfigBase.from_config: quantization.quant_algo (required,
      upper-cased, one of QUANT_ALGOS), kv_cache_quant_algo (None or a string,
      upper-cased), exclude_modules (a list, default []); ModelOptFp8Config._from_config:
      is_checkpoint_fp8_serialized = "FP8" in quant_algo; quant_algo "FP8" is the
      per-tensor ModelOptFp8LinearMethod (weight_scale, input_scale per tensor)."""
    cfg = read_json(os.path.join(model_dir, "config.json"))
    quant_cfg = cfg.get("quantization_config")
    hq = os.path.join(model_dir, "hf_quant_config.json")
    if quant_cfg is None and os.path.exists(hq):
        quant_cfg = read_json(hq)
    if quant_cfg is None:
        return None, None
    if quant_cfg.get("producer", {}).get("name") == "modelopt":
        algo = quant_cfg.get("quantization", {}).get("quant_algo")
        if algo == "FP8":
            quant_cfg["quant_method"] = "modelopt"
        elif algo == "NVFP4":
            quant_cfg["quant_method"] = "modelopt_fp4"
        elif algo is not None:
            raise ValueError("Unknown ModelOpt quant algo: %s" % algo)
    method = quant_cfg.get("quant_method", "").lower().replace("compressed_tensors",
                                                               "compressed-tensors")
    quant_cfg["quant_method"] = method
    if (method.startswith("modelopt") and isinstance(quant_cfg.get("quantization"), dict)
            and str(quant_cfg["quantization"].get("quant_algo", "")).upper() == "FP8"):
        method = "modelopt"
    if method != "modelopt":
        return method or None, None
    q = quant_cfg["quantization"]
    algo = q.get("quant_algo")
    if not algo:
        raise ValueError("Missing 'quant_algo' in quantization config")
    algo = str(algo).upper()
    kv = q.get("kv_cache_quant_algo")
    if kv is not None and not isinstance(kv, str):
        raise ValueError("kv_cache_quant_algo must be a string")
    exclude = q.get("exclude_modules", [])
    if not isinstance(exclude, list):
        raise ValueError("exclude_modules must be a list")
    if algo not in ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4",
                    "MXFP8", "MIXED_PRECISION"):
        raise ValueError("ModelOpt does not support %s in vLLM" % algo)
    return method, {"quant_method": algo, "is_checkpoint_fp8_serialized": "FP8" in algo,
                    "kv_cache_quant_method": kv.upper() if kv else None,
                    "exclude_modules": exclude}


def read_safetensors(path):
    """{name: (dtype, shape, raw bytes)} and the metadata, parsed with struct/json/numpy."""
    raw = read_bytes(path)
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8: 8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    out, end = {}, 0
    for name, info in header.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], tuple(info["shape"]), raw[8 + n + b: 8 + n + e])
        end = max(end, e)
    assert 8 + n + end == len(raw), "data section must end at the last tensor"
    return out, meta


def f32(entry):
    dtype, shape, b = entry
    assert dtype == "F32"
    return np.frombuffer(b, dtype="<f4").reshape(shape)


# ---- the model under test ----------------------------------------------------------------

def run_quantized(model, tensors, x, weight_fn, act_fn, kv=True):
    """Loss and logits of model with weight_fn(name) -> float weights for every quantized
    linear and act_fn(name, input) on their inputs (and the k/v outputs when kv)."""
    hooks = []
    saved = {}
    for layer in range(T.CONFIG["layers"]):
        for p in PROJ:
            mname = "model.layers.%d.%s" % (layer, p)
            mod = model.get_submodule(mname)
            saved[mname] = mod.weight.data
            mod.weight.data = weight_fn(mname)
            hooks.append(mod.register_forward_pre_hook(
                lambda m, a, n=mname: (act_fn(n, a[0]),)))
            if kv and p in ("self_attn.k_proj", "self_attn.v_proj"):
                attn = "model.layers.%d.self_attn" % layer
                key = attn + (".k_scale" if p.endswith("k_proj") else ".v_scale")
                hooks.append(mod.register_forward_hook(
                    lambda m, a, out, key=key: fake_fp8(out, f32(tensors[key]).reshape(-1)[0])))
    try:
        with torch.no_grad():
            logits = model(x)
    finally:
        for h in hooks:
            h.remove()
        for mname, w in saved.items():
            model.get_submodule(mname).weight.data = w
    return logits


def loss_of(logits, y):
    return F.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).item()


def cosine(a, b):
    a, b = a.double().reshape(-1), b.double().reshape(-1)
    return float(a @ b / (a.norm() * b.norm()))


@unittest.skipIf(BIN is None, "QCAL_BIN not set")
class LlamaFP8(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        torch.set_num_threads(1)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = cls.tmp.name
        cls.model = T.load_model(MODEL)
        xc, _ = T.windows(T.text_bytes(T.CALIB_FILES), CTX)
        xe, ye = T.windows(T.text_bytes(T.EVAL_FILES), CTX)
        cls.xe, cls.ye = xe[:EVAL_WINDOWS], ye[:EVAL_WINDOWS]
        with torch.no_grad():
            cls.float_logits = cls.model(cls.xe)
        cls.float_loss = loss_of(cls.float_logits, cls.ye)
        # The dump: every decoder linear's input, the k/v projections' outputs.
        cls.dump = os.path.join(cls.dir, "dump")
        h = qt.add_activation_loggers(cls.model, names=["model.layers.*"],
                                      outputs=["*.k_proj", "*.v_proj"], dump_dir=cls.dump)
        with torch.no_grad():
            for b in range(0, CALIB_WINDOWS, 8):
                cls.model(xc[b: b + 8])
        h.remove()
        cls.results = {}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def calibrate(self, out, fmt, *extra):
        cmd = [BIN, "calibrate", self.dump, "--weights", MODEL, "--dtype", "float8_e4m3fn",
               "-o", out, "--format", fmt] + list(extra)
        r = subprocess.run(cmd, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def check_layout(self, tensors, scalar_shape, wscale_shape=None):
        """Every name, dtype and shape of the checkpoint against the float model."""
        src, _ = read_safetensors(MODEL)
        expect = {}
        for name, (dtype, shape, _) in src.items():
            expect[name] = (dtype, shape)
        for layer in range(T.CONFIG["layers"]):
            for p in PROJ:
                m = "model.layers.%d.%s" % (layer, p)
                shape = src[m + ".weight"][1]
                expect[m + ".weight"] = ("F8_E4M3", shape)
                expect[m + ".weight_scale"] = ("F32", wscale_shape(shape) if wscale_shape
                                               else scalar_shape)
                expect[m + ".input_scale"] = ("F32", scalar_shape)
            attn = "model.layers.%d.self_attn" % layer
            expect[attn + ".k_scale"] = ("F32", scalar_shape)
            expect[attn + ".v_scale"] = ("F32", scalar_shape)
        got = {n: (d, s) for n, (d, s, _) in tensors.items()}
        self.assertEqual(got, expect)
        # Tensors that are not quantized are the same bytes.
        for name, (dtype, shape, b) in src.items():
            if tensors[name][0] != "F8_E4M3":
                self.assertEqual(tensors[name][2], b, name)
        # Each input scale is a positive float32; weights decode to finite values.
        for name, (dtype, shape, b) in tensors.items():
            if name.endswith("_scale"):
                v = f32(tensors[name])
                self.assertTrue(np.all(v > 0) and np.all(np.isfinite(v)), name)
            if dtype == "F8_E4M3":
                codes = np.frombuffer(b, dtype=np.uint8)
                self.assertFalse(np.any((codes & 0x7F) == 0x7F), name + " holds NaN codes")
                w = src[name]
                wf = np.frombuffer(w[2], dtype="<f4").reshape(w[1])
                ws = f32(tensors[name[:-len("weight")] + "weight_scale"]).reshape(-1, 1)
                deq = LUT[codes].reshape(shape) * ws
                # each weight within half a step of E4M3 (relative 2^-4) or a subnormal step
                err = np.abs(deq - wf)
                bound = np.maximum(np.abs(wf) * 2.0 ** -4, ws * 2.0 ** -10) * 1.0001
                self.assertTrue(np.all(err <= bound), name)

    def evaluate(self, tensors, int8=False):
        """(loss, cosine) of the FP8 checkpoint (or int8 per-channel weights and int8
        per-tensor symmetric inputs from the same observer ranges when int8)."""
        def wfn(m):
            codes = np.frombuffer(tensors[m + ".weight"][2], dtype=np.uint8)
            shape = tensors[m + ".weight"][1]
            ws = f32(tensors[m + ".weight_scale"]).reshape(-1, 1)
            if not int8:
                return torch.from_numpy((LUT[codes].reshape(shape) * ws).astype(np.float32))
            w = self.model.get_submodule(m).weight.detach().double().numpy()
            s = np.maximum(np.abs(w).max(axis=1, keepdims=True) / 127.0, 1e-12)
            return torch.from_numpy((np.clip(np.round(w / s), -127, 127) * s).astype(np.float32))

        def afn(m, x):
            s = float(f32(tensors[m + ".input_scale"]).reshape(-1)[0])
            if not int8:
                return fake_fp8(x, s)
            s8 = s * 448.0 / 127.0   # the same amax over int8's 127
            return (torch.clamp(torch.round(x.double() / s8), -127, 127) * s8).float()

        logits = run_quantized(self.model, tensors, self.xe, wfn, afn, kv=not int8)
        return loss_of(logits, self.ye), cosine(logits[:, -1], self.float_logits[:, -1])

    def test_1_loggers_left_no_trace(self):
        for name, m in self.model.named_modules():
            self.assertFalse(m._forward_pre_hooks, name)
            self.assertFalse(m._forward_hooks, name)
        names = sorted(os.listdir(self.dump))
        self.assertEqual(len(names), T.CONFIG["layers"] * (len(PROJ) + 2))
        self.assertIn("model.layers.0.self_attn.k_proj.output", names)

    def test_2_compressed_tensors_every_observer(self):
        rows = []
        for obs in OBSERVERS:
            out = os.path.join(self.dir, "ct_" + obs)
            self.calibrate(out, "compressed-tensors", "--observer", obs)
            tensors, meta = read_safetensors(os.path.join(out, "tinyllama.safetensors"))
            self.assertEqual(sorted(os.listdir(out)), ["config.json", "tinyllama.safetensors"])
            self.check_layout(tensors, (1,))
            cfg = read_json(os.path.join(out, "config.json"))
            src_cfg = read_json(CONFIG)
            for k, v in src_cfg.items():
                self.assertEqual(cfg[k], v)
            q = cfg["quantization_config"]
            self.assertEqual(q["quant_method"], "compressed-tensors")
            self.assertEqual(q["format"], "float-quantized")
            self.assertEqual(q["ignore"], ["lm_head"])
            g = q["config_groups"]["group_0"]
            self.assertEqual(g["targets"], ["Linear"])
            for part in ("weights", "input_activations"):
                self.assertEqual(g[part], {"num_bits": 8, "type": "float", "strategy": "tensor",
                                           "symmetric": True, "dynamic": False})
            self.assertEqual(q["kv_cache_scheme"]["type"], "float")
            loss, cos = self.evaluate(tensors)
            loss8, cos8 = self.evaluate(tensors, int8=True)
            rows.append((obs, loss, cos, loss8, cos8))
            self.results[obs] = (loss, cos)
        print("\nfloat held-out loss %.4f nats/byte (%d windows of %d bytes)"
              % (self.float_loss, EVAL_WINDOWS, CTX))
        print("%-10s %12s %10s %16s %10s" % ("observer", "FP8 loss", "FP8 cos",
                                             "int8 W/ch loss", "int8 cos"))
        for obs, loss, cos, loss8, cos8 in rows:
            print("%-10s %8.4f(%+.2f%%) %10.6f %10.4f(%+.2f%%) %10.6f"
                  % (obs, loss, 100 * (loss / self.float_loss - 1), cos, loss8,
                     100 * (loss8 / self.float_loss - 1), cos8))
        best = min(rows, key=lambda r: r[1])
        print("lowest FP8 loss: %s" % best[0])
        # The contract: the default min/max scales and the best observer both hold.
        for obs in ("minmax", best[0]):
            loss, cos = self.results[obs]
            self.assertGreaterEqual(cos, 0.995, obs)
            self.assertLessEqual(abs(loss / self.float_loss - 1), 0.02, obs)

    def test_3_per_channel(self):
        out = os.path.join(self.dir, "ct_channel")
        self.calibrate(out, "compressed-tensors", "--weight-scale", "channel")
        tensors, _ = read_safetensors(os.path.join(out, "tinyllama.safetensors"))
        self.check_layout(tensors, (1,), wscale_shape=lambda s: (s[0], 1))
        q = read_json(os.path.join(out, "config.json"))["quantization_config"]
        self.assertEqual(q["config_groups"]["group_0"]["weights"]["strategy"], "channel")
        loss, cos = self.evaluate(tensors)
        print("\ncompressed-tensors, per-channel weight scales: loss %.4f (%+.2f%%), cos %.6f"
              % (loss, 100 * (loss / self.float_loss - 1), cos))
        self.assertGreaterEqual(cos, 0.995)
        self.assertLessEqual(abs(loss / self.float_loss - 1), 0.02)

    def test_3_modelopt_fused_max(self):
        out = os.path.join(self.dir, "mo")
        self.calibrate(out, "modelopt", "--fused-input-scale", "max")
        self.assertEqual(sorted(os.listdir(out)),
                         ["config.json", "hf_quant_config.json", "tinyllama.safetensors"])
        tensors, _ = read_safetensors(os.path.join(out, "tinyllama.safetensors"))
        self.check_layout(tensors, ())
        hq = read_json(os.path.join(out, "hf_quant_config.json"))
        self.assertEqual(hq["quantization"], {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                                              "exclude_modules": ["lm_head"]})
        self.assertEqual(read_json(os.path.join(out, "config.json")),
                         read_json(CONFIG))
        # vLLM's loader takes it for ModelOpt FP8 (per-tensor linear method, FP8 KV cache)
        self.assertEqual(hq["producer"]["name"], "modelopt")
        self.assertEqual(hq["quantized_by"]["name"], "qcal")
        method, vq = vllm_quant_config(out)
        self.assertEqual(method, "modelopt")
        self.assertEqual(vq, {"quant_method": "FP8", "is_checkpoint_fp8_serialized": True,
                              "kv_cache_quant_method": "FP8", "exclude_modules": ["lm_head"]})
        for layer in range(T.CONFIG["layers"]):
            pre = "model.layers.%d." % layer
            qkv = [float(f32(tensors[pre + "self_attn.%s_proj.input_scale" % p])) for p in "qkv"]
            gu = [float(f32(tensors[pre + "mlp.%s_proj.input_scale" % p])) for p in ("gate", "up")]
            self.assertEqual(len(set(qkv)), 1)
            self.assertEqual(len(set(gu)), 1)
        loss, cos = self.evaluate(tensors)
        print("\nmodelopt, fused max: loss %.4f (%+.2f%%), cos %.6f"
              % (loss, 100 * (loss / self.float_loss - 1), cos))
        self.assertGreaterEqual(cos, 0.995)
        self.assertLessEqual(abs(loss / self.float_loss - 1), 0.02)

    def test_4_all_or_none(self):
        # A checkpoint over an existing one that fails (config.json already quantized) leaves
        # the old files as they were and no temporary.
        out = os.path.join(self.dir, "keep")
        self.calibrate(out, "compressed-tensors")
        before = {f: read_bytes(os.path.join(out, f)) for f in os.listdir(out)}
        bad = os.path.join(self.dir, "quantized_config.json")
        with open(bad, "w") as f:
            json.dump({"quantization_config": {"quant_method": "fp8"}}, f)
        r = subprocess.run([BIN, "calibrate", self.dump, "--weights", MODEL, "--dtype",
                            "float8_e4m3fn", "-o", out, "--format", "compressed-tensors",
                            "--weight-scale", "channel", "--model-config", bad],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("already has a quantization_config", r.stderr)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        after = {f: read_bytes(os.path.join(out, f)) for f in os.listdir(out)}
        self.assertEqual(before, after)
        # ModelOpt's FP8 is per tensor: per-channel weight scales are a usage error.
        r = subprocess.run([BIN, "calibrate", self.dump, "--weights", MODEL, "-o", out,
                            "--format", "modelopt", "--weight-scale", "channel"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        # E5M2 weights are refused before any work.
        r = subprocess.run([BIN, "calibrate", self.dump, "--weights", MODEL, "--dtype",
                            "float8_e5m2", "-o", out, "--format", "modelopt"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(before, {f: read_bytes(os.path.join(out, f))
                                  for f in os.listdir(out)})


if __name__ == "__main__":
    unittest.main(verbosity=2)
