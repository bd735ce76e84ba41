#!/usr/bin/python3
"""bench.summary: bench/summary.py judges the targets set by a bound (issue 27) and prints the
bound beside the verdict. Synthetic rows, each section as its program writes it; asserts the
verdicts, the exit status, the printed bound and the fields of bench-results.json."""
import json
import os
import subprocess
import sys
import tempfile

SUMMARY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "summary.py")

KERNELS = [
    # 96% of the ceiling: passes (needs 95%)
    {"name": "histogram_update", "threads": 1, "qcal_s": 0.00218, "torch_s": 0.0416,
     "torch_ratio": 19.0, "limit_fraction": 0.96, "target": ">= 95% of the increment-probe ceiling ratio",
     "pass": True, "bound_share": 0.96, "bound_need": 0.95,
     "bound_desc": "increment-probe ceiling 20.0x PyTorch (4.01 G/s)", "label": "Histogram update"},
    # the program says pass but the share is short: the summary fails it
    {"name": "fakequant_forward_backward", "threads": 2, "qcal_s": 0.005, "torch_s": 0.08,
     "torch_ratio": 16.0, "limit_fraction": 1.10, "target": ">= 120% of the paired copy probe",
     "pass": True, "bound_share": 1.10, "bound_need": 1.20, "bound_desc": "copy probe 35.1 GB/s",
     "label": "fake-quant forward+backward 16M"},
    # an ordinary row: unchanged
    {"name": "minmax", "threads": 1, "qcal_s": 0.0024, "torch_s": 0.0027, "torch_ratio": 1.26,
     "target": ">= 85% read bw", "pass": True, "label": "MinMax observer 16M"},
]
MPI = [
    # 97% of the ceiling but under 1.5x: fails on the minimum speed-up
    {"name": "mpi_calibrate_2v1", "label": "2 ranks vs 1", "qcal_s": 0.6, "ref_s": 0.87,
     "ratio": 1.45, "spread": [1.4, 1.5], "verdict": "fail", "pass": False, "bound_share": 0.97,
     "bound_need": 0.9, "bound_min_ratio": 1.5, "bound_desc": "the ceiling 1.49x"},
]


def main():
    with tempfile.TemporaryDirectory() as d:
        paths = {}
        for name, rows in (("kernels", KERNELS), ("mpi", MPI), ("engines", [])):
            paths[name] = os.path.join(d, name + ".json")
            with open(paths[name], "w") as f:
                json.dump(rows, f)
        blas = os.path.join(d, "blas.json")
        with open(blas, "w") as f:
            json.dump({"summary": "openblas 0.3.21 kernel Zen"}, f)
        out = os.path.join(d, "bench-results.json")
        r = subprocess.run([sys.executable, SUMMARY, "--out", out, "--blas", blas] +
                           ["%s=%s" % kv for kv in paths.items()], capture_output=True, text=True)
        fails = []

        def check(ok, what):
            if not ok:
                fails.append(what)
        check(r.returncode == 1, "exit status %d, want 1 (a row fails)" % r.returncode)
        rows = {x["name"]: x for x in json.load(open(out))}
        check(rows["histogram_update"]["pass"] is True, "histogram row should pass")
        check(rows["fakequant_forward_backward"]["pass"] is False, "fq row: 110% < 120% passed")
        check(rows["minmax"]["pass"] is True, "minmax row changed")
        check(rows["mpi_calibrate_2v1"]["pass"] is False, "mpi row: 1.45x < 1.5x passed")
        check(all(x["reference_blas"]["summary"].endswith("Zen") for x in rows.values()),
              "reference_blas not recorded in every row")
        check("96% of increment-probe ceiling 20.0x PyTorch (4.01 G/s) (needs 95%)" in r.stdout,
              "histogram bound not printed beside the verdict")
        check("**FAIL**: 110% of copy probe 35.1 GB/s (needs 120%)" in r.stdout,
              "fq bound not printed beside its FAIL")
        check("(needs 90% and >= 1.5x)" in r.stdout, "mpi bound not printed")
        check("Reference processes (PyTorch, numpy): openblas 0.3.21 kernel Zen" in r.stdout,
              "BLAS line not printed")
        check("fake-quant forward+backward 16M: the program's verdict" in r.stderr or
              "fakequant_forward_backward: the program's verdict" in r.stderr,
              "disagreeing verdict not reported")
        check("2 of 4 rows with a target pass" in r.stdout, "count line wrong")
        if fails:
            print("FAILED:\n  " + "\n  ".join(fails) + "\n--- stdout\n" + r.stdout +
                  "--- stderr\n" + r.stderr)
            return 1
    print("bench.summary: 8 checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
