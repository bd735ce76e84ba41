#!/usr/bin/python3
"""bench/summary.py: one verdict over every section bench/run ran.

usage: summary.py --out bench-results.json [--doc FILE] [--blas FILE] SECTION=ROWS.json ...

Each ROWS.json is a list of row objects written by one bench program (bench/qcal_bench,
bench/int8_cnn.c, bench/e2e_calibrate.py, bench/python_observers.py, bench/mpi_scale). The
programs spell a few fields differently; this script reads them all into one shape:
  name, label, section, threads, qcal_s, ref_s, ratio, ratio_min, ratio_max, target, pass
and writes the list (each row keeps its original fields too) to --out. It prints every row
with its spread and the count of passing rows; the exit status is 1 when an evaluated row
fails.

Targets set by a bound (issue 27): a row with "bound_share" (the share of its bound it
reached, median over its pairs), "bound_need" (the share it must reach), "bound_desc" (the
bound, measured in the same run) and optionally "bound_min_ratio" (a speed-up it must reach
as well) is judged here: it passes when share >= need (and ratio >= bound_min_ratio) and the
program's own verdict (which may hold other conditions, e.g. identical tables) is not a
failure. The bound is printed beside every such verdict. A program verdict that disagrees
with this check is reported on stderr.
--blas FILE: JSON written by bench/blas_info.py in the reference processes' environment
(which OpenBLAS kernel PyTorch and numpy run); recorded in every row as "reference_blas"
and printed above the tables. --doc FILE replaces the text between the lines "<!-- bench/run: begin -->" and
"<!-- bench/run: end -->" in FILE with the run's tables (the whole file when they are absent).
Only the standard library: it runs with any python3.
"""
import datetime
import json
import os
import platform
import sys

BEGIN, END = "<!-- bench/run: begin -->", "<!-- bench/run: end -->"


def num(v):
    return v if isinstance(v, (int, float)) and v == v else None


def norm(section, r):
    """One row in the common shape (the original fields kept)."""
    o = dict(r)
    o["section"] = section
    o["name"] = r.get("name") or r.get("row") or r.get("label") or "?"
    o["label"] = r.get("label") or r.get("row") or o["name"]
    q = num(r.get("qcal_s"))
    if q is None and num(r.get("qcal_us")) is not None:
        q = r["qcal_us"] * 1e-6
    t = num(r.get("torch_s"))
    if t is None and num(r.get("torch_us")) is not None:
        t = r["torch_us"] * 1e-6
    if t is None:
        t = num(r.get("ref_s"))
    o["qcal_s"], o["ref_s"] = q, t
    ratio = num(r.get("torch_ratio"))
    if ratio is None:
        ratio = num(r.get("ratio"))
    lo, hi = num(r.get("torch_ratio_min")), num(r.get("torch_ratio_max"))
    sp = r.get("spread") or r.get("ratio_spread")
    if lo is None and isinstance(sp, (list, tuple)) and len(sp) == 2:
        lo, hi = num(sp[0]), num(sp[1])
    if lo is None:
        lo, hi = num(r.get("ratio_min")), num(r.get("ratio_max"))
    o["ratio"], o["ratio_min"], o["ratio_max"] = ratio, lo, hi
    p = r.get("pass")
    if p is None and "ok" in r:
        p = r["ok"]
    if p is None and isinstance(r.get("verdict"), str):
        p = r["verdict"].lower() in ("pass", "ok")
    o["pass"] = None if p is None else bool(p)
    o["target"] = r.get("target")
    judge_bound(o)
    return o


def judge_bound(o):
    """The verdict of a row whose target is a share of a bound measured in the same run."""
    share, need = num(o.get("bound_share")), num(o.get("bound_need"))
    if need is None:
        return
    ok = share is not None and share >= need
    mr = num(o.get("bound_min_ratio"))
    if mr is not None:
        ok = ok and o["ratio"] is not None and o["ratio"] >= mr
    if o["pass"] is not None and o["pass"] != ok:
        print(f"summary.py: {o['section']}: {o['name']}: the program's verdict "
              f"({'pass' if o['pass'] else 'fail'}) and the bound check "
              f"({'pass' if ok else 'fail'}) differ; both must pass", file=sys.stderr)
    o["bound_pass"] = ok
    o["pass"] = ok if o["pass"] is None else (ok and o["pass"])


