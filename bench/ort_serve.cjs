// bench/ort_serve.cjs: ONNX Runtime (onnxruntime-node, CPU) as the other engine of
// bench/int8_cnn.c's "two engines" row. Started once per thread count, it loads a model and a
// float32 .npy of inputs [N, ...], says {"ready": ...} on stdout, then answers one JSON line
// per command read from stdin:
//   logits PATH   runs every input once (batches of --batch) and writes the first output,
//                 stacked [N, ...], to PATH (.npy, what qcal reads): the verification run
//   time R        runs every input R times: {"median_s", "min_s", "max_s", "reps"} per pass
//
//   node bench/ort_serve.cjs MODEL.onnx INPUT.npy [--threads N] [--batch B] [--precision high]
//
// Session: graphOptimizationLevel 'all' (QDQ node units run as QLinearConv / QGemm),
// intraOpNumThreads N (default 1), interOpNumThreads 1, sequential; --precision high sets
// session.x64quantprecision=1 (tests/ort/ort_run.cjs). onnxruntime-node is resolved as the
// tests resolve it (tests/ort/ort_common.cjs: $QCAL_NPM_DIR/node_modules); without it one
// line and exit 77.
'use strict';
const fs = require('fs');
const path = require('path');
const readline = require('readline');
const { npmDir, loadOrt, readNpy, writeNpy } =
  require(path.join(__dirname, '..', 'tests', 'ort', 'ort_common.cjs'));

async function main() {
  const argv = process.argv.slice(2);
  const opt = { threads: '1', batch: '1000' };
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else pos.push(argv[i]);
  }
  if (pos.length !== 2) {
    console.error('usage: node ort_serve.cjs MODEL.onnx INPUT.npy [--threads N] [--batch B] [--precision high]');
    process.exit(2);
  }
  const ort = loadOrt('ort_serve');
  const so = { graphOptimizationLevel: 'all', executionMode: 'sequential',
               intraOpNumThreads: +opt.threads, interOpNumThreads: 1 };
  if (opt.precision === 'high') so.extra = { session: { x64quantprecision: '1' } };
  const sess = await ort.InferenceSession.create(pos[0], so);
  const x = readNpy(pos[1]);
  const n = x.shape[0], per = x.data.length / n, bs = +opt.batch;
  const feeds = [];
  for (let i0 = 0; i0 < n; i0 += bs) {
    const m = Math.min(bs, n - i0);
    feeds.push({ [sess.inputNames[0]]: new ort.Tensor('float32',
      x.data.subarray(i0 * per, (i0 + m) * per), [m, ...x.shape.slice(1)]) });
  }
  const out = sess.outputNames[0];
  async function pass(keep) {
    const parts = [];
    for (const f of feeds) {
      const r = await sess.run(f);
      if (keep) parts.push(r[out]);
    }
    return parts;
  }
  let version = '?';
  try {
    version = JSON.parse(fs.readFileSync(path.join(npmDir(), 'node_modules', 'onnxruntime-node',
                                                   'package.json'), 'utf8')).version;
  } catch (e) { /* the version is for the record only */ }
  console.log(JSON.stringify({ ready: true, version, images: n, batch: bs, threads: +opt.threads,
                               precision: opt.precision || 'default' }));
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [cmd, arg] = line.trim().split(/\s+/);
    if (cmd === 'logits') {
      const parts = await pass(true);
      const dims = parts[0].dims.slice(1);
      const all = new Float32Array(parts.reduce((a, t) => a + t.data.length, 0));
      let o = 0;
      for (const t of parts) { all.set(t.data, o); o += t.data.length; }
      writeNpy(arg, [n, ...dims], all);
      console.log(JSON.stringify({ ok: true }));
    } else if (cmd === 'time') {
      const reps = Math.max(1, +arg || 1), t = [];
      for (let r = 0; r < reps; r++) {
        const t0 = process.hrtime.bigint();
        await pass(false);
        t.push(Number(process.hrtime.bigint() - t0) * 1e-9);
      }
      t.sort((a, b) => a - b);
      console.log(JSON.stringify({ median_s: t[t.length >> 1], min_s: t[0], max_s: t[t.length - 1], reps }));
    } else {
      console.log(JSON.stringify({ error: `unknown command '${cmd}'` }));
    }
  }
}

main().catch(e => { console.error(`ort_serve: ${e.message || e}`); process.exit(1); });
