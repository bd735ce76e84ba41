#!/usr/bin/python3
"""PyTorch 1.13 side of qcal's benchmark: times the same operations as bench/qcal_bench.c on
the same sizes with the same thread count and prints one JSON object per operation.

Usage (run with /usr/bin/python3, Debian's python3-torch):
    torch_ref.py --threads T OP=ELEMENTS [OP=ELEMENTS ...] [--quick]
    torch_ref.py --threads T --op OP --elements N
    torch_ref.py --threads T --serve     (prints {"ready": true} once torch is imported, then
                                          reads "OP ELEMENTS [BUDGET_S]" lines on stdin and
                                          answers each with one JSON line; qcal_bench
                                          interleaves PyTorch and qcal samples in pairs)
Output lines: {"op", "threads", "elements", "median_s", "min_s", "max_s", "reps"} (seconds per
call; warm-up, then the median of repeats), or {"op", "error"} for an unknown op or a
size that does not match the op's shape. Data: standard normal (torch.manual_seed(0));
the histogram batches are N(0,1) * (1 + b), b = 0..7 (a growing range), as in the C bench.
"""
import argparse
import json
import sys
import time

import torch
from torch.ao.quantization import observer as obs_mod

M1 = 1 << 20
M16 = 16 << 20

SHAPES = {
    "minmax": (M16,),
    "moving_average_minmax": (M16,),
    "per_channel_minmax_4096x4096_axis0": (4096, 4096),
    "per_channel_minmax_32x256x32x32_axis1": (32, 256, 32, 32),
    "ma_per_channel_minmax_4096x4096_axis0": (4096, 4096),
    "ma_per_channel_minmax_32x256x32x32_axis1": (32, 256, 32, 32),
    "histogram_update": (8, M1),
    "histogram_qparams": (2048,),
    "quantize_per_tensor": (M16,),
    "dequantize_per_tensor": (M16,),
    "quantize_per_channel": (4096, 4096),
    "quantize_per_channel_last_axis": (4096, 4096),
    "dequantize_per_channel": (4096, 4096),
    "fakequant_forward": (M16,),
    "fakequant_per_channel_forward": (4096, 4096),
    "fakequant_forward_backward": (M16,),
    "learnable_backward": (M16,),
    "stats_logger": (M16,),
    "int8_cnn": (10000, 1, 28, 28),   # any multiple of 784 elements: (elements / 784, 1, 28, 28)
}


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def measure(fn, budget, quick, paired=False):
    """Warm-up, then samples of `inner` calls (>= ~2 ms each); per-call median/min/max."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    inner = 1
    if first < 2e-3:
        t0 = time.perf_counter()
        fn()
        t1 = max(time.perf_counter() - t0, 1e-8)
        inner = min(int(2e-3 / t1) + 1, 100000)
    elif first < 0.3:
        fn()
    reps = int(budget / (max(first, 1e-9) * inner))
    lo, hi = (3, 9) if quick or paired else (7, 41)
    reps = max(lo, min(hi, reps))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    samples.sort()
    return samples[len(samples) // 2], samples[0], samples[-1], reps


_int8_cnn = None


def int8_cnn_model():
    """The demo CNN (examples/cnn) converted by FX post-training quantization with the onednn
    backend (PyTorch's int8 engine on x86 VNNI): random weights, calibrated on 64 images.
    Built once per process and cached (conversion takes seconds)."""
    global _int8_cnn
    if _int8_cnn is None:
        from torch import nn
        from torch.ao.quantization import get_default_qconfig_mapping
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
                self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
                self.relu1, self.relu2, self.relu3 = nn.ReLU(), nn.ReLU(), nn.ReLU()
                self.pool = nn.MaxPool2d(2)
                self.fc1 = nn.Linear(3136, 128)
                self.fc2 = nn.Linear(128, 10)

            def forward(self, x):   # conv + ReLU and linear + ReLU fuse in FX's convert
                x = self.pool(self.relu1(self.conv1(x)))
                x = self.pool(self.relu2(self.conv2(x)))
                x = torch.flatten(x, 1)
                return self.fc2(self.relu3(self.fc1(x)))

        torch.backends.quantized.engine = "onednn"
        ex = torch.randn(64, 1, 28, 28)
        m = prepare_fx(Net().eval(), get_default_qconfig_mapping("onednn"), (ex,))
        with torch.no_grad():
            m(ex)
        _int8_cnn = convert_fx(m)
    return _int8_cnn


def make_op(op, x):
    """Returns a zero-argument callable doing one call of op on x."""
    if op == "int8_cnn":
        q = int8_cnn_model()
        return lambda: q(x)
    if op == "minmax":
        o = obs_mod.MinMaxObserver()
        return lambda: (o.reset_min_max_vals(), o(x))
    if op == "moving_average_minmax":
        o = obs_mod.MovingAverageMinMaxObserver()
        o(x)
        return lambda: o(x)
    if op.startswith("per_channel_minmax") or op.startswith("ma_per_channel_minmax"):
        axis = 0 if op.endswith("axis0") else 1
        cls = (obs_mod.MovingAveragePerChannelMinMaxObserver if op.startswith("ma_")
               else obs_mod.PerChannelMinMaxObserver)
        o = cls(ch_axis=axis, dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
        o(x)
        return lambda: o(x)
    if op == "histogram_update":
        batches = [x[b] * float(1 + b) for b in range(8)]

        def run():
            o = obs_mod.HistogramObserver()
            for b in batches:
                o(b)
        return run
    if op == "histogram_qparams":
        src = torch.randn(8, M1)
        o = obs_mod.HistogramObserver()
        for b in range(8):
            o(src[b] * float(1 + b))
        return lambda: o.calculate_qparams()
    mm = obs_mod.MinMaxObserver()
    mm(x)
    scale, zp = mm.calculate_qparams()
    scale, zp = float(scale), int(zp)
    if op in ("quantize_per_tensor", "dequantize_per_tensor"):
        if op == "quantize_per_tensor":
            return lambda: torch.quantize_per_tensor(x, scale, zp, torch.quint8)
        q = torch.quantize_per_tensor(x, scale, zp, torch.quint8)
        return lambda: q.dequantize()
    if x.dim() == 2:
        pc = obs_mod.PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                              qscheme=torch.per_channel_symmetric)
        pc(x)
        scales, zps = pc.calculate_qparams()
    if op == "quantize_per_channel":
        return lambda: torch.quantize_per_channel(x, scales, zps, 0, torch.qint8)
    if op == "quantize_per_channel_last_axis":
        # the same 4096 scales along axis 1 (as the C bench)
        return lambda: torch.quantize_per_channel(x, scales, zps, 1, torch.qint8)
    if op == "dequantize_per_channel":
        q = torch.quantize_per_channel(x, scales, zps, 0, torch.qint8)
        return lambda: q.dequantize()
    if op == "fakequant_forward":
        return lambda: torch.fake_quantize_per_tensor_affine(x, scale, zp, 0, 255)
    if op == "fakequant_per_channel_forward":
        zpi = zps.to(torch.int32)
        return lambda: torch.fake_quantize_per_channel_affine(x, scales, zpi, 0, -128, 127)
    if op == "fakequant_forward_backward":
        xg = x.clone().requires_grad_(True)
        g = torch.randn_like(x)

        def run():
            xg.grad = None
            y = torch.fake_quantize_per_tensor_affine(xg, scale, zp, 0, 255)
            y.backward(g)
        return run
    if op == "learnable_backward":
        xg = x.clone().requires_grad_(True)
        s = torch.tensor([scale], requires_grad=True)
        z = torch.tensor([float(zp) + 0.3], requires_grad=True)
        g = torch.randn_like(x)
        y = torch._fake_quantize_learnable_per_tensor_affine(xg, s, z, 0, 255, 1.0)
        return lambda: torch.autograd.grad(y, [xg, s, z], g, retain_graph=True)
    if op == "stats_logger":
        # the statistics qcal's logger computes in one pass: min, max, absmax, mean, std
        return lambda: (torch.aminmax(x), x.abs().max(), torch.std_mean(x))
    return None


_cache = {}


def run_one(op, n, threads, quick, budget=None):
    """Times one op; returns the JSON object (with "error" on failure). The op and its data
    are kept for the next request of the same op (qcal_bench asks for several paired
    samples of a row in a row)."""
    out = {"op": op, "threads": threads, "elements": n}
    shape = SHAPES.get(op)
    if op == "int8_cnn" and n is not None and n > 0 and n % 784 == 0:
        shape = (n // 784, 1, 28, 28)
    if shape is None:
        out["error"] = "unknown op"
    elif n is not None and n != numel(shape):
        out["error"] = "elements %d do not match the op's shape %s" % (n, list(shape))
    else:
        try:
            if _cache.get("op") != op:
                _cache.clear()
                x = torch.randn(*shape) if op != "histogram_qparams" else None
                _cache.update(op=op, fn=make_op(op, x), x=x)
            fn = _cache["fn"]
            budget_given = budget is not None
            if budget is None:
                budget = 0.2 if quick else 0.8
            with torch.no_grad() if "backward" not in op else torch.enable_grad():
                med, mn, mx, reps = measure(fn, budget, quick, paired=budget_given)
            out.update(median_s=med, min_s=mn, max_s=mx, reps=reps)
        except Exception as e:  # reported per op; the other ops still run
            _cache.clear()
            out["error"] = "%s: %s" % (type(e).__name__, e)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--op")
    ap.add_argument("--elements", type=int)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("ops", nargs="*", help="OP=ELEMENTS")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    todo = []
    if a.op:
        todo.append((a.op, a.elements))
    for spec in a.ops:
        name, _, n = spec.partition("=")
        todo.append((name, int(n) if n else None))
    for op, n in todo:
        print(json.dumps(run_one(op, n, a.threads, a.quick)), flush=True)
    if a.serve:
        print(json.dumps({"ready": True, "torch": torch.__version__}), flush=True)
        for line in sys.stdin:
            parts = line.split()
            if not parts:
                continue
            n = int(parts[1]) if len(parts) > 1 else None
            budget = float(parts[2]) if len(parts) > 2 else None
            print(json.dumps(run_one(parts[0], n, a.threads, a.quick, budget)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
