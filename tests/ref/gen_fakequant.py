#!/usr/bin/python3
"""Reference vectors for qcal's fake-quant kernels and FakeQuantize object, from PyTorch 1.13.

Run with the system interpreter that has torch: /usr/bin/python3 tests/ref/gen_fakequant.py
Writes tests/data/fakequant/kernels.bin and tests/data/fakequant/object.bin (little-endian):

kernels.bin: b"QFQK" u32 version=1 u32 ncases, then per case:
  u32 name_len, name bytes, u32 kind (0 per-tensor, 1 per-channel, 2 learnable per-tensor,
  3 learnable per-channel), i32 axis, i64 quant_min, i64 quant_max, f32 grad_factor,
  u32 ndim, i64 shape[ndim], u32 nch,
  f32 x[numel], f32 scale[nch], f32 zero_point[nch], f32 y[numel], u8 mask[numel],
  f32 gy[numel], f32 gx[numel], f32 grad_scale[nch], f32 grad_zero_point[nch]
  (kinds 0/1: mask is PyTorch's cachemask, gx = gy * mask; grads 0. Kinds 2/3: mask is
  gx != 0 or gy == 0 ... unused (all 0); gx/grad_scale/grad_zero_point from autograd.)

object.bin: b"QFQO" u32 version=1 u32 ncases, then per case:
  u32 name_len, name, u32 preset (0 activation, 1 weight per-channel, 2 learnable
  activation), u32 ndim, i64 shape[ndim], u32 nsteps, then per step:
  u8 observer_enabled, u8 fake_quant_enabled, u8 learning (learnable: param learning),
  u8 pad, f32 x[numel], f32 gy[numel], f32 y[numel], f32 gx[numel], u32 nch,
  f32 scale[nch], f32 zero_point[nch], f32 grad_scale[nch], f32 grad_zero_point[nch]
"""
import math
import os
import struct
import sys

import numpy as np
import torch

torch.set_num_threads(1)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "fakequant")
rng = np.random.default_rng(20240613)
f32 = np.float32


def arr(a, dt):
    return np.ascontiguousarray(np.asarray(a, dtype=dt)).tobytes()


cases = []


def add_case(name, kind, x, scale, zp, qmin, qmax, axis=0, grad_factor=1.0, gy=None):
    x = np.asarray(x, dtype=f32)
    scale = np.atleast_1d(np.asarray(scale, dtype=f32))
    zp = np.atleast_1d(np.asarray(zp, dtype=f32))
    if gy is None:
        gy = rng.standard_normal(x.shape).astype(f32)
    # PyTorch 1.13's fake-quant ops reject negative axes; qcal resolves them (the case keeps
    # the negative axis for qcal, torch gets axis % ndim).
    X = torch.from_numpy(x.copy())
    GY = torch.from_numpy(gy.copy())
    mask = np.zeros(x.shape, np.uint8)
    gs = np.zeros(scale.shape, f32)
    gz = np.zeros(scale.shape, f32)
    if kind == 0:
        y, m = torch.ops.aten.fake_quantize_per_tensor_affine_cachemask(
            X, float(scale[0]), int(zp[0]), qmin, qmax)
        mask = m.numpy().astype(np.uint8)
        gx = (GY * m).numpy()
    elif kind == 1:
        y, m = torch.ops.aten.fake_quantize_per_channel_affine_cachemask(
            X, torch.from_numpy(scale), torch.from_numpy(zp.astype(np.int32)), axis % x.ndim, qmin, qmax)
        mask = m.numpy().astype(np.uint8)
        gx = (GY * m).numpy()
    else:
        Xg = X.clone().requires_grad_()
        S = torch.from_numpy(scale.copy()).requires_grad_()
        Z = torch.from_numpy(zp.copy()).requires_grad_()
        if kind == 2:
            y = torch._fake_quantize_learnable_per_tensor_affine(Xg, S, Z, qmin, qmax, grad_factor)
        else:
            y = torch._fake_quantize_learnable_per_channel_affine(Xg, S, Z, axis % x.ndim, qmin, qmax,
                                                                 grad_factor)
        y.backward(GY)
        y = y.detach()
        gx = Xg.grad.numpy()
        gs = S.grad.numpy()
        gz = Z.grad.numpy()
    cases.append((name, kind, axis, qmin, qmax, grad_factor, x, scale, zp, y.numpy(), mask, gy,
                  gx, gs, gz))


