#!/usr/bin/python3
"""Checks ONNX Runtime's three calibration files that qcal wrote into DIR.

usage: check_ort_files.py DIR [NAME ...]

1. calibration.flatbuffers is read with Debian's flatbuffers (python3-flatbuffers) through
   the TrtTable { dict: [KeyValue { key: string; value: string }] } schema of ONNX Runtime's
   CalTableFlatBuffers (field slots written out below, as flatc generates them).
2. The three files are written again by write_calibration_table's own code
   (onnxruntime/python/tools/quantization/quant_utils.py, copied below with its Builder
   calls) from the dict in calibration.json, and must be byte-identical to qcal's.
   qcal's one documented difference: a tensor whose range is [0, 0] gets the value 1.0.
3. Every NAME given must be a key of all three files.
Exit 0 when everything holds; otherwise the difference is printed and the exit code is 1.
"""
import json
import os
import sys

import flatbuffers
from flatbuffers import number_types as N
from flatbuffers.table import Table


class KeyValue:
    """Reader of `table KeyValue { key: string (key); value: string; }`."""

    def __init__(self, buf, pos):
        self._tab = Table(buf, pos)

    def _string(self, slot):
        o = N.UOffsetTFlags.py_type(self._tab.Offset(4 + 2 * slot))
        return self._tab.String(o + self._tab.Pos) if o != 0 else None

    def Key(self):
        return self._string(0)

    def Value(self):
        return self._string(1)


class TrtTable:
    """Reader of `table TrtTable { dict: [KeyValue]; }` (root type)."""

    def __init__(self, buf):
        n = flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0)
        self._tab = Table(buf, n)

    def DictLength(self):
        o = N.UOffsetTFlags.py_type(self._tab.Offset(4))
        return self._tab.VectorLen(o) if o != 0 else 0

    def Dict(self, j):
        o = N.UOffsetTFlags.py_type(self._tab.Offset(4))
        x = self._tab.Vector(o) + j * 4
        x = self._tab.Indirect(x)
        return KeyValue(self._tab.Bytes, x)


def write_calibration_table(calibration_cache, values):
    """write_calibration_table's serialisation (ONNX Runtime 1.13-1.15), returning the three
    files instead of writing them. values[key] is str(max(abs(lo), abs(hi))) except for
    qcal's amax-0 rule."""
    js = json.dumps(calibration_cache)
    builder = flatbuffers.Builder(1024)
    key_value_list = []
    for key in sorted(calibration_cache.keys()):
        value = values[key]
        flat_key = builder.CreateString(key)
        flat_value = builder.CreateString(value)
        builder.StartObject(2)                                  # KeyValueStart
        builder.PrependUOffsetTRelativeSlot(0, flat_key, 0)     # KeyValueAddKey
        builder.PrependUOffsetTRelativeSlot(1, flat_value, 0)   # KeyValueAddValue
        key_value_list.append(builder.EndObject())              # KeyValueEnd
    builder.StartVector(4, len(key_value_list), 4)              # TrtTableStartDictVector
    for key_value in key_value_list:
        builder.PrependUOffsetTRelative(key_value)
    main_dict = builder.EndVector()
    builder.StartObject(1)                                      # TrtTableStart
    builder.PrependUOffsetTRelativeSlot(0, main_dict, 0)        # TrtTableAddDict
    cal_table = builder.EndObject()                             # TrtTableEnd
    builder.Finish(cal_table)
    fb = bytes(builder.Output())
    cache = ''
    for key in sorted(calibration_cache.keys()):
        cache += key + ' ' + values[key] + '\n'
    return js.encode(), fb, cache.encode()


def main():
    d = sys.argv[1]
    names = sys.argv[2:]
    got = []
    for f in ('calibration.json', 'calibration.flatbuffers', 'calibration.cache'):
        with open(os.path.join(d, f), 'rb') as fh:
            got.append(fh.read())
    cache = {k: tuple(v) for k, v in json.loads(got[0]).items()}
    values = {}
    for k, (lo, hi) in cache.items():
        amax = max(abs(lo), abs(hi))
        values[k] = str(amax if amax != 0 else 1.0)
    want = write_calibration_table(cache, values)
    ok = True
    for f, g, w in zip(('calibration.json', 'calibration.flatbuffers', 'calibration.cache'),
                       got, want):
        if g != w:
            print('%s differs from write_calibration_table:\n  qcal: %r\n  ORT:  %r' % (f, g, w))
            ok = False
    table = TrtTable(got[1])
    fb = {}
    for i in range(table.DictLength()):
        kv = table.Dict(i)
        fb[kv.Key().decode()] = kv.Value().decode()
    if fb != values:
        print('flatbuffer dict %r != %r' % (fb, values))
        ok = False
    text = dict(line.rsplit(' ', 1) for line in got[2].decode().splitlines())
    for n in names:
        if n not in cache or n not in fb or n not in text:
            print('name %r missing (json %s, flatbuffers %s, cache %s)' %
                  (n, n in cache, n in fb, n in text))
            ok = False
    print('checked %d entries, %d bytes of flatbuffer: %s' % (len(fb), len(got[1]),
                                                            'ok' if ok else 'FAILED'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
