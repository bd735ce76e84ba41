"""`pip install .`, `pip wheel .` and `meson install` of the Python package (suite pip).

Everything happens in a temporary directory, removed at the end: a copy of the source tree
(meson-python 0.12 writes .mesonpy-native-file.ini and a .mesonpy-* directory into the tree
it builds), a venv with --system-site-packages (Debian's numpy and meson-python; PEP 668
leaves the system alone), pip run offline (--no-index, --no-build-isolation) on the copy,
meson-python's build directory. Then, from another directory and without PYTHONPATH:
the venv imports qcal and runs a tiny calibration; the wheel installed into a second venv
does too after the build directory is gone (libqcal is linked in); `meson install
--destdir` of this build puts the package in a directory /usr/bin/python3 reads.
Skips (77) without pip, meson-python or venv."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

SRC = os.environ.get("QCAL_SOURCE_ROOT")
BUILD = os.environ.get("QCAL_BUILD_ROOT")

# A tiny calibration: numbers checked exactly (minmax quint8 of [-1, 3]: scale 4/255,
# zero point round(1/scale) = 64; a Session's table and its JSON).
CHECK = r"""
import json, os, sys, numpy as np, qcal
where = os.path.dirname(os.path.abspath(qcal.__file__))
o = qcal.Observer("minmax")
o.update(np.array([-1.0, 0.5, 3.0], np.float32))
s, z = o.qparams()
s_ = qcal.Session(observer="minmax")
s_.observe("x", np.linspace(-1, 3, 9, dtype=np.float32))
t = s_.table()
js = json.loads(t.format())["entries"][0]["scale"][0]
try:                     # qcal.torch and its private modules, installed beside it
    import torch
except ImportError:
    torch_ok = None
else:
    import qcal.torch as qt
    ob = qt.FakeQuantize(observer=qt.MinMaxObserver)
    ob(torch.tensor([-1.0, 0.5, 3.0]))
    torch_ok = bool(all(os.path.dirname(m.__file__) == where for m in (
        qt, sys.modules["qcal._torch_observers"], sys.modules["qcal._torch_qat"],
        sys.modules["qcal._torch_loggers"])) and ob.scale.item() == s[0])
print(json.dumps({"file": where, "version": qcal.__version__,
                  "scale_ok": bool(s[0] == np.float32(4.0) / np.float32(255.0)),
                  "zp": int(z[0]), "fqn": t.entries[0]["fqn"],
                  "json_ok": bool(np.float32(js) == s[0] == t.entries[0]["scale"][0]),
                  "torch_ok": torch_ok}))
