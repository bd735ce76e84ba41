#!/usr/bin/python3
"""Reference values for tests/test_idx.c, read from the Debian dataset-fashion-mnist files
with Python's gzip module (independent of zlib's C API as used by qcal).
Writes tests/data/idx/fmnist_summary.txt:
  <split> <count> <rows> <cols>
  <split>_labels_first20 l0 ... l19
  <split>_pixel_sum_first5 s0 ... s4
  <split>_pixel_sum_total S
  <split>_label_hist h0 ... h9
Run: /usr/bin/python3 tests/ref/gen_idx.py"""
import gzip, os, struct

D = "/usr/share/datasets/fashion-mnist"
out = os.path.join(os.path.dirname(__file__), "..", "data", "idx", "fmnist_summary.txt")
lines = []
for split in ("train", "t10k"):
    img = gzip.open(f"{D}/{split}-images-idx3-ubyte.gz").read()
    lab = gzip.open(f"{D}/{split}-labels-idx1-ubyte.gz").read()
    magic, n, r, c = struct.unpack(">IIII", img[:16])
    assert magic == 0x803
    lmagic, ln = struct.unpack(">II", lab[:8])
    assert lmagic == 0x801 and ln == n
    pix = img[16:]
    labels = lab[8:]
    lines.append(f"{split} {n} {r} {c}")
    lines.append(f"{split}_labels_first20 " + " ".join(str(x) for x in labels[:20]))
    lines.append(f"{split}_pixel_sum_first5 " + " ".join(str(sum(pix[i*r*c:(i+1)*r*c])) for i in range(5)))
    lines.append(f"{split}_pixel_sum_total {sum(pix)}")
    hist = [0] * 10
    for x in labels:
        hist[x] += 1
    lines.append(f"{split}_label_hist " + " ".join(str(h) for h in hist))
open(out, "w").write("\n".join(lines) + "\n")
print(open(out).read())
