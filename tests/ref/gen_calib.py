#!/usr/bin/python3
"""Writes the calibration test data for tests/test_calib_{tables,cli}.c into tests/data/calib/.
Run with /usr/bin/python3 (PyTorch 1.13 + numpy).

  dump/                       activation/weight dumps as `qcal calibrate` reads them:
    conv1/000.npy .. 002.npy  three batches of one activation (two NaNs in 001.npy)
    fc.npy                    one activation in a single file
    conv1.weight.npy          a weight (role weight: the name ends in ".weight")
    fc.weight.npy             a weight with one all-zero output channel
  expected_minmax.json        native table PyTorch computes with MinMaxObserver (activations,
                              quint8 per_tensor_affine) and PerChannelMinMaxObserver (weights,
                              qint8 per_channel_symmetric, ch_axis 0), NaNs removed first (qcal
                              skips and counts them; PyTorch 1.13 would propagate NaN)
  expected_ma.json            the same with MovingAverageMinMaxObserver (c = 0.01) for the
                              activations: batch order matters
  minmax.tensorrt / .onnxruntime / .ncnn
                              expected_minmax.json exported by an independent implementation
                              of each format below (written here, not by qcal); the TensorRT
                              header names MinMaxCalibration (the observers are min/max
                              kinds); the ONNX Runtime cache is write_calibration_table's
                              calibration.cache: Python str() of the float amax
  names.json, names.tensorrt  a table whose names hold spaces and colons (TensorRT only)
  rules_sample.txt            a sample rules file
"""
import json
import os
import struct

import numpy as np
import torch
from torch.ao.quantization.observer import (MinMaxObserver, MovingAverageMinMaxObserver,
                                            PerChannelMinMaxObserver)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'calib')
DUMP = os.path.join(OUT, 'dump')


def f32_str(v):
    """Shortest %g that reads back as the same float32 (qcal_calib_fmt_f32's rule)."""
    v = np.float32(v)
    if np.isinf(v):
        return '"inf"' if v > 0 else '"-inf"'
    for p in range(1, 18):
        s = '%.*g' % (p, float(v))
        if np.float32(float(s)) == v:
            return s
    raise AssertionError(v)


def entry_json(e):
    arr = lambda xs: '[' + ', '.join(f32_str(x) for x in xs) + ']'
    return ('{"fqn": %s, "role": "%s", "observer": "%s", "dtype": "%s", "qscheme": "%s",\n'
            '     "axis": %d, "quant_min": %d, "quant_max": %d, "channels": %d, "batches": %d, '
            '"elements": %d, "nonfinite": %d, "no_data": false,\n'
            '     "min": %s,\n     "max": %s,\n     "scale": %s,\n     "zero_point": [%s],\n'
            '     "zero_point_float": %s}') % (
        json.dumps(e['fqn']), e['role'], e['observer'], e['dtype'], e['qscheme'], e['axis'],
        e['qmin'], e['qmax'], len(e['min']), e['batches'], e['elements'], e['nonfinite'],
        arr(e['min']), arr(e['max']), arr(e['scale']),
        ', '.join(str(int(z)) for z in e['zp']), arr([0.0] * len(e['min'])))


def table_json(entries):
    entries = sorted(entries, key=lambda e: (e['fqn'].encode(), e['role'] == 'weight'))
    body = ',\n    '.join(entry_json(e) for e in entries)
    return ('{\n  "format": "qcal-calibration-table",\n  "version": 1,\n  "entries": [\n    '
            + body + '\n  ]\n}\n')


def observe_act(fqn, batches, kind):
    obs = MinMaxObserver() if kind == 'minmax' else MovingAverageMinMaxObserver()
    nonfinite = 0
    elements = 0
    for b in batches:
        x = torch.from_numpy(b)
        keep = torch.isfinite(x)
        nonfinite += int((~keep).sum())
        elements += x.numel()
        obs(x[keep])
    s, z = obs.calculate_qparams()
    return dict(fqn=fqn, role='activation', observer=kind, dtype='quint8',
                qscheme='per_tensor_affine', axis=0, qmin=0, qmax=255,
                min=[obs.min_val.item()], max=[obs.max_val.item()], scale=s.tolist(),
                zp=z.tolist(), batches=len(batches), elements=elements, nonfinite=nonfinite)


def observe_weight(fqn, w):
    obs = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                   qscheme=torch.per_channel_symmetric)
    obs(torch.from_numpy(w))
    s, z = obs.calculate_qparams()
    return dict(fqn=fqn, role='weight', observer='per_channel_minmax', dtype='qint8',
                qscheme='per_channel_symmetric', axis=0, qmin=-128, qmax=127,
                min=obs.min_val.tolist(), max=obs.max_val.tolist(), scale=s.tolist(),
                zp=z.tolist(), batches=1, elements=w.size, nonfinite=0)


def amax(e):
    """Export amax: max over channels of max(|min|, |max|); 0 -> 1 (qcal's documented rule)."""
    m = np.float32(0)
    for lo, hi in zip(e['min'], e['max']):
        m = max(m, abs(np.float32(lo)), abs(np.float32(hi)))
    return np.float32(1) if m == 0 else np.float32(m)