def ties(scale, zp, kmin, kmax):
    k = np.arange(kmin, kmax, dtype=np.float64)
    return ((k + 0.5) * float(scale)).astype(f32)


def around(v):
    """v and its float neighbours (+-1, +-2 ulps)."""
    v = np.atleast_1d(np.asarray(v, f32))
    out = [v]
    for d in (1, 2):
        out.append(np.nextafter(v, f32(np.inf)))
        out.append(np.nextafter(v, f32(-np.inf)))
        v = out[-2]
    return np.concatenate(out)


# ---- per tensor ----
s = f32(0.5)
add_case("pt_ties_pow2_quint8", 0, np.concatenate([ties(s, 3, -20, 270), -ties(s, 3, 0, 30)]),
         s, 3, 0, 255)
s = f32(0.1)
add_case("pt_ties_0.1_quint8", 0, np.concatenate([ties(s, 100, -120, 170), -ties(s, 0, 0, 40)]),
         s, 100, 0, 255)
s, z = f32(0.0173), 37
edges = np.concatenate([around(f32((0 - z - 0.5) * s)), around(f32((255 - z + 0.5) * s)),
                        around(f32((0 - z) * s)), around(f32((255 - z) * s)),
                        np.array([-1e3, 1e3, -5.0, 5.0], f32)])
add_case("pt_clamp_edges_quint8", 0, edges, s, z, 0, 255)
special = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, -3e38, 3e9, -3e9, 0.0, -0.0,
                    1e-45, -1e-45, 0.25, -0.25, 1.0], f32)
add_case("pt_nonfinite_quint8", 0, special, f32(0.02), 10, 0, 255)
add_case("pt_nonfinite_qint8", 0, special, f32(0.02), -5, -128, 127)
eps = np.finfo(np.float32).eps
add_case("pt_scale_eps", 0, rng.uniform(-4e-5, 4e-5, 301).astype(f32), f32(eps), 128, 0, 255)
add_case("pt_scale_tiny", 0, rng.uniform(-1e-7, 1e-7, 301).astype(f32), f32(2.0 ** -40), 0,
         -128, 127)
xr = rng.normal(0, 2, 517).astype(f32)
add_case("pt_zp_min_quint8", 0, xr, f32(0.013), 0, 0, 255)
add_case("pt_zp_max_quint8", 0, xr, f32(0.013), 255, 0, 255)
add_case("pt_zp_min_qint8", 0, xr, f32(0.021), -128, -128, 127)
add_case("pt_zp_max_qint8", 0, xr, f32(0.021), 127, -128, 127)
add_case("pt_reduced_quint8", 0, xr, f32(0.03), 64, 0, 127)
add_case("pt_4bit_unsigned", 0, xr, f32(0.25), 8, 0, 15)
add_case("pt_4bit_signed", 0, xr, f32(0.3), 0, -8, 7)
add_case("pt_random_4099", 0, rng.normal(0.5, 1.5, 4099).astype(f32), f32(0.0117), 40, 0, 255)

