#!/usr/bin/python3
"""Writes the safetensors test files for tests/test_safetensors.c into tests/data/numeric/.

Debian has no python safetensors package, so the format is written by hand here:
8-byte little-endian header length, JSON header, data section (offsets relative to it).
Run with /usr/bin/python3 (torch for the BF16 rounding, numpy for F16).

  st_mixed.safetensors     F32 / F16 / BF16 / F64 / I64 tensors, a scalar, an empty tensor,
                           __metadata__; header keys not in offset order
  st_mixed_f32.safetensors the same tensors converted to float32 by torch (the expected values)
  bad_*.safetensors        malformed files, one defect each (see BAD below)
"""
import json
import os
import struct

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'data', 'numeric')


def raw_file(path, header_bytes, data, hlen=None):
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(header_bytes) if hlen is None else hlen))
        f.write(header_bytes)
        f.write(data)


def write(path, tensors, metadata=None, key_order=None, pad=True):
    """tensors: list of (name, dtype string, shape, raw bytes)."""
    header = {}
    data = b''
    entries = {}
    for name, dt, shape, raw in tensors:
        entries[name] = {'dtype': dt, 'shape': list(shape),
                         'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header['__metadata__'] = metadata
    for k in (key_order or list(entries)):
        header[k] = entries[k]
    hb = json.dumps(header).encode()
    if pad:
        hb += b' ' * ((8 - len(hb) % 8) % 8)
    raw_file(path, hb, data)


def main():
    os.makedirs(OUT, exist_ok=True)
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(4, 3, 2, 2, generator=g)
    b = torch.randn(5, generator=g)
    h = torch.tensor([0.0, -0.0, 1.0, -2.5, 65504.0, 6e-8, 1e-5, float('inf'), float('-inf'),
                      float('nan'), 0.333, 1000.1], dtype=torch.float16)
    bf = (torch.randn(3, 7, generator=g) * 100).to(torch.bfloat16)
    bf_special = torch.tensor([float('inf'), float('nan'), 1e-40, -3.0e38], dtype=torch.bfloat16)
    d = torch.randn(2, 3, generator=g, dtype=torch.float64)
    i64 = torch.tensor([7], dtype=torch.int64)
    scal = torch.tensor(3.25)
    empty = torch.zeros(0, 4)

    def rb(t):
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().tobytes()
        return t.numpy().tobytes()

    tensors = [
        ('conv.weight', 'F32', w.shape, rb(w)),
        ('conv.bias', 'F32', b.shape, rb(b)),
        ('half', 'F16', h.shape, rb(h)),
        ('bf', 'BF16', bf.shape, rb(bf)),
        ('bf_special', 'BF16', bf_special.shape, rb(bf_special)),
        ('dbl', 'F64', d.shape, rb(d)),
        ('bn.num_batches_tracked', 'I64', [1], rb(i64)),
        ('scalar', 'F32', [], rb(scal)),
        ('empty', 'F32', [0, 4], b''),
    ]
    order = ['scalar', 'half', 'conv.bias', 'bn.num_batches_tracked', 'conv.weight', 'dbl',
             'empty', 'bf', 'bf_special']
    write(os.path.join(OUT, 'st_mixed.safetensors'), tensors,
          metadata={'format': 'pt', 'note': 'qcal test \u00e9'}, key_order=order)
    f32 = [(n, 'F32', s, t) for n, s, t in [
        ('conv.weight', w.shape, rb(w)), ('conv.bias', b.shape, rb(b)),
        ('half', h.shape, rb(h.float())), ('bf', bf.shape, rb(bf.float())),
        ('bf_special', bf_special.shape, rb(bf_special.float())),
        ('dbl', d.shape, rb(d.float())), ('scalar', [], rb(scal)), ('empty', [0, 4], b'')]]
    write(os.path.join(OUT, 'st_mixed_f32.safetensors'), f32)

    # Malformed files: name -> (header bytes, data, declared length or None)
    ok4 = struct.pack('<4f', 1, 2, 3, 4)

    def hdr(obj):
        return json.dumps(obj).encode()

    t4 = {'dtype': 'F32', 'shape': [4], 'data_offsets': [0, 16]}
    bad = {
        'bad_hlen_huge': (hdr({'a': t4}), ok4, 1 << 40),
        'bad_hlen_past_eof': (hdr({'a': t4}), ok4, 100000),
        'bad_not_json': (b'{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]', ok4, None),
        'bad_not_object': (b'[1, 2, 3]', ok4, None),
        'bad_dtype': (hdr({'a': {'dtype': 'Q4', 'shape': [4], 'data_offsets': [0, 16]}}), ok4, None),
        'bad_size': (hdr({'a': {'dtype': 'F32', 'shape': [5], 'data_offsets': [0, 16]}}), ok4, None),
        'bad_offsets_past_end': (hdr({'a': {'dtype': 'F32', 'shape': [4], 'data_offsets': [8, 24]}}),
                                 ok4, None),
        'bad_overlap': (hdr({'a': {'dtype': 'F32', 'shape': [3], 'data_offsets': [0, 12]},
                             'b': {'dtype': 'F32', 'shape': [3], 'data_offsets': [4, 16]}}), ok4, None),
        'bad_hole': (hdr({'a': {'dtype': 'F32', 'shape': [1], 'data_offsets': [0, 4]},
                          'b': {'dtype': 'F32', 'shape': [2], 'data_offsets': [8, 16]}}), ok4, None),
        'bad_trailing_data': (hdr({'a': {'dtype': 'F32', 'shape': [3], 'data_offsets': [0, 12]}}),
                              ok4, None),
        'bad_duplicate_name': (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
                               b'"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', ok4, None),
        'bad_shape_overflow': (hdr({'a': {'dtype': 'F32', 'shape': [1 << 32, 1 << 32, 4],
                                          'data_offsets': [0, 16]}}), ok4, None),
        'bad_negative_shape': (hdr({'a': {'dtype': 'F32', 'shape': [-4], 'data_offsets': [0, 16]}}),
                               ok4, None),
        'bad_offsets_reversed': (hdr({'a': {'dtype': 'F32', 'shape': [0], 'data_offsets': [16, 0]}}),
                                 ok4, None),
        'bad_missing_offsets': (hdr({'a': {'dtype': 'F32', 'shape': [4]}}), ok4, None),
        'bad_short_file': (b'', b'', 0),
    }
    for name, (hb, data, hl) in bad.items():
        path = os.path.join(OUT, name + '.safetensors')
        if name == 'bad_short_file':
            open(path, 'wb').write(b'\x05\x00\x00')
            continue
        raw_file(path, hb, data, hl)


if __name__ == '__main__':
    main()
