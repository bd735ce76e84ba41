#!/usr/bin/python3
"""Reference vectors for qcal's min/max observers, qparams and quantize/dequantize.

Run with the Debian PyTorch 1.13 interpreter:  /usr/bin/python3 tests/ref/gen_minmax.py
Writes tests/data/minmax/observers.txt and tests/data/minmax/quantize.bin.

observers.txt (whitespace-separated tokens; floats as 8-hex-digit float32 bit patterns):
  input <id> <name> <nbatches>
    then per batch: <ndim> <shape...> <values...>
  case <kind> <dtype> <qscheme> <reduce 0|1> <custom 0|1> <qmin> <qmax> <axis> <avgc> <input id>
       <nch> then nch times: <min> <max> <scale> <zp>   (zp: int, or float hex for float_qparams)
  end
quantize.bin (little-endian): "QCQZ" u32 ncases, then per case:
  u32 dtype (0 quint8, 1 qint8, 2 qint32), u32 per_channel, u32 ndim, i64 shape[ndim], i32 axis,
  i64 nch, f32 scales[nch], i32 zps[nch], i64 n, f32 x[n], i32 q[n], f32 deq[n]
"""
import os
import struct
import sys

import numpy as np
import torch
from torch.ao.quantization import observer as O

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, '..', 'data', 'minmax')
os.makedirs(OUT, exist_ok=True)
rng = np.random.default_rng(20240613)


def hx(v):
    return '%08x' % struct.unpack('<I', struct.pack('<f', float(np.float32(v))))[0]


SHAPE = (3, 4, 5)


def make_inputs():
    f = np.float32
    ins = []
    def batches(gen, n=3, shape=SHAPE):
        return [gen(k, shape).astype(f) for k in range(n)]
    ins.append(('normal', batches(lambda k, s: rng.standard_normal(s) * (3 + k) + 0.5)))
    ins.append(('skewed', batches(lambda k, s: rng.standard_normal(s) ** 2 * 5 - 1 - 0.1 * k)))
    ins.append(('relu', batches(lambda k, s: np.maximum(rng.standard_normal(s) * (1 + k), 0))))
    ins.append(('negative', batches(lambda k, s: -np.abs(rng.standard_normal(s)) - 0.25 * k)))
    ins.append(('neg_large', batches(lambda k, s: -np.abs(rng.standard_normal(s)) * 1000 - 600)))
    ins.append(('constant', batches(lambda k, s: np.full(s, 2.5))))
    ins.append(('zeros', batches(lambda k, s: np.zeros(s), n=2)))
    ins.append(('single', batches(lambda k, s: rng.standard_normal(s) * 2, shape=(1, 1, 1))))
    ins.append(('tiny', batches(lambda k, s: rng.standard_normal(s) * 1e-30)))
    ins.append(('huge', batches(lambda k, s: rng.standard_normal(s) * 1e30)))
    ins.append(('offset', batches(lambda k, s: 100 + rng.standard_normal(s) * 1e-3)))
    return ins


DT = {'quint8': torch.quint8, 'qint8': torch.qint8, 'qint32': torch.qint32}
QS = {'per_tensor_affine': torch.per_tensor_affine,
      'per_tensor_symmetric': torch.per_tensor_symmetric,
      'per_channel_affine': torch.per_channel_affine,
      'per_channel_symmetric': torch.per_channel_symmetric,
      'per_channel_affine_float_qparams': torch.per_channel_affine_float_qparams}
KINDS = {'minmax': O.MinMaxObserver, 'moving_average_minmax': O.MovingAverageMinMaxObserver,
         'per_channel_minmax': O.PerChannelMinMaxObserver,
         'moving_average_per_channel_minmax': O.MovingAveragePerChannelMinMaxObserver}