# ---- per channel ----
def pc_case(name, shape, axis, qmin, qmax, symmetric):
    x = rng.normal(0, 1.5, shape).astype(f32)
    x.flat[::17] = ((rng.integers(-60, 60, x.flat[::17].size) + 0.5) * 0.125).astype(f32)
    ch = shape[axis]
    scale = rng.uniform(0.005, 0.05, ch).astype(f32)
    scale[0] = f32(0.125)
    if symmetric:
        zp = np.zeros(ch, f32) if qmin < 0 else np.full(ch, (qmin + qmax + 1) // 2, f32)
    else:
        zp = rng.integers(qmin, qmax + 1, ch).astype(f32)
        zp[-1] = qmax
        if ch > 2:
            zp[1] = qmin
    add_case(name, 1, x, scale, zp, qmin, qmax, axis=axis)


pc_case("pc_axis0_qint8_sym", (6, 4, 3, 3), 0, -128, 127, True)
pc_case("pc_axis1_quint8", (3, 7, 5), 1, 0, 255, False)
pc_case("pc_axis-1_quint8", (4, 5, 9), -1, 0, 255, False)
pc_case("pc_axis-1_4bit", (33, 3), -1, 0, 15, False)
x = rng.normal(0, 1, (3, 4)).astype(f32)
x[0, 0], x[1, 1], x[2, 2], x[0, 3] = np.nan, np.inf, -np.inf, 1e30
add_case("pc_nonfinite", 1, x, np.full(4, 0.05, f32), np.array([0, 10, 255, 128], f32), 0, 255,
         axis=1)

# ---- learnable per tensor ----
xl = np.concatenate([rng.normal(0.3, 1.2, 997).astype(f32), ties(f32(0.0625), 0, -10, 10)])
gf = 1.0 / (xl.size * 255) ** 0.5
add_case("lpt_quint8", 2, xl, f32(0.0131), f32(37.0), 0, 255)
add_case("lpt_quint8_gradscale", 2, xl, f32(0.0131), f32(37.0), 0, 255, grad_factor=gf)
add_case("lpt_zp_frac_low", 2, xl, f32(0.02), f32(10.3), 0, 255)
add_case("lpt_zp_frac_high", 2, xl, f32(0.02), f32(10.7), 0, 255)
add_case("lpt_zp_out_of_range", 2, xl, f32(0.02), f32(300.0), 0, 255)
add_case("lpt_4bit", 2, xl, f32(0.2), f32(7.0), 0, 15, grad_factor=1.0 / (xl.size * 15) ** 0.5)
add_case("lpt_qint8_zp0", 2, xl, f32(0.011), f32(0.0), -128, 127)
# Near ties with a zero-point: ATen's learnable backward computes nearbyint(zp + x * inv_scale)
# and xfq - x with fused multiply-adds (x86 build); these inputs tell FMA from no FMA.
kt = rng.integers(-100, 150, 3000)
base = ((kt + 0.5) * float(f32(0.0173))).astype(f32)
xt = (base.view(np.int32) + rng.integers(-3, 4, base.size).astype(np.int32)).view(f32)
add_case("lpt_near_ties_fma", 2, xt, f32(0.0173), f32(100.0), 0, 255)
xs = np.array([np.nan, -np.inf, -1e30, 0.5, -0.5, 2.0, -3.0, 100.0], f32)
add_case("lpt_nonfinite", 2, xs, f32(0.05), f32(20.0), 0, 255,
         gy=np.array([1, -2, 3, 0.5, -0.25, 1.5, -1, 2], f32))
# Negative zero-points: PyTorch 1.13's per-tensor backward rounds them as trunc(zp + 0.5)
# (a defect, documented in fakequant/learnable.c); the per-channel op rounds correctly, so a
# one-channel per-channel call is the reference for qcal's per-tensor backward here.
X1 = xl.reshape(1, -1)
add_case("lpt_negative_zp_via_pc", 3, X1, f32(0.011), f32(-3.7), -128, 127, axis=0)

# ---- learnable per channel ----
def lpc_case(name, shape, axis, qmin, qmax, gfac):
    x = rng.normal(0, 1.0, shape).astype(f32)
    ch = shape[axis]
    scale = rng.uniform(0.004, 0.03, ch).astype(f32)
    zp = rng.uniform(qmin, qmax, ch).astype(f32)
    zp[0] = f32(qmin + 0.4)
    gf = 1.0 / (x.size * qmax) ** 0.5 if gfac else 1.0
    add_case(name, 3, x, scale, zp, qmin, qmax, axis=axis, grad_factor=gf)


lpc_case("lpc_axis0_qint8", (8, 3, 3, 3), 0, -128, 127, False)
lpc_case("lpc_axis1_quint8", (4, 6, 10), 1, 0, 255, True)
lpc_case("lpc_axis-1_quint8", (20, 7), -1, 0, 255, False)


def write_kernels(path):
    b = bytearray(b"QFQK" + struct.pack("<II", 1, len(cases)))
    for (name, kind, axis, qmin, qmax, gf, x, scale, zp, y, mask, gy, gx, gs, gz) in cases:
        nb = name.encode()
        b += struct.pack("<I", len(nb)) + nb
        b += struct.pack("<IiqqfI", kind, axis, qmin, qmax, gf, x.ndim)
        b += struct.pack("<%dq" % x.ndim, *x.shape)
        b += struct.pack("<I", scale.size)
        b += arr(x, f32) + arr(scale, f32) + arr(zp, f32) + arr(y, f32) + arr(mask, np.uint8)
        b += arr(gy, f32) + arr(gx, f32) + arr(gs, f32) + arr(gz, f32)
    with open(path, "wb") as f:
        f.write(b)


# ---- FakeQuantize objects over several steps ----
from torch.ao.quantization import FakeQuantize  # noqa: E402
from torch.ao.quantization.observer import (MovingAverageMinMaxObserver,  # noqa: E402
                                            MovingAveragePerChannelMinMaxObserver)
from torch.ao.quantization._learnable_fake_quantize import _LearnableFakeQuantize  # noqa: E402

obj_cases = []


def run_object(name, preset, mod, shape, schedule, learnable=False):
    steps = []
    for i, (obs_en, fq_en, learning) in enumerate(schedule):
        if learnable:
            if learning:
                mod.enable_param_learning()
            else:
                mod.enable_static_estimate()
            mod.toggle_fake_quant(bool(fq_en))
        else:
            mod.enable_observer(bool(obs_en))
            mod.enable_fake_quant(bool(fq_en))
        x = (rng.normal(0.2 * i, 1.0 + 0.3 * i, shape)).astype(f32)
        gy = rng.standard_normal(shape).astype(f32)
        X = torch.from_numpy(x.copy()).requires_grad_()
        if learnable:
            mod.scale.grad = None
            mod.zero_point.grad = None
        y = mod(X)
        y.backward(torch.from_numpy(gy))
        sc = mod.scale.detach().numpy().astype(f32).ravel()
        zp = mod.zero_point.detach().numpy().astype(f32).ravel()
        if learnable and mod.scale.grad is not None:
            gs = mod.scale.grad.numpy().astype(f32).ravel()
            gz = mod.zero_point.grad.numpy().astype(f32).ravel()
        else:
            gs = np.zeros(sc.size, f32)
            gz = np.zeros(sc.size, f32)
        steps.append((obs_en, fq_en, learning, x, gy, y.detach().numpy(), X.grad.numpy(), sc,
                      zp, gs, gz))
    obj_cases.append((name, preset, shape, steps))


act = FakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                   reduce_range=True)
run_object("activation", 0, act, (4, 8),
           [(1, 1, 0), (1, 1, 0), (1, 1, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)])
