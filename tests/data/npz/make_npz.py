"""Small .npz fixtures for tests/test_dataset.c, made with numpy's own writers (Debian's
/usr/bin/python3 + numpy): run from this directory, `/usr/bin/python3 make_npz.py`.

  plain.npz       np.savez: x float32 [4, 3] (arange / 4), mask bool [4], ids int64 [4],
                  h float16 [2, 2], s float32 0-d (3.5)
  compressed.npz  np.savez_compressed of the same arrays (deflated members)
                  (numpy 1.24 opens every member with force_zip64=True: both files carry a
                  ZIP64 extra field in each local header)
  zip64_cd.npz    plain.npz's members rewritten with every central-directory size and offset
                  in a ZIP64 extra field (0xFFFFFFFF in the 32-bit fields) and a ZIP64 end
                  record + locator, as zipfile writes archives past 4 GiB (checked by np.load)
  stream.npz      np.savez to an unseekable stream: local headers carry data descriptors
                  (flag bit 3), sizes only in the central directory
"""
import io
import zipfile

import numpy as np

arrays = {
    "x": (np.arange(12, dtype=np.float32) / 4).reshape(4, 3),
    "mask": np.array([True, False, True, True]),
    "ids": np.array([-5, 0, 7, 1 << 40], dtype=np.int64),
    "h": np.array([[1.0, -2.0], [0.5, 65504.0]], dtype=np.float16),
    "s": np.float32(3.5),
}

np.savez("plain.npz", **arrays)
np.savez_compressed("compressed.npz", **arrays)


def zip64_everywhere(src, dst):
    import struct
    zin = zipfile.ZipFile(src)
    out = bytearray()
    central = bytearray()
    for info in zin.infolist():
        data = zin.read(info.filename)
        name = info.filename.encode()
        off = len(out)
        crc = zipfile.crc32(data)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0x21, crc, len(data),
                           len(data), len(name), 0) + name + data
        extra = struct.pack("<HHQQQ", 1, 24, len(data), len(data), off)
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0x21, crc,
                               0xFFFFFFFF, 0xFFFFFFFF, len(name), len(extra), 0, 0, 0, 0,
                               0xFFFFFFFF) + name + extra
    n = len(zin.infolist())
    cd_off = len(out)
    out += central
    z64 = len(out)
    out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_off)
    out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    with open(dst, "wb") as f:
        f.write(bytes(out))


zip64_everywhere("plain.npz", "zip64_cd.npz")
for k, v in np.load("zip64_cd.npz").items():
    assert np.array_equal(v, arrays[k]) and v.dtype == arrays[k].dtype, k


class Unseekable(io.RawIOBase):
    def __init__(self):
        self.buf = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.buf += b
        return len(b)


u = Unseekable()
np.savez(u, **arrays)
with open("stream.npz", "wb") as f:
    f.write(bytes(u.buf))