def gen_observers():
    ins = make_inputs()
    lines = []
    for i, (name, bs) in enumerate(ins):
        lines.append('input %d %s %d' % (i, name, len(bs)))
        for b in bs:
            lines.append('%d %s %s' % (b.ndim, ' '.join(map(str, b.shape)),
                                        ' '.join(hx(v) for v in b.ravel())))
    ncase = 0
    for kind, cls in KINDS.items():
        pc = 'per_channel' in kind
        ma = 'moving' in kind
        schemes = ([q for q in QS if q.startswith('per_channel')] if pc
                   else ['per_tensor_affine', 'per_tensor_symmetric'])
        ranges = [(None, None)]
        for dtype in DT:
            rs = [(None, None)]
            if dtype == 'quint8':
                rs.append((0, 15))
            if dtype == 'qint8':
                rs.append((-8, 7))
            for qs in schemes:
                for reduce in (False, True):
                    for (qmin, qmax) in rs:
                        for axis in ((0, 1, -1) if pc else (0,)):
                            for avgc in ((0.01, 0.3) if ma else (0.01,)):
                                for i, (name, bs) in enumerate(ins):
                                    kw = dict(dtype=DT[dtype], qscheme=QS[qs], reduce_range=reduce)
                                    if qmin is not None:
                                        kw.update(quant_min=qmin, quant_max=qmax)
                                    if pc:
                                        kw['ch_axis'] = axis
                                    if ma:
                                        kw['averaging_constant'] = avgc
                                    try:
                                        obs = cls(**kw)
                                        for b in bs:
                                            obs(torch.from_numpy(b.copy()))
                                        s, z = obs.calculate_qparams()
                                    except Exception as e:  # noqa: BLE001
                                        print('skip', kind, dtype, qs, reduce, qmin, name, e,
                                              file=sys.stderr)
                                        continue
                                    mn = obs.min_val.reshape(-1).numpy()
                                    mx = obs.max_val.reshape(-1).numpy()
                                    s = s.reshape(-1).numpy().astype(np.float32)
                                    z = z.reshape(-1).numpy()
                                    head = 'case %s %s %s %d %d %d %d %d %s %d %d' % (
                                        kind, dtype, qs, reduce, qmin is not None,
                                        qmin if qmin is not None else 0,
                                        qmax if qmax is not None else 0, axis, hx(avgc), i,
                                        len(mn))
                                    body = []
                                    for k in range(len(mn)):
                                        zz = hx(z[k]) if qs.endswith('float_qparams') else '%d' % int(z[k])
                                        body.append('%s %s %s %s' % (hx(mn[k]), hx(mx[k]), hx(s[k]), zz))
                                    lines.append(head + ' ' + ' '.join(body))
                                    ncase += 1
    lines.append('end')
    with open(os.path.join(OUT, 'observers.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    print('observer cases:', ncase)


def gen_quantize():
    cases = []
    f = np.float32
    def add(dtype, x, scales, zps, axis=None):
        xt = torch.from_numpy(x)
        if axis is None:
            q = torch.quantize_per_tensor(xt, float(scales[0]), int(zps[0]), DT[dtype])
        else:
            q = torch.quantize_per_channel(xt, torch.tensor(scales, dtype=torch.float64),
                                           torch.tensor(zps, dtype=torch.int64), axis % x.ndim,
                                           DT[dtype])
        cases.append((dtype, axis, x, np.array(scales, f), np.array(zps, np.int32),
                      q.int_repr().numpy().astype(np.int32).ravel(),
                      q.dequantize().numpy().astype(f).ravel()))
    lim = {'quint8': (0, 255), 'qint8': (-128, 127), 'qint32': (-2**31, 2**31 - 1)}
    for dtype in DT:
        lo, hi = lim[dtype]
        for s, z in ((0.1, 3), (1 / 3, lo + 7 if dtype != 'qint32' else -5), (0.0123, 0),
                     (3e-5, 1), (2.0, hi - 2 if dtype != 'qint32' else 1000)):
            s = f(s)
            n = 3000
            x = (rng.standard_normal(n) * 40 * s * (1 if dtype != 'qint32' else 1000)).astype(f)
            # exact ties x/scale = k + 0.5 (x = (k + 0.5) * s rounded; keep those that are ties)
            k = rng.integers(-300, 300, 400)
            t = ((k + 0.5) * s).astype(f)
            x[:400] = t
            # clamp edges: exactly at and one step beyond the representable range
            for j, qv in enumerate((lo - z, hi - z, lo - z - 1, hi - z + 1, lo - z - 0.5,
                                    hi - z + 0.5, lo - z + 0.5, hi - z - 0.5)):
                x[400 + j] = f(qv * s) if abs(qv) < 2**24 else f(qv) * s
            x[420:430] = f(1e30) * np.sign(rng.standard_normal(10)).astype(f)
            x[430] = 0.0
            x[431] = -0.0
            add(dtype, x, [s], [z])
        # per-channel: axes 0, 1, -1 on (4, 6, 50)
        x = (rng.standard_normal((4, 6, 50)) * 5).astype(f)
        for axis in (0, 1, -1, 2):
            c = x.shape[axis]
            scales = (rng.random(c) * 0.2 + 0.01).astype(f)
            zps = rng.integers(max(lo, -100), min(hi, 200), c)
            if dtype == 'quint8':
                zps = rng.integers(0, 200, c)
            add(dtype, x, list(map(float, scales)), list(map(int, zps)), axis)
    with open(os.path.join(OUT, 'quantize.bin'), 'wb') as fo:
        fo.write(b'QCQZ')
        fo.write(struct.pack('<I', len(cases)))
        for dtype, axis, x, sc, zp, q, dq in cases:
            fo.write(struct.pack('<III', list(DT).index(dtype), axis is not None, x.ndim))
            fo.write(struct.pack('<%dq' % x.ndim, *x.shape))
            fo.write(struct.pack('<i', axis if axis is not None else 0))
            fo.write(struct.pack('<q', len(sc)))
            fo.write(sc.astype('<f4').tobytes())
            fo.write(zp.astype('<i4').tobytes())
            fo.write(struct.pack('<q', x.size))
            fo.write(x.astype('<f4').tobytes())
            fo.write(q.astype('<i4').tobytes())
            fo.write(dq.astype('<f4').tobytes())
    print('quantize cases:', len(cases))


if __name__ == '__main__':
    import warnings
    warnings.simplefilter('ignore')
    gen_observers()
    gen_quantize()
