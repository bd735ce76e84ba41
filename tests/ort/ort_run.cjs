// Runs an ONNX model on ONNX Runtime (onnxruntime-node, CPU) over a float32 .npy batch and
// writes what qcal reads: the outputs stacked as .npy, and/or a qcal dump directory.
//
//   node ort_run.cjs MODEL.onnx INPUT.npy [--out OUT.npy] [--dump DIR] [--batch N]
//        [--threads N] [--optimized PATH] [--level all|basic|extended|disabled]
//        [--precision default|high]
//
// --out: the first output of every batch stacked ([N, ...] float32); --dump: every output,
// DIR/<percent-encoded name>/b<batch>.npy (the layout `qcal calibrate DIR` reads);
// --optimized: the graph as ONNX Runtime optimized it (graphOptimizationLevel, default
// 'all'). onnxruntime-node is resolved from $QCAL_NPM_DIR/node_modules (default
// ${XDG_CACHE_HOME:-~/.cache}/qcal/npm, where ./run.sh installs it); without it the script
// prints one line and exits 77 (meson's "skipped").
'use strict';
const fs = require('fs');
const path = require('path');
const { loadOrt, readNpy, writeNpy, percent } = require('./ort_common.cjs');

async function main() {
  const argv = process.argv.slice(2);
  const opt = { batch: 500, threads: 0, level: 'all' };
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a.startsWith('--')) opt[a.slice(2)] = argv[++i];
    else pos.push(a);
  }
  if (pos.length !== 2 || !(opt.out || opt.dump || opt.optimized)) {
    console.error('usage: node ort_run.cjs MODEL.onnx INPUT.npy [--out OUT.npy] [--dump DIR] ' +
                  '[--batch N] [--threads N] [--optimized PATH] [--level all|basic|extended|disabled]');
    process.exit(2);
  }
  const ort = loadOrt('ort');
  const so = { graphOptimizationLevel: opt.level, executionMode: 'sequential' };
  if (+opt.threads > 0) so.intraOpNumThreads = +opt.threads;
  if (opt.optimized) so.optimizedModelFilePath = opt.optimized;
  // --precision high: session.x64quantprecision=1, ONNX Runtime's U8U8 kernels on x86 without
  // VNNI (its U8S8 kernels sum pairs of u8 x s8 products in saturating 16 bits there)
  if (opt.precision === 'high') so.extra = { session: { x64quantprecision: '1' } };
  const sess = await ort.InferenceSession.create(pos[0], so);
  if (!opt.out && !opt.dump) return;   // --optimized only: the session wrote it
  const x = readNpy(pos[1]);
  const n = x.shape[0], per = x.data.length / n, bs = +opt.batch;
  let first = null;
  if (opt.dump) fs.mkdirSync(opt.dump, { recursive: true });
  for (let i0 = 0, b = 0; i0 < n; i0 += bs, b++) {
    const m = Math.min(bs, n - i0);
    const feed = { [sess.inputNames[0]]: new ort.Tensor('float32',
      x.data.subarray(i0 * per, (i0 + m) * per), [m, ...x.shape.slice(1)]) };
    const r = await sess.run(feed);
    if (opt.out) {
      const t = r[sess.outputNames[0]];
      if (!first) first = { shape: t.dims.slice(1), parts: [] };
      first.parts.push(Float32Array.from(t.data));
    }
    if (opt.dump) {
      for (const name of sess.outputNames) {
        const t = r[name];
        if (t.type !== 'float32') continue;
        const d = path.join(opt.dump, percent(name));
        fs.mkdirSync(d, { recursive: true });
        writeNpy(path.join(d, `b${String(b).padStart(5, '0')}.npy`), t.dims, t.data);
      }
    }
  }
  if (opt.out) {
    const all = new Float32Array(first.parts.reduce((a, p) => a + p.length, 0));
    let o = 0;
    for (const p of first.parts) { all.set(p, o); o += p.length; }
    writeNpy(opt.out, [n, ...first.shape], all);
  }
}

main().catch(e => { console.error(`ort_run: ${e.message || e}`); process.exit(1); });
