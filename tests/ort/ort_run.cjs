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
    console.log(`ort: skipped: onnxruntime-node not found in ${dir}/node_modules ` +
                `(./run.sh test installs it from npm; ${e.code || e.message})`);
    process.exit(77);
  }
}

// .npy v1/v2/v3 little-endian float32 / uint8 / int64, C order.
function readNpy(file) {
  const b = fs.readFileSync(file);
  if (b.toString('latin1', 0, 6) !== '\x93NUMPY') throw new Error(`${file}: not a .npy file`);
  const major = b[6];
  const hlen = major === 1 ? b.readUInt16LE(8) : b.readUInt32LE(8);
  const off = (major === 1 ? 10 : 12) + hlen;
  const h = b.toString('latin1', major === 1 ? 10 : 12, off);
  const descr = /'descr':\s*'([^']+)'/.exec(h)[1];
  if (/'fortran_order':\s*True/.test(h)) throw new Error(`${file}: Fortran order`);
  const shape = /'shape':\s*\(([^)]*)\)/.exec(h)[1].split(',').filter(s => s.trim()).map(Number);
  if (descr !== '<f4') throw new Error(`${file}: dtype ${descr}, want <f4`);
  const n = shape.reduce((a, d) => a * d, 1);
  const data = new Float32Array(n);
  Buffer.from(data.buffer).set(b.subarray(off, off + 4 * n));
  return { shape, data };
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
  const ort = loadOrt();
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
