#!/usr/bin/python3
"""browser.report: `qcal report` rendered in headless Chromium (Debian's chromium).

Builds a small dump (normal, ReLU, lognormal activations, a weight, a hostile name, and
small tensors of 432 and 4096 values), writes the report with `qcal report`, then checks in
a real browser that the DOM holds the charts (one histogram per tensor, objective curves,
channel ranges, the sortable table), that sorting works, that nothing is fetched, and that
a screenshot is not blank (enough non-white pixels and distinct colours). The drawing says
what it claims (docs/evaluate.md): every objective curve has one point per candidate with
a value (data-defined) and one gap per undefined run, entropy and mse (quint8 affine: the
two-ended searches' slice through the chosen window) 1921 high ends each (mse of the
symmetric weight: 1920 bin centres), every curve has its chosen marker; at 1400x900 the summary table of 8
observers fits (no sideways scroll of the table or the page); every recommendation shows
its margin, equal to the difference of the two SQNRs, printed with digits that tell them
apart. The page of `qcal report COMPARE.json` (the JSON of `qcal compare`) renders without a
script error, its op table sorts on a click, and its bars' drawn widths are proportional to
their dB on the chart's axis. Exit 77 (skipped) without chromium.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

QCAL = os.environ.get("QCAL_BIN")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Headless as root, nothing fetched or updated, a fresh profile each run (chromium() adds
# --user-data-dir).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# Measures the page as laid out (injected into a copy of the report, never into the report):
# the page's and the summary table's widths, and per objective path its vertices as the
# browser parsed them (SVGPathElement segments are not exposed; getTotalLength > 0 says the
# path draws).
MEASURE = """<script>
window.addEventListener('load', function () {
  var t = document.querySelector('table.sortable'), w = t.closest('.wrap');
  var out = {page: document.documentElement.scrollWidth, viewport: window.innerWidth,
             table: t.getBoundingClientRect().width, table_right: t.getBoundingClientRect().right,
             wrap_client: w.clientWidth, wrap_scroll: w.scrollWidth, paths: []};
  document.querySelectorAll('path.obj').forEach(function (p) {
    var r = p.getBoundingClientRect();
    out.paths.push({kind: p.dataset.kind, len: p.getTotalLength(), w: r.width, h: r.height,
                    defined: +p.dataset.defined, d: p.getAttribute('d')});
  });
  var pre = document.createElement('pre');
  pre.id = 'qcal-measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


# For the compare page: script errors caught from the start (injected first in <head>), then
# after load a click on the op table's "all but" header and the bars as laid out.
COMPARE_ERRORS = """<script>window.qcalErrors = [];
window.addEventListener('error', function (e) { window.qcalErrors.push(String(e.message)); });
</script>"""
COMPARE_MEASURE = """<script>
window.addEventListener('load', function () {
  var t = document.getElementById('ops');
  t.tHead.rows[0].cells[4].click();
  var svg = document.querySelector('svg.bars'), bars = [];
  svg.querySelectorAll('rect').forEach(function (r) {
    bars.push({cls: r.getAttribute('class'), db: r.dataset.db, w: r.getBBox().width});
  });
  var pre = document.createElement('pre');
  pre.id = 'qcal-measure';
  pre.textContent = JSON.stringify({errors: window.qcalErrors, bars: bars,
    x0: +svg.dataset.x0, x1: +svg.dataset.x1, pw: +svg.dataset.plotWidth,
    order: Array.from(t.tBodies[0].rows).map(function (r) { return r.cells[1].textContent; })});
  document.body.appendChild(pre);
});
</script>"""

COMPARE_JSON = {
    "float": "f.onnx", "quantized": "q.onnx", "engine": "1.30.0", "samples": 8, "metric": None,
    "sqnr_db": 30.5, "sensitivity_samples": 8, "gated_sqnr_db": 29.0, "runs": 17, "seconds": 1.0,
    "outputs": [{"name": "logits", "samples": 8, "positions": 8, "nonfinite": 0, "sqnr_db": 30.5,
                 "cosine": 0.9995, "top1_agreement": 1, "exact_agreement": 1,
                 "accuracy_float": None, "accuracy_quantized": None}],
    "ops": [{"name": "/a/Mul", "op_type": "Mul", "sqnr_alone_db": 11.0, "sqnr_all_but_db": 41.5},
            {"name": "/b/Conv", "op_type": "Conv", "sqnr_alone_db": 33.25, "sqnr_all_but_db": 30.0},
            {"name": "/c/Gemm", "op_type": "Gemm", "sqnr_alone_db": "inf", "sqnr_all_but_db": None}]}


def check_compare_page(d):
    """qcal report on a compare JSON, in the browser: no script error, the op table sorted by
    the clicked column (null first), bar widths (dB - x0) / (x1 - x0) of the plot."""
    src, html = os.path.join(d, "cmp.json"), os.path.join(d, "cmp.html")
    with open(src, "w") as f:
        json.dump(COMPARE_JSON, f)
    r = subprocess.run([QCAL, "report", src, "-o", html], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = open(html, encoding="utf-8").read()
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    page = os.path.join(d, "cmp_measure.html")
    with open(page, "w", encoding="utf-8") as f:
        f.write(text.replace("<head>", "<head>" + COMPARE_ERRORS, 1)
                .replace("</body>", COMPARE_MEASURE + "</body>"))
    dom = chromium("--dump-dom", "--window-size=1400,900", "--virtual-time-budget=2000",
                   "file://" + page).stdout
    mm = re.search(r'<pre id="qcal-measure">(.*?)</pre>', dom, re.S)
    assert mm, "the measuring script did not run"
    m = json.loads(mm.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert m["errors"] == [], m["errors"]
    assert m["order"] == ["/c/Gemm", "/b/Conv", "/a/Mul"], m["order"]
    assert (m["x0"], m["x1"]) == (0, 50), (m["x0"], m["x1"])
    want = [("alone", 11.0), ("allbut", 41.5), ("alone", 33.25), ("allbut", 30.0),
            ("alone", float("inf"))]
    assert [(b["cls"], float(b["db"])) for b in m["bars"]] == want, m["bars"]
    for b in m["bars"]:
        db = min(float(b["db"]), m["x1"])
        assert abs(b["w"] - (db - m["x0"]) / (m["x1"] - m["x0"]) * m["pw"]) < 0.06, b
    return m


def chromium(*args, timeout=120):
    """Runs chromium with FLAGS and a fresh profile; returns the CompletedProcess."""
    with tempfile.TemporaryDirectory() as prof:
        return subprocess.run([CHROMIUM, *FLAGS, "--user-data-dir=" + prof, *args],
                              capture_output=True, text=True, timeout=timeout)


def path_points(d):
    """(vertices, subpaths) of a path as the report writes it: M x y starts a subpath (one
    vertex), each l pair, h or v number is one vertex, z closes (a lone point's dot)."""
    verts = subs = 0
    for cmd, args in re.findall(r"([MLlHhVvZz])([^MLlHhVvZz]*)", d):
        nums = re.findall(r"-?(?:\d+\.?\d*|\.\d+)", args)
        if cmd == "M":
            assert len(nums) % 2 == 0, d[:80]
            subs += 1
            verts += len(nums) // 2
        elif cmd in "Ll":
            assert len(nums) % 2 == 0, d[:80]
            verts += len(nums) // 2
        elif cmd in "HhVv":
            verts += len(nums)
    return verts, subs


def check_objectives(dom):
    """Every objective path: one vertex per candidate with a value, at most one subpath per
    run between undefined candidates, a chosen marker of its kind in the same chart.
    Returns {kind: [(candidates, defined), ...]}."""
    seen = {}
    for svg in re.findall(r"<svg[^>]*>.*?</svg>", dom, re.S):
        for attrs, d in re.findall(r'<path class="obj"([^>]*) d="([^"]*)"', svg):
            a = dict(re.findall(r'(data-[a-z]+)="([^"]*)"', attrs))
            kind, n, defined = a["data-kind"], int(a["data-candidates"]), int(a["data-defined"])
            verts, subs = path_points(d)
            assert verts == defined, (kind, verts, defined)
            assert 1 <= defined <= n, (kind, defined, n)
            assert subs <= n - defined + 1, (kind, subs, n, defined)
            assert int(a["data-chosen"]) >= 0, (kind, a)
            assert re.search(r'class="chosen" data-kind="%s"' % kind, svg), kind + ": no marker"
            seen.setdefault(kind, []).append((n, defined))
    return seen


def check_margins(dom):
    """Each summary row: the recommendation's margin over the runner-up equals the
    difference of their SQNRs, and their printed SQNRs differ unless they tie."""
    body = dom.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    assert rows
    shown = []
    for row in rows:
        m = re.search(r'<small class="margin" data-margin="([^"]+)" data-other="([^"]+)">'
                      r'([^<]*)</small>', row)
        assert m, "no margin: " + row[:200]
        margin, other, text = float(m.group(1)), m.group(2), m.group(3)
        cells = {k: (float(v), t) for v, k, t in re.findall(
            r'<td data-v="([^"]+)" data-kind="([^"]+)"[^>]*>([^<]*)', row)}
        best = re.search(r'<td data-v="([^"]+)" data-kind="([^"]+)" class="best">([^<]*)', row)
        assert best and other in cells, row[:300]
        rec_v, rec_t = float(best.group(1)), best.group(3)
        oth_v, oth_t = cells[other]
        assert margin == rec_v - oth_v, (margin, rec_v, oth_v)
        assert margin == 0 or rec_t != oth_t, (rec_t, oth_t)   # enough digits
        assert ("dB" in text or "tie" in text), text
        shown.append((best.group(2), rec_t, other, oth_t, text))
    return shown


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA PNG (zlib only)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def main():
    if not CHROMIUM:
        print("skipped: chromium is not installed")
        return 77
    if not QCAL:
        print("skipped: QCAL_BIN is not set")
        return 77
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        dump = os.path.join(d, "dump")
        os.makedirs(dump)
        tensors = {
            "conv1.input": lambda: rng.standard_normal((8, 1, 28, 28)),
            "conv2.input": lambda: np.maximum(rng.standard_normal((8, 32, 14, 14)) * 1.5, 0),
            "fc1.input": lambda: np.exp(rng.standard_normal((8, 3136)) * 0.7),
            "a <b>&\"name\"": lambda: rng.standard_normal(500) * 3,
            # small: 4096 values over the batches (the KL is undefined at many thresholds)
            "small.input": lambda: np.maximum(rng.standard_normal((2, 1, 16, 32)), 0),
        }
        for name, gen in tensors.items():
            sub = os.path.join(dump, name.replace("%", "%25").replace("/", "%2F"))
            os.makedirs(sub)
            for b in range(2 if name == "small.input" else 3):
                np.save(os.path.join(sub, f"{b}.npy"), gen().astype(np.float32))
        np.save(os.path.join(dump, "fc1.weight.npy"),
                (rng.standard_normal((128, 3136)) * 0.02).astype(np.float32))
        # small: 432 values, every one of the 8 weight observers
        np.save(os.path.join(dump, "small.weight.npy"),
                (rng.standard_normal((16, 3, 3, 3)) * 0.2).astype(np.float32))
        weights = 2
        html = os.path.join(d, "report.html")
        r = subprocess.run([QCAL, "report", dump, "-o", html], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        text = open(html, encoding="utf-8").read()
        assert "<script src" not in text and "<link" not in text and "@import" not in text
        assert "a &lt;b&gt;&amp;&quot;name&quot;" in text, "name not escaped"
        # The DOM after JavaScript ran, with a click on a column header (sorting).
        dom = chromium("--dump-dom", "--virtual-time-budget=2000", "file://" + html).stdout
        # one histogram per tensor, the weights' channel ranges; one objective chart per
        # searching observer (histogram, entropy, mse) of each tensor
        nt = len(tensors) + weights
        assert dom.count("<article") == nt, dom.count("<article")
        assert dom.count("<svg") == nt + 3 * nt + weights, dom.count("<svg")
        assert 'class="sortable"' in dom
        curves = check_objectives(dom)
        assert sorted(curves) == ["entropy", "histogram", "mse"], sorted(curves)
        for kind, runs in curves.items():
            assert len(runs) == nt, (kind, len(runs))
            for n, defined in runs:
                if kind == "entropy":   # thresholds i * width, i in [128, 2048]
                    assert n == 2048 - 128 + 1, n
                elif kind == "mse":     # affine: high edges i * width, i in [128, 2048], low
                    # end fixed; symmetric (the weight): bin centres from bin 128 up
                    assert ((n == 2048 - 128 + 1 and 1 <= defined <= n) or
                            (n == 2048 - 128 and defined == n)), (n, defined)
                else:                   # the greedy L2 path: no undefined point
                    assert 1 <= n <= 2049 and defined == n, (n, defined)
        # the small tensors' KL has gaps and is still drawn
        assert any(d < n for n, d in curves["entropy"]), curves["entropy"]
        shown = check_margins(dom)
        # Laid out at 1400x900: the table of 8 observers fits, nothing scrolls sideways,
        # and every objective path draws.
        page = os.path.join(d, "measure.html")
        with open(page, "w", encoding="utf-8") as f:
            f.write(text.replace("</body>", MEASURE + "</body>"))
        mdom = chromium("--dump-dom", "--window-size=1400,900", "--virtual-time-budget=2000",
                        "file://" + page).stdout
        mm = re.search(r'<pre id="qcal-measure">(.*?)</pre>', mdom, re.S)
        assert mm, "the measuring script did not run"
        meas = json.loads(mm.group(1).replace("&quot;", '"').replace("&amp;", "&"))
        assert meas["viewport"] == 1400, meas["viewport"]
        assert len(re.findall(r"<th[ >]", dom)) == 3 + 8, "expected 8 observer columns"
        assert meas["table"] <= 1400 and meas["table_right"] <= 1400, meas
        assert meas["page"] <= 1400, meas
        assert meas["wrap_scroll"] <= meas["wrap_client"], meas
        assert len(meas["paths"]) == 3 * nt
        # Every curve is drawn: a line where two neighbouring candidates have a value; an
        # entropy curve of an affine target may have a single admissible window (its search
        # moves each end in only while the squared error falls; the narrower windows are
        # undefined), drawn as a dot ("M x y z"), which has no length or box to measure.
        for p in meas["paths"]:
            drawn = p["len"] > 0 or p["w"] + p["h"] > 0
            dots = p["kind"] == "entropy" and p["defined"] >= 1 and p["d"].count("M") >= 1 \
                and p["d"].count("z") == p["d"].count("M")
            assert drawn or dots, p
        assert all(p["len"] > 0 for p in meas["paths"] if p["kind"] != "entropy"), meas["paths"]
        png = os.path.join(d, "shot.png")
        chromium("--hide-scrollbars", "--window-size=1400,900", "--screenshot=" + png,
                 "file://" + html)
        w, h, bpp, rows = png_pixels(png)
        colours, inked = set(), 0
        for y in range(0, h, 2):
            row = rows[y]
            for x in range(0, w * bpp, bpp * 2):
                px = row[x:x + 3]
                colours.add(px)
                if px != b"\xff\xff\xff":
                    inked += 1
        frac = inked / ((h // 2) * (w // 2))
        print(json.dumps({"screenshot": [w, h], "colours": len(colours),
                          "non_white_fraction": round(frac, 4), "svg": dom.count("<svg"),
                          "table_width": meas["table"], "page_width": meas["page"],
                          "curves": {k: v[:2] for k, v in curves.items()},
                          "margins": shown}))
        assert (w, h) == (1400, 900), (w, h)
        assert frac > 0.05, f"screenshot nearly blank ({frac:.3f} non-white)"
        assert len(colours) > 50, f"only {len(colours)} colours"
        print(json.dumps({"compare_page": check_compare_page(d)}))
        keep = os.environ.get("QCAL_REPORT_SCREENSHOT")
        if keep:
            shutil.copy(png, keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