"""


def skip(why):
    print(f"pip: skipped: {why}")
    sys.exit(77)


def run(cmd, cwd, env, what):
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        print(f"FAIL: {what} (exit {r.returncode}, {dt:.1f} s): {' '.join(cmd)}\n"
              f"--- stdout\n{r.stdout[-6000:]}\n--- stderr\n{r.stderr[-6000:]}")
        sys.exit(1)
    print(f"{what}: {dt:.1f} s")
    return r.stdout


def check_import(python, cwd, env, expect_under, what):
    got = json.loads(run([python, "-c", CHECK], cwd, env, what).strip().splitlines()[-1])
    ok = (got["file"].startswith(expect_under) and got["fqn"] == "x" and got["zp"] == 64
          and got["scale_ok"] and got["json_ok"] and got["torch_ok"] is not False)
    if not ok:
        print(f"FAIL: {what}: {got} (expected the package under {expect_under}, scale "
              f"float32(4) / float32(255) in qparams, entries and JSON, zero point 64, and "
              f"qcal.torch's modules beside it with that scale, where PyTorch is installed)")
        sys.exit(1)
    return got


def top_level_skip(d, names):
    """Build directories, git metadata and outputs at the top of the source tree."""
    return [n for n in names if d == SRC and (n.startswith(("build", ".git", ".mesonpy"))
                                              or n in ("out", "qcal-demo-out"))]


def main():
    if not SRC or not BUILD:
        skip("QCAL_SOURCE_ROOT / QCAL_BUILD_ROOT not set (run through meson test)")
    py = sys.executable
    for mod, pkg in (("pip", "python3-pip"), ("mesonpy", "python3-mesonpy"),
                     ("venv", "python3 venv")):
        if subprocess.run([py, "-c", f"import {mod}"], capture_output=True).returncode:
            skip(f"no {mod} ({pkg})")
    tmp = tempfile.mkdtemp(prefix="qcal-pip-")
    try:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
                             "PIP_FIND_LINKS")}
        env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
        src = os.path.join(tmp, "src")
        shutil.copytree(SRC, src, ignore=top_level_skip, symlinks=True)
        elsewhere = os.path.join(tmp, "elsewhere")
        os.makedirs(elsewhere)
        venv = os.path.join(tmp, "venv")
        run([py, "-m", "venv", "--system-site-packages", "--without-pip", venv], tmp, env,
            "venv")
        vpy = os.path.join(venv, "bin", "python")
        builddir = os.path.join(tmp, "mesonpy-build")
        cs = f"--config-settings=builddir={builddir}"
        t0 = time.monotonic()
        run([vpy, "-m", "pip", "install", "--no-build-isolation", "--no-index", cs, src],
            elsewhere, env, "pip install --no-build-isolation . (full build)")
        wheels = os.path.join(tmp, "wheels")
        run([vpy, "-m", "pip", "wheel", "--no-build-isolation", "--no-index", "--no-deps", cs,
             "-w", wheels, src], elsewhere, env, "pip wheel --no-build-isolation . (same build)")
        print(f"pip install + pip wheel: {time.monotonic() - t0:.1f} s")
        whl = [f for f in os.listdir(wheels) if f.endswith(".whl")]
        if len(whl) != 1:
            print(f"FAIL: expected one wheel, got {whl}")
            sys.exit(1)
        with zipfile.ZipFile(os.path.join(wheels, whl[0])) as z:
            names = sorted(n for n in z.namelist() if ".dist-info/" not in n)
        print(f"{whl[0]}: {names}")
        want = {"qcal/__init__.py", "qcal/onnx.py", "qcal/torch.py", "qcal/_torch_observers.py",
                "qcal/_torch_loggers.py", "qcal/_torch_qat.py"}
        exts = [n for n in names if n.startswith("qcal/_qcal.") and n.endswith(".so")]
        other_so = [n for n in names if ".so" in n and n not in exts]
        if not want <= set(names) or len(exts) != 1 or other_so:
            print(f"FAIL: the wheel should hold the package and its one extension (libqcal "
                  f"linked in), got {names}")
            sys.exit(1)
        shutil.rmtree(builddir)   # nothing may depend on the build tree
        site = run([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                   elsewhere, env, "venv site").strip()
        got = check_import(vpy, elsewhere, env, site, "import qcal from the pip-installed venv")
        venv2 = os.path.join(tmp, "venv2")
        run([py, "-m", "venv", "--system-site-packages", "--without-pip", venv2], tmp, env,
            "venv2")
        vpy2 = os.path.join(venv2, "bin", "python")
        run([vpy2, "-m", "pip", "install", "--no-index", "--no-deps",
             os.path.join(wheels, whl[0])], elsewhere, env, "pip install the wheel")
        site2 = run([vpy2, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                    elsewhere, env, "venv2 site").strip()
        got2 = check_import(vpy2, elsewhere, env, site2, "import qcal from the wheel")
        if got["version"] != got2["version"]:
            print(f"FAIL: versions differ: {got['version']} {got2['version']}")
            sys.exit(1)

        # meson install: the package of this build tree (configured for /usr/bin/python3
        # and the default prefix) lands in one of /usr/bin/python3's site directories.
        stage = os.path.join(tmp, "stage")
        run(["meson", "install", "-C", BUILD, "--no-rebuild", "--destdir", stage,
             "--tags", "python-runtime", "--quiet"], elsewhere, env,
            "meson install --tags python-runtime --destdir")
        inits = []
        for root, _, files in os.walk(stage):
            if "__init__.py" in files and os.path.basename(root) == "qcal":
                inits.append(os.path.dirname(root))
        target = os.path.join("/", os.path.relpath(inits[0], stage)) if len(inits) == 1 else None
        syspy = json.loads(run(["/usr/bin/python3", "-c", "import json, site, sys; "
                                "print(json.dumps([site.getsitepackages(), sys.prefix]))"],
                               elsewhere, env, "site directories").strip())
        prefix = json.loads(subprocess.run(
            ["meson", "introspect", BUILD, "--buildoptions"], capture_output=True,
            text=True).stdout or "[]")
        prefix = next((o["value"] for o in prefix if o["name"] == "prefix"), None)
        print(f"meson install (prefix {prefix}) puts qcal in {target}; /usr/bin/python3 "
              f"reads {syspy[0]}")
        if prefix in ("/usr", "/usr/local") and target not in syspy[0]:
            print(f"FAIL: meson install puts the package in {target}, which is not on "
                  f"/usr/bin/python3's sys.path {syspy[0]}")
            sys.exit(1)
        check_import("/usr/bin/python3", elsewhere, dict(env, PYTHONPATH=inits[0]), inits[0],
                     "import qcal from the meson-installed copy")
        print(f"pip: ok ({got['version']})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
