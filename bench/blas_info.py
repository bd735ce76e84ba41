#!/usr/bin/python3
"""bench/blas_info.py: which OpenBLAS kernel the bench's reference processes run.

Some machines set OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) in the environment, which pins
OpenBLAS to an older kernel and slows PyTorch's and numpy's BLAS paths. bench/run starts its
reference processes (PyTorch, numpy) with both unset, as users get them; tests and CI keep
the environment. This script imports numpy and torch (when installed) in a child started the
way bench/run starts the reference processes (the variables in UNSET removed) and, for the
record, in this process (the environment as it is), and asks threadpoolctl (Debian
python3-threadpoolctl) which BLAS each loaded: threadpool_info()'s 'internal_api',
'architecture' (the kernel), 'version', 'threading_layer'.

usage: bench/blas_info.py [--json FILE]
Prints one line; --json FILE writes {"summary", "reference": [...], "environment": [...],
"unset": [...], "environment_values": {...}} (bench/summary.py --blas FILE). Exit 0 even
without threadpoolctl (the summary then says so).
"""
import json
import os
import subprocess
import sys

UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

PROBE = r"""
import json
try:
    import numpy  # noqa: F401
except ImportError:
    pass
try:
    import torch  # noqa: F401
except ImportError:
    pass
try:
    import threadpoolctl
    info = [i for i in threadpoolctl.threadpool_info() if i.get("user_api") == "blas"]
except ImportError:
    info = None
print(json.dumps(info))
"""


def probe(env):
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def describe(libs):
    if libs is None:
        return "unknown (python3-threadpoolctl not installed)"
    if not libs:
        return "no BLAS loaded by numpy/torch"
    return ", ".join(f"{i.get('internal_api', '?')} {i.get('version') or ''} kernel "
                     f"{i.get('architecture') or '?'} ({i.get('threading_layer') or '?'}; "
                     f"{os.path.basename(i.get('filepath') or '?')})".replace("  ", " ")
                     for i in libs)


def main():
    out = None
    if len(sys.argv) == 3 and sys.argv[1] == "--json":
        out = sys.argv[2]
    elif len(sys.argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    ref_env = {k: v for k, v in os.environ.items() if k not in UNSET}
    ref = probe(ref_env)
    here = probe(dict(os.environ))
    values = {k: os.environ.get(k) for k in UNSET}
    set_vals = ", ".join(f"{k}={v}" for k, v in values.items() if v is not None)
    summary = f"{describe(ref)}, run with {' and '.join(UNSET)} unset"
    if set_vals:
        summary += f" (this environment sets {set_vals}: there {describe(here)}; tests and CI keep it)"
    else:
        summary += " (neither is set in this environment)"
    res = {"summary": summary, "reference": ref, "environment": here, "unset": list(UNSET),
           "environment_values": values}
    print(f"bench/run: reference processes: {summary}", file=sys.stderr)
    if out:
        with open(out + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
