#!/usr/bin/python3
"""Reference vectors for tests/test_numeric_metrics.c (run with /usr/bin/python3: torch 1.13).

For each case k: tests/data/numeric/m_<k>_x.npy (float), m_<k>_y.npy (its quantize-dequantize
or a perturbation), and one line in metrics_ref.txt:
  <k> <n> <sqnr f32> <l2 f32> <cos f32> <sqnr f64> <l2 f64> <cos f64> <max_abs_err>
    <min> <max> <mean f64> <std f64 unbiased>
computed by torch.ao.ns.fx.utils.compute_sqnr / compute_normalized_l2_error /
compute_cosine_similarity on the float32 tensors (as PyTorch reports them) and on float64
copies (the exact value qcal's double accumulation approaches).
"""
import os

import numpy as np
import torch
from torch.ao.ns.fx.utils import (compute_cosine_similarity, compute_normalized_l2_error,
                                  compute_sqnr)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'numeric')


def qdq(x, dtype=torch.qint8):
    amax = x.abs().max().item()
    scale = max(amax / 127.0, 1e-8)
    return torch.quantize_per_tensor(x, scale, 0, dtype).dequantize()


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(7)
    cases = []
    x = torch.randn(17, generator=g)
    cases.append(('small', x, qdq(x)))
    x = torch.randn(5000, generator=g) * 3 + 1
    cases.append(('mid', x, qdq(x)))
    x = torch.randn(70001, generator=g) * 0.02
    x[123] = 0.9   # an outlier hurts per-tensor quantization
    cases.append(('large_outlier', x, qdq(x)))
    x = torch.randn(4099, generator=g) + 100.0   # large mean: tests stable variance
    cases.append(('offset', x, x + torch.randn(4099, generator=g) * 1e-3))
    x = torch.randn(33, generator=g)
    cases.append(('negated', x, -x))
    lines = []
    for name, x, y in cases:
        x = x.float().contiguous()
        y = y.float().contiguous()
        np.save(os.path.join(OUT, 'm_%s_x.npy' % name), x.numpy())
        np.save(os.path.join(OUT, 'm_%s_y.npy' % name), y.numpy())
        xd, yd = x.double(), y.double()
        vals = [compute_sqnr(x, y).item(), compute_normalized_l2_error(x, y).item(),
                compute_cosine_similarity(x, y).item(),
                # the same formulas in float64 (the decorated helpers accept float32 only)
                (20 * torch.log10(torch.norm(xd) / torch.norm(xd - yd))).item(),
                torch.sqrt(((xd - yd) ** 2).sum() / (xd ** 2).sum()).item(),
                torch.nn.functional.cosine_similarity(xd.reshape(1, -1), yd.reshape(1, -1)).item(),
                (x - y).abs().max().item(), x.min().item(), x.max().item(),
                xd.mean().item(), xd.std().item()]
        lines.append('%s %d %s' % (name, x.numel(), ' '.join('%.17g' % v for v in vals)))
    with open(os.path.join(OUT, 'metrics_ref.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')


if __name__ == '__main__':
    main()