def bound_text(r):
    """The bound beside the verdict: '96% of <bound> (needs 95%)', or '-'."""
    need = num(r.get("bound_need"))
    if need is None:
        return "-"
    share = num(r.get("bound_share"))
    t = (f"{'-' if share is None else f'{share * 100:.0f}%'} of {r.get('bound_desc') or 'the bound'}"
         f" (needs {need * 100:.0f}%")
    mr = num(r.get("bound_min_ratio"))
    if mr is not None:
        t += f" and >= {mr:g}x"
    return t + ")"


def fmt_t(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_ratio(r):
    if r["ratio"] is None:
        return "-"
    if r["ratio_min"] is None:
        return f"{r['ratio']:.2f}x"
    return f"{r['ratio']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"


def verdict(r):
    v = "-" if r["pass"] is None else ("pass" if r["pass"] else "**FAIL**")
    if num(r.get("bound_need")) is not None:
        v += ": " + bound_text(r)
    return v


def kernel_table(rows):
    out = ["| operation | threads | qcal median | qcal GB/s | bound | bound GB/s | "
           "of bound (spread) | PyTorch median | vs PyTorch (spread) | target | verdict |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gb = num(r.get("qcal_gbps"))
        lim = num(r.get("limit_gbps"))
        fr = num(r.get("limit_fraction"))
        frs = "-"
        if fr is not None:
            frs = f"{fr * 100:.0f}%"
            if num(r.get("limit_fraction_min")) is not None:
                frs += (f" ({r['limit_fraction_min'] * 100:.0f}-"
                        f"{r['limit_fraction_max'] * 100:.0f})")
        label = r["label"] + (f": {r['note']}" if r.get("note") else "")
        out.append(f"| {label} | {r.get('threads', '-')} | {fmt_t(r['qcal_s'])} | "
                   f"{'-' if gb is None else f'{gb:.1f}'} | {r.get('bound', '-')} | "
                   f"{'-' if lim is None else f'{lim:.1f}'} | {frs} | {fmt_t(r['ref_s'])} | "
                   f"{fmt_ratio(r)} | {r['target'] or '-'} | {verdict(r)} |")
    return out


def other_table(rows):
    out = ["| row | threads | qcal | reference | speed-up (median of pairs, spread) | other | "
           "target | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        other = []
        if num(r.get("qcal_rss_mib")) is not None and num(r.get("torch_rss_mib")) is not None:
            other.append(f"peak RSS {r['qcal_rss_mib']:.0f} / {r['torch_rss_mib']:.0f} MiB "
                         f"({r['rss_ratio']:.0f}x less)")
        elif num(r.get("qcal_rss_mib")) is not None and num(r.get("model_mib")) is not None:
            other.append(f"peak RSS {r['qcal_rss_mib']:.0f} MiB "
                         f"({r['qcal_rss_mib'] / r['model_mib']:.2f}x the model)")
        if r.get("detail"):
            other.append(str(r["detail"]))
        q = fmt_t(r["qcal_s"])
        if r["qcal_s"] is None and r.get("value") is not None:
            q = f"{r['value']:g} {r.get('unit') or ''}".strip()
        out.append(f"| {r['label']} | {r.get('threads', '-')} | {q} | "
                   f"{fmt_t(r['ref_s'])} | {fmt_ratio(r)} | {'; '.join(other) or '-'} | "
                   f"{r['target'] or '-'} | {verdict(r)} |")
    return out


TITLES = {"kernels": "Kernels (bench/qcal_bench)",
          "int8": "int8 evaluation of the demo CNN vs PyTorch's int8 engine (bench/int8_cnn.c)",
          "e2e": "qcal calibrate of a 1 GiB dump vs a PyTorch loop (bench/e2e_calibrate.py)",
          "python": "Python: qcal and qcal.torch vs torch.ao (bench/python_observers.py)",
          "engines": "Two engines, one table: qcal's oneDNN int8 net vs ONNX Runtime's QDQ model of "
                     "the demo CNN (bench/engines.py)",
          "models": "Real models: qcal calibrate of the Silero VAD and MobileNet dumps vs a numpy "
                    "loop, qcal equalize (bench/real_models.py)",
          "modelcalib": "Calibrating by running the model: qcal calibrate MODEL.onnx --data vs the "
                        "plain ONNX Runtime runs (bench/model_calib.py)",
          "onnx": "ONNX: qcal qdq and onnx-expose of a 1 GiB model vs cp (bench/onnx_qdq.py)",
          "mpi": "MPI: 2 ranks vs 1, session reductions (bench/mpi_scale)"}


def main(argv):
    out_path, doc, blas_path, parts = "bench-results.json", None, None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--out", "--doc", "--blas") and i + 1 < len(argv):
            if a == "--out":
                out_path = argv[i + 1]
            elif a == "--doc":
                doc = argv[i + 1]
            else:
                blas_path = argv[i + 1]
            i += 2
            continue
        if "=" not in a:
            print(f"summary.py: expected SECTION=FILE, got '{a}'", file=sys.stderr)
            return 2
        parts.append(a.split("=", 1))
        i += 1
    rows, md = [], []
    blas = None
    if blas_path:
        try:
            with open(blas_path) as f:
                blas = json.load(f)
        except (OSError, ValueError) as e:
            print(f"summary.py: cannot read {blas_path}: {e}", file=sys.stderr)
    if blas:
        md += ["", f"Reference processes (PyTorch, numpy): {blas.get('summary', '?')}"]
    for section, path in parts:
        try:
            with open(path) as f:
                txt = f.read()
            data = json.loads(txt) if txt.lstrip().startswith("[") else \
                [json.loads(x) for x in txt.splitlines() if x.strip()]
        except (OSError, ValueError) as e:
            print(f"summary.py: {section}: cannot read {path}: {e}", file=sys.stderr)
            return 2
        sec = [norm(section, r) for r in data]
        if not sec:   # a section that skipped (its one line said why)
            continue
        if blas:
            for r in sec:
                r["reference_blas"] = blas
        rows += sec
        md += ["", f"### {TITLES.get(section, section)}", ""]
        md += kernel_table(sec) if section == "kernels" else other_table(sec)
    evaluated = [r for r in rows if r["pass"] is not None]
    failed = [r for r in evaluated if not r["pass"]]
    head = (f"bench/run: {len(evaluated) - len(failed)} of {len(evaluated)} rows with a target "
            f"pass ({len(rows)} rows in all)")
    print("\n".join(md[1:]))
    print()
    print(head)
    for r in failed:
        b = bound_text(r)
        print(f"  FAIL: {r['label']} ({r.get('threads', '-')} threads): {fmt_ratio(r)}, "
              f"target {r['target']}" + ("" if b == "-" else f"; {b}"))
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, out_path)
    if doc:
        stamp = (f"Run of {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on "
                 f"{platform.node() or 'this machine'} ({os.cpu_count()} CPUs, load average "
                 f"{os.getloadavg()[0]:.2f} at the end). {head}.")
        block = [BEGIN, "", stamp] + md + ["", END]
        try:
            with open(doc) as f:
                text = f.read()
        except OSError:
            text = ""
        if BEGIN in text and END in text:
            pre, rest = text.split(BEGIN, 1)
            post = rest.split(END, 1)[1]
            text = pre + "\n".join(block) + post
        else:
            text = "\n".join(block) + "\n"
        with open(doc + ".tmp", "w") as f:
            f.write(text)
        os.replace(doc + ".tmp", doc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
