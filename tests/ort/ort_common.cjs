// What the ONNX Runtime runners (tests/ort/ort_run.cjs, tests/vad/vad_run.cjs) share:
// where onnxruntime-node is installed, loading it (or skipping), and .npy files.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

function npmDir() {
  if (process.env.QCAL_NPM_DIR) return process.env.QCAL_NPM_DIR;
  const cache = process.env.XDG_CACHE_HOME || path.join(process.env.HOME || '/root', '.cache');
  return path.join(cache, 'qcal', 'npm');
}

// onnxruntime-node from npmDir(); without it one line "<tag>: skipped: ..." and exit 77.
function loadOrt(tag) {
  const dir = npmDir();
  try {
    return createRequire(path.join(dir, 'node_modules', 'noop.js'))('onnxruntime-node');
  } catch (e) {
    console.log(`${tag}: skipped: onnxruntime-node not found in ${dir}/node_modules ` +
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
module.exports = { npmDir, loadOrt, readNpy, writeNpy, percent };
