// Runs Silero VAD (or its exposed / QDQ version) on ONNX Runtime frame by frame, as the npm
// package's lib.js does: input [1, 576] = the last 64 samples of the previous window (zeros
// before the first) and 512 new samples at 16 kHz, sr = 16000 (int64), the recurrent state
// [2, 1, 128] (zeros at the start) fed back from output `stateN`.
//
//   node vad_run.cjs MODEL.onnx AUDIO.npy [--out PROBS.npy] [--dump DIR] [--batch N]
//        [--threads N] [--precision default|high] [--level all|...] [--optimized PATH]
//
// AUDIO.npy: float32 samples (1-D), one stream (the state is carried through all of it).
// --out: the speech probability of every 512-sample frame ([frames] float32).
// --dump: every other float32 output, N frames per file stacked along axis 0, as
// DIR/<percent-encoded name>/b<k>.npy (the layout `qcal calibrate DIR` reads); outputs with
// no elements (an If branch not taken: qcal onnx-expose) are not written.
// --precision high: session.x64quantprecision=1 (ONNX Runtime's U8U8 kernels; its U8S8
// kernels sum pairs of u8 x s8 products in saturating 16 bits on x86 without VNNI).
// onnxruntime-node from $QCAL_NPM_DIR/node_modules; without it one line and exit 77.
'use strict';
const fs = require('fs');
const path = require('path');
const { loadOrt, readNpy, writeNpy, percent } = require('../ort/ort_common.cjs');

async function main() {
  const argv = process.argv.slice(2);
  const opt = { batch: 250, threads: 1, level: 'all' };
  const pos = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i].startsWith('--')) opt[argv[i].slice(2)] = argv[++i];
    else pos.push(argv[i]);
  }
  if (pos.length !== 2 || !(opt.out || opt.dump)) {
    console.error('usage: node vad_run.cjs MODEL.onnx AUDIO.npy [--out PROBS.npy] [--dump DIR] [--batch N] ' +
                  '[--threads N] [--precision default|high] [--level all|basic|extended|disabled] [--optimized PATH]');
    process.exit(2);
  }
  const ort = loadOrt('vad_run');
  const so = { graphOptimizationLevel: opt.level, executionMode: 'sequential', logSeverityLevel: 3,
               intraOpNumThreads: +opt.threads, interOpNumThreads: 1 };
  if (opt.optimized) so.optimizedModelFilePath = opt.optimized;
  if (opt.precision === 'high') so.extra = { session: { x64quantprecision: '1' } };
  const sess = await ort.InferenceSession.create(pos[0], so);
  const audio = readNpy(pos[1]).data;
  const W = 512, C = 64, frames = Math.floor(audio.length / W), bs = +opt.batch;
  const x = new Float32Array(C + W);
  let state = new Float32Array(2 * 128);
  const sr = new ort.Tensor('int64', BigInt64Array.from([16000n]), []);
  const probs = new Float32Array(frames);
  const acc = new Map();   // name -> { dims, parts: [Float32Array] }
  let part = 0;
  if (opt.dump) fs.mkdirSync(opt.dump, { recursive: true });
  const flush = () => {
    for (const [name, a] of acc) {
      if (!a.parts.length) continue;
      const per = a.parts[0].length, all = new Float32Array(per * a.parts.length);
      a.parts.forEach((p, i) => all.set(p, i * per));
      const d = path.join(opt.dump, percent(name));
      fs.mkdirSync(d, { recursive: true });
      writeNpy(path.join(d, `b${String(part).padStart(5, '0')}.npy`), [a.dims[0] * a.parts.length, ...a.dims.slice(1)], all);
      a.parts = [];
    }
    part++;
  };
  for (let f = 0; f < frames; f++) {
    x.copyWithin(0, W, W + C);   // the last 64 samples of the previous window
    if (f === 0) x.fill(0, 0, C);
    x.set(audio.subarray(f * W, (f + 1) * W), C);
    const r = await sess.run({
      input: new ort.Tensor('float32', x, [1, C + W]),
      state: new ort.Tensor('float32', state, [2, 1, 128]),
      sr,
    });
    probs[f] = r.output.data[0];
    state = Float32Array.from(r.stateN.data);
    if (opt.dump) {
      for (const name of sess.outputNames) {
        if (name === 'output' || name === 'stateN') continue;
        const t = r[name];
        if (t.type !== 'float32' || t.data.length === 0) continue;
        if (!acc.has(name)) acc.set(name, { dims: t.dims.length ? t.dims : [1], parts: [] });
        acc.get(name).parts.push(Float32Array.from(t.data));
      }
      if ((f + 1) % bs === 0 || f === frames - 1) flush();
    }
  }
  if (opt.out) writeNpy(opt.out, [frames], probs);
}

main().catch(e => { console.error(`vad_run: ${e.message || e}`); process.exit(1); });
