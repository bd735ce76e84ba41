#!/usr/bin/python3
"""Every number the docs attribute to PyTorch, produced by PyTorch.

Run with the Debian python (PyTorch 1.13 + numpy):
    /usr/bin/python3 tests/ref/gen_doc_numbers.py
Writes tests/data/docs/pytorch_numbers.txt: one `FILE<TAB>TEXT` line per claim, TEXT being
the exact words the doc must contain, formatted from what torch prints here.
unit.docs_pytorch fails when a doc lacks one of them (so a doc cannot drift from these
numbers), and python.torch_histogram regenerates the lines with the live torch and fails
when they differ from the committed file (so the file cannot drift from torch).
"""
import os
import sys
import warnings

import numpy as np
import torch
from torch.ao.quantization.observer import HistogramObserver

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "data", "docs", "pytorch_numbers.txt")


def lines():
    """The (file, text) claims, computed with torch."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    x = np.load(os.path.join(ROOT, "examples", "data", "fmnist_test_batch.npy"))
    obs = HistogramObserver()
    obs(torch.from_numpy(x))
    new_min, new_max = obs._non_linear_param_search()
    s, z = obs.calculate_qparams()
    s, z = s.item(), int(z.item())
    lo, hi = int(obs.min_val.item()), int(obs.max_val.item())
    dropped = int(((x < lo) | (x > hi)).sum())
    out = [
        ("README.md", f"(PyTorch 1.13's `HistogramObserver` on the same batch: scale {s:.9g}, "
                      f"zero-point {z};"),
        ("docs/cli.md", f"PyTorch 1.13's `HistogramObserver` gives scale {s:.9g} and "
                        f"zero-point {z} on the same"),
        ("docs/cli.md", f'prints `"min": [{new_min.item():.9g}], "max": '
                        f'[{new_max.item():.9g}], "scale": [{s:.9g}], "zero_point": [{z}]`.'),
        ("docs/cli.md", f"bounds (here [{lo}, {hi}]: {dropped} of the {x.size} values"),
    ]
    sym = HistogramObserver(dtype=torch.quint8, qscheme=torch.per_tensor_symmetric,
                            reduce_range=True)
    sym(torch.tensor([-1.0, 0.5, 3.0]))
    s2, z2 = sym.calculate_qparams()
    out.append(("docs/observers.md",
                f"(PyTorch 1.13 on [-1, 0.5, 3]: {s2.item():.3g} and zero-point "
                f"{int(z2.item())}, outside its own range"))
    out.append(("docs/observers.md",
                f"zero-point {int(z2.item())}, outside the range [{sym.quant_min}, "
                f"{sym.quant_max}] it reports"))
    return out


def render():
    return "".join(f"{f}\t{t}\n" for f, t in lines())


def main():
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    text = render()
    with open(OUT, "w") as f:
        f.write(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
