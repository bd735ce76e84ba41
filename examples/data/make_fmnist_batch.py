#!/usr/bin/python3
"""Writes examples/data/fmnist_test_batch.npy: the first 256 Fashion-MNIST test images,
normalised as (pixel / 255 - 0.2860) / 0.3530, float32, shape (256, 1, 28, 28).

Source: /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz (Debian package
dataset-fashion-mnist; IDX format: big-endian magic 0x00000803, count, rows, cols, bytes).
Run with /usr/bin/python3 (needs numpy only)."""
import gzip
import os
import struct

import numpy as np

SRC = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
N = 256
MEAN, STD = 0.2860, 0.3530

with gzip.open(SRC, "rb") as f:
    magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
    if magic != 0x00000803 or count < N or (rows, cols) != (28, 28):
        raise SystemExit("unexpected IDX header: magic %#x count %d %dx%d" % (magic, count, rows, cols))
    pixels = np.frombuffer(f.read(N * rows * cols), dtype=np.uint8)

# float32 arithmetic throughout: pixel/255 in float32, then (x - mean) / std in float32.
x = pixels.astype(np.float32) / np.float32(255.0)
x = (x - np.float32(MEAN)) / np.float32(STD)
x = x.reshape(N, 1, rows, cols).astype(np.float32)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fmnist_test_batch.npy")
np.save(out, x)
print("wrote %s: shape %s, min %.6f, max %.6f" % (out, x.shape, x.min(), x.max()))
