#!/usr/bin/python3
"""Reference data for tests/test_numeric_cli.c and tests/test_numeric_compare.c
(run with /usr/bin/python3: torch 1.13, numpy).

Writes into tests/data/numeric/:
  cw_model.safetensors  float32 weights with PyTorch-style names (written by hand: 8-byte
                        little-endian header length, JSON header, data), including a group of
                        four blocks.N.fc.weight with one outlier, a zero tensor, a tensor with
                        one NaN and one tensor that is all NaN/Inf
  cw_ref.txt            one line per (variant, tensor) that PyTorch can compare:
      <variant> <name> <sqnr> <l2> <cosine> <max_abs_err> <scale_min> <scale_max>
    variant 'default': PyTorch's default weight qconfig (PerChannelMinMaxObserver qint8
    per_channel_symmetric ch_axis 0 for >= 2-D, MinMaxObserver qint8 per_tensor_symmetric
    for 1-D); variant 'minmax_quint8_affine': MinMaxObserver quint8 per_tensor_affine for
    every tensor. Metrics by torch.ao.ns.fx.utils (float32, as PyTorch reports them).
  act_ref.txt           activation comparison reference: a two-layer float model and a
                        quantized copy run on the same batches in both modes:
      <mode> <fqn> <steps> <sqnr> <l2> <cosine>
    with metrics over all batches concatenated (float64 here, qcal streams in double).
  act_<mode>_<fqn>_<step>_{f,q}.npy  the per-step float and quantized outputs
"""
import json
import os
import struct

import numpy as np
import torch
from torch.ao.ns.fx.utils import (compute_cosine_similarity, compute_normalized_l2_error,
                                  compute_sqnr)
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'numeric')


def write_safetensors(path, tensors):
    header, data = {}, b''
    for name, t in tensors:
        raw = t.contiguous().numpy().astype('<f4').tobytes()
        header[name] = {'dtype': 'F32', 'shape': list(t.shape),
                        'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    hb = json.dumps(header).encode()
    hb += b' ' * ((8 - len(hb) % 8) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(hb)))
        f.write(hb)
        f.write(data)


def qdq(w, variant):
    if variant == 'default' and w.dim() >= 2:
        obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                       qscheme=torch.per_channel_symmetric)
        obs(w)
        s, z = obs.calculate_qparams()
        q = torch.quantize_per_channel(w, s, z.to(torch.int64), 0, torch.qint8)
        return q.dequantize(), s
    if variant == 'default':
        obs = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
        dt = torch.qint8
    else:
        obs = MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine)
        dt = torch.quint8
    obs(w)
    s, z = obs.calculate_qparams()
    q = torch.quantize_per_tensor(w, float(s), int(z), dt)
    return q.dequantize(), s


def weights():
    g = torch.Generator().manual_seed(2024)
    t = []
    for i in range(4):
        w = torch.randn(8, 16, generator=g) * 0.1
        if i == 3:
            w[2, 5] = 3.0   # absmax 3.0 > 4 x group median: an outlier, and low SQNR
        t.append(('blocks.%d.fc.weight' % i, w))
    t.append(('conv.weight', torch.randn(4, 3, 3, 3, generator=g) * 0.5))
    t.append(('fc.bias', torch.randn(10, generator=g)))
    t.append(('zeros', torch.zeros(3, 4)))
    pn = torch.randn(4, 5, generator=g)
    pn[1, 2] = float('nan')
    t.append(('partial_nan', pn))
    t.append(('all_nan', torch.tensor([[float('nan'), float('inf'), float('nan')],
                                       [float('-inf'), float('nan'), float('nan')]])))
    return t


def act_reference():
    """A float model (fc1 -> relu -> fc2) and its fake-quantized copy (weights per-tensor
    symmetric qint8, fc1 output rounded to a quint8 grid), three batches."""
    g = torch.Generator().manual_seed(99)
    w1 = torch.randn(6, 5, generator=g) * 0.5
    w2 = torch.randn(3, 6, generator=g) * 0.5

    def q(t, scale):
        return torch.clamp(torch.round(t / scale), -128, 127) * scale

    w1q, w2q = q(w1, w1.abs().max() / 127), q(w2, w2.abs().max() / 127)

    def fc1(x, quant):
        y = torch.relu(x @ (w1q if quant else w1).T)
        return torch.clamp(torch.round(y / 0.02), 0, 255) * 0.02 if quant else y

    def fc2(h, quant):
        return h @ (w2q if quant else w2).T

    lines = []
    steps = {}
    for mode in ('propagate', 'shadow'):
        outs = {'fc1': ([], []), 'fc2': ([], [])}
        for step in range(3):
            x = torch.randn(4 + step, 5, generator=g)
            f1 = fc1(x, False)
            q1 = fc1(x, True)
            f2 = fc2(f1, False)
            # propagate: the quantized model runs on its own activations;
            # shadow: the quantized fc2 gets the float fc1 output
            q2 = fc2(q1 if mode == 'propagate' else f1, True)
            for fqn, f, qq in (('fc1', f1, q1), ('fc2', f2, q2)):
                f, qq = f.float().contiguous(), qq.float().contiguous()
                np.save(os.path.join(OUT, 'act_%s_%s_%d_f.npy' % (mode, fqn, step)), f.numpy())
                np.save(os.path.join(OUT, 'act_%s_%s_%d_q.npy' % (mode, fqn, step)), qq.numpy())
                outs[fqn][0].append(f.reshape(-1))
                outs[fqn][1].append(qq.reshape(-1))
        for fqn in ('fc1', 'fc2'):
            f = torch.cat(outs[fqn][0]).double()
            qq = torch.cat(outs[fqn][1]).double()
            sqnr = (20 * torch.log10(torch.norm(f) / torch.norm(f - qq))).item()
            l2 = torch.sqrt(((f - qq) ** 2).sum() / (f ** 2).sum()).item()
            cos = torch.nn.functional.cosine_similarity(f.reshape(1, -1), qq.reshape(1, -1)).item()
            lines.append('%s %s %d %.17g %.17g %.17g' % (mode, fqn, 3, sqnr, l2, cos))
    return lines


def main():
    os.makedirs(OUT, exist_ok=True)
    t = weights()
    write_safetensors(os.path.join(OUT, 'cw_model.safetensors'), t)
    lines = []
    for variant in ('default', 'minmax_quint8_affine'):
        for name, w in t:
            if not torch.isfinite(w).all() or w.abs().max() == 0:
                continue   # PyTorch gives NaN here; qcal's policy is tested on its own
            y, s = qdq(w, variant)
            vals = [compute_sqnr(w, y).item(), compute_normalized_l2_error(w, y).item(),
                    compute_cosine_similarity(w.reshape(1, -1), y.reshape(1, -1)).item(),
                    (w - y).abs().max().item(), float(s.min()), float(s.max())]
            lines.append('%s %s %s' % (variant, name, ' '.join('%.17g' % v for v in vals)))
    with open(os.path.join(OUT, 'cw_ref.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    with open(os.path.join(OUT, 'act_ref.txt'), 'w') as f:
        f.write('\n'.join(act_reference()) + '\n')


if __name__ == '__main__':
    main()
