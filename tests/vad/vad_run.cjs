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
const { createRequire } = require('module');

function npmDir() {
  if (process.env.QCAL_NPM_DIR) return process.env.QCAL_NPM_DIR;
  const cache = process.env.XDG_CACHE_HOME || path.join(process.env.HOME || '/root', '.cache');
  return path.join(cache, 'qcal', 'npm');
}

function loadOrt() {
  const dir = npmDir();
  try {
    return createRequire(path.join(dir, 'node_modules', 'noop.js'))('onnxruntime-node');
  } catch (e) {
    console.log(`vad_run: skipped: onnxruntime-node not found in ${dir}/node_modules (${e.code || e.message})`);
    process.exit(77);
  }
}

function readNpy(file) {
  const b = fs.readFileSync(file);
  if (b.toString('latin1', 0, 6) !== '\x93NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = b[6];
  const hlen = major === 1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const off = (major === 1 ? 10 : 12) + hlen;
  const h = b.toString('latin1', major === 1 ? 10 : 12, off);
  const descr = /'descr':\s*'([^']+)'/.exec(h)[1];
  if (descr !== '<f4') throw new Error(`${file}: dtype ${descr}, want <f4`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(h)[1].split(',').filter(s => s.trim()).map(Number);
  const n = shape.reduce((a, d) => a * d, 1);
  const data = new Float32Array(n);
  Buffer.from(data.buffer).set(b.subarray(off, off + 4 * n));
  return data;
}

function writeNpy(file, shape, data) {
  let h = `{'descr': '<f4', 'fortran_order': False, 'shape': (${shape.join(', ')}${shape.length === 1 ? ',' : ''}), }`;
  h += ' '.repeat(63 - ((10 + h.length) % 64)) + '\n';
  const head = Buffer.alloc(10);
  head.write('\x93NUMPY', 0, 'latin1');
  head[6] = 1;
  head.writeUInt16LE(h.length, 8);
  const tmp = `${file}.tmp${process.pid}`;
  fs.writeFileSync(tmp, Buffer.concat([head, Buffer.from(h, 'latin1'),
    Buffer.from(data.buffer, data.byteOffset, data.byteLength)]));
  fs.renameSync(tmp, file);
}

const percent = s => Array.from(Buffer.from(s, 'utf8'))
  .map(c => /[A-Za-z0-9._-]/.test(String.fromCharCode(c)) ? String.fromCharCode(c)
    : '%' + c.toString(16).toUpperCase().padStart(2, '0')).join('');

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
  const ort = loadOrt();
  const so = { graphOptimizationLevel: opt.level, executionMode: 'sequential', logSeverityLevel: 3,
               intraOpNumThreads: +opt.threads, interOpNumThreads: 1 };
  if (opt.optimized) so.optimizedModelFilePath = opt.optimized;
  if (opt.precision === 'high') so.extra = { session: { x64quantprecision: '1' } };
  const sess = await ort.InferenceSession.create(pos[0], so);
  const audio = readNpy(pos[1]);
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