def export_tensorrt(entries, header='TRT-8601-MinMaxCalibration'):
    lines = [header]
    for e in sorted(entries, key=lambda e: e['fqn'].encode()):
        if e['role'] != 'activation':
            continue
        scale = np.float32(amax(e)) / np.float32(127)
        bits = struct.unpack('<I', struct.pack('<f', scale))[0]
        lines.append('%s: %s' % (e['fqn'], format(bits, 'x')))
    return '\n'.join(lines) + '\n'


def export_onnxruntime(entries):
    """calibration.cache as ONNX Runtime's write_calibration_table writes it:
    key + ' ' + str(max(abs(lo), abs(hi))) with lo, hi Python floats."""
    return ''.join('%s %s\n' % (e['fqn'], str(float(amax(e))))
                   for e in sorted(entries, key=lambda e: e['fqn'].encode())
                   if e['role'] == 'activation')


def export_ncnn(entries):
    out = []
    srt = sorted(entries, key=lambda e: e['fqn'].encode())
    for e in srt:
        if e['role'] != 'weight':
            continue
        layer = e['fqn'][:-7] if e['fqn'].endswith('.weight') else e['fqn']
        vals = ''
        for lo, hi in zip(e['min'], e['max']):
            a = max(abs(np.float32(lo)), abs(np.float32(hi)))
            a = np.float32(1) if a == 0 else a
            vals += '%f ' % float(np.float32(127) / np.float32(a))
        out.append('%s_param_0 %s\n' % (layer, vals))
    for e in srt:
        if e['role'] == 'activation':
            out.append('%s %f \n' % (e['fqn'], float(np.float32(127) / amax(e))))
    return ''.join(out)


def save(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, arr.astype(np.float32), allow_pickle=False)


def write_text(name, text):
    with open(os.path.join(OUT, name), 'w') as f:
        f.write(text)


def main():
    rng = np.random.default_rng(20240607)
    conv1 = [rng.normal(0.3, 1.2, size=(2, 3, 4, 4)).astype(np.float32) * (1 + i)
             for i in range(3)]
    conv1[1][0, 1, 2, 3] = np.nan
    conv1[1][1, 0, 0, 0] = np.nan
    fc = rng.uniform(-0.02, 5.5, size=(4, 16)).astype(np.float32)
    w1 = rng.normal(0, 0.2, size=(4, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.05, size=(5, 16)).astype(np.float32)
    w2[2] = 0.0
    for i, b in enumerate(conv1):
        save(os.path.join(DUMP, 'conv1', '%03d.npy' % i), b)
    save(os.path.join(DUMP, 'fc.npy'), fc)
    save(os.path.join(DUMP, 'conv1.weight.npy'), w1)
    save(os.path.join(DUMP, 'fc.weight.npy'), w2)

    weights = [observe_weight('conv1.weight', w1), observe_weight('fc.weight', w2)]
    mm = [observe_act('conv1', conv1, 'minmax'), observe_act('fc', [fc], 'minmax')] + weights
    ma = [observe_act('conv1', conv1, 'moving_average_minmax'),
          observe_act('fc', [fc], 'moving_average_minmax')] + weights
    write_text('expected_minmax.json', table_json(mm))
    write_text('expected_ma.json', table_json(ma))
    write_text('minmax.tensorrt', export_tensorrt(mm))
    write_text('minmax.onnxruntime', export_onnxruntime(mm))
    write_text('minmax.ncnn', export_ncnn(mm))

    names = []
    for i, (fqn, lo, hi) in enumerate([('input: image 0', -1.0, 1.0),
                                       ('block 1/conv:out', 0.0, 6.0),
                                       ('a: b: c', -3.5e-3, 2.25e-3),
                                       ('zero', 0.0, 0.0)]):
        obs = MinMaxObserver()
        obs(torch.tensor([lo, hi], dtype=torch.float32))
        s, z = obs.calculate_qparams()
        names.append(dict(fqn=fqn, role='activation', observer='minmax', dtype='quint8',
                          qscheme='per_tensor_affine', axis=0, qmin=0, qmax=255,
                          min=[obs.min_val.item()], max=[obs.max_val.item()],
                          scale=s.tolist(), zp=z.tolist(), batches=1, elements=2,
                          nonfinite=0))
    write_text('names.json', table_json(names))
    write_text('names.tensorrt', export_tensorrt(names, 'TRT-8203-MinMaxCalibration'))

    write_text('rules_sample.txt',
               '# qcal calibration rules: GLOB ROLE OBSERVER [key=value ...]; first match wins\n'
               '*.weight    weight      per_channel_minmax dtype=qint8 qscheme=per_channel_symmetric\n'
               'fc*         activation  moving_average_minmax averaging_constant=0.01\n'
               '"conv 1*"   any         minmax dtype=qint8 qscheme=per_tensor_symmetric  # quoted glob\n'
               '*           activation  minmax\n')


if __name__ == '__main__':
    main()
