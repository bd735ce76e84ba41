#!/usr/bin/python3
"""Writes the .npy golden files of tests/test_npy.c and tests/test_cli.c into tests/data/npy/.

Every file is written by numpy itself (np.save / np.lib.format.write_array), so the tests
check qcal's reader against real numpy output and qcal's writer byte for byte against it.
Values are simple closed forms that the C test recomputes:
  f32_3x4.npy      float32 (3, 4): i * 0.25 - 1.5 for i in 0..11
  f32_1d.npy       float32 (5,): i * 0.25 - 1.5
  u8_2x3.npy       uint8 (2, 3): i * 50 (mod 256)
  i8_2x3.npy       int8 (2, 3): i * 50 - 128
  i32_4.npy        int32 (4,): [-2147483648, -1, 0, 2147483647]
  i64_3.npy        int64 (3,): [-5, 0, 7]
  scalar_f32.npy   float32 0-d array: 3.5
  empty_f32.npy    float32 (0, 3)
  f64_5.npy        float64 values that round when narrowed, plus 1e300 (-> inf) and nan;
                   f64_5_as_f32.npy holds numpy's astype(float32) of it (the golden)
  f16_all.npy      every float16 bit pattern (65536 values, includes subnormals, inf, nan);
                   f16_all_as_f32.npy holds numpy's astype(float32) of it
  f32_v2.npy       f32_3x4 data with a version 2.0 header; f32_v3.npy with 3.0
  fortran_2x3.npy  float32 Fortran-order (unsupported)      big_endian.npy  '>f4'
  complex.npy      '<c8'     object.npy '|O' (pickle)     structured.npy  [('a','<f4')]
  bool.npy         '|b1' [True, False] (read as bool)
"""
import os
import numpy as np

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "npy")
os.makedirs(out, exist_ok=True)


def save(name, arr, **kw):
    np.save(os.path.join(out, name), arr, **kw)


save("f32_3x4.npy", (np.arange(12, dtype=np.float32) * 0.25 - 1.5).reshape(3, 4))
save("f32_1d.npy", np.arange(5, dtype=np.float32) * 0.25 - 1.5)
save("u8_2x3.npy", ((np.arange(6) * 50) % 256).astype(np.uint8).reshape(2, 3))
save("i8_2x3.npy", (np.arange(6) * 50 - 128).astype(np.int8).reshape(2, 3))
save("i32_4.npy", np.array([-2147483648, -1, 0, 2147483647], dtype=np.int32))
save("i64_3.npy", np.array([-5, 0, 7], dtype=np.int64))
save("scalar_f32.npy", np.array(3.5, dtype=np.float32))
save("empty_f32.npy", np.zeros((0, 3), dtype=np.float32))

f64 = np.array([0.1, -1.0 / 3.0, 1e300, np.nan, 1.0000000596046448], dtype=np.float64)
save("f64_5.npy", f64)
with np.errstate(over="ignore"):
    save("f64_5_as_f32.npy", f64.astype(np.float32))
f16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
save("f16_all.npy", f16)
save("f16_all_as_f32.npy", f16.astype(np.float32))

base = (np.arange(12, dtype=np.float32) * 0.25 - 1.5).reshape(3, 4)
for ver in (2, 3):
    with open(os.path.join(out, "f32_v%d.npy" % ver), "wb") as f:
        np.lib.format.write_array(f, base, version=(ver, 0))

save("fortran_2x3.npy", np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
save("big_endian.npy", np.arange(4, dtype=">f4"))
save("complex.npy", np.arange(3, dtype=np.complex64))
save("object.npy", np.array([1, "a", None], dtype=object), allow_pickle=True)
save("structured.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
save("bool.npy", np.array([True, False]))
print("wrote", sorted(os.listdir(out)))