wt = FakeQuantize(observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                  dtype=torch.qint8, qscheme=torch.per_channel_symmetric, reduce_range=False,
                  ch_axis=0)
run_object("weight_per_channel", 1, wt, (6, 3, 3, 3),
           [(1, 1, 0), (1, 1, 0), (1, 1, 0), (0, 1, 0), (1, 1, 0)])
lrn = _LearnableFakeQuantize(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                             use_grad_scaling=True)
run_object("learnable_activation", 2, lrn, (4, 8),
           [(1, 1, 0), (1, 1, 0), (0, 1, 1), (0, 1, 1)], learnable=True)


def write_object(path):
    b = bytearray(b"QFQO" + struct.pack("<II", 1, len(obj_cases)))
    for name, preset, shape, steps in obj_cases:
        nb = name.encode()
        b += struct.pack("<I", len(nb)) + nb + struct.pack("<II", preset, len(shape))
        b += struct.pack("<%dq" % len(shape), *shape) + struct.pack("<I", len(steps))
        for (oe, fe, le, x, gy, y, gx, sc, zp, gs, gz) in steps:
            b += struct.pack("<BBBB", oe, fe, le, 0)
            b += arr(x, f32) + arr(gy, f32) + arr(y, f32) + arr(gx, f32)
            b += struct.pack("<I", sc.size) + arr(sc, f32) + arr(zp, f32) + arr(gs, f32)
            b += arr(gz, f32)
    with open(path, "wb") as f:
        f.write(b)


if __name__ == "__main__":
    assert torch.__version__.startswith("1.13"), torch.__version__
    os.makedirs(OUT, exist_ok=True)
    write_kernels(os.path.join(OUT, "kernels.bin"))
    write_object(os.path.join(OUT, "object.bin"))
    print("wrote %d kernel cases, %d object cases" % (len(cases), len(obj_cases)),
          file=sys.stderr)
