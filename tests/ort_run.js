// Runs one ONNX model on ONNX Runtime (onnxruntime-node, CPU provider, one thread) with
// float32 .npy inputs and writes every float32 output as .npy, bytes as ORT returned them:
//   node ort_run.js NPM_DIR MODEL.onnx OUT_PREFIX [--level=L] [--optimized=PATH] name=file.npy ...
// -> OUT_PREFIX<output name>.npy. --level: graphOptimizationLevel (disabled, the default, basic,
// extended, all); --optimized: ORT saves the graph it optimized there. Exit 77 (skip) when
// onnxruntime-node is not installed.
'use strict';
const fs = require('fs');
const path = require('path');
const { createRequire } = require('module');

function readNpyF32(file) {
  const b = fs.readFileSync(file);
  const hlen = b.readUInt16LE(8);
  const header = b.toString('latin1', 10, 10 + hlen);
  if (!header.includes("'<f4'")) throw new Error(file + ': not float32');
  const m = /'shape': \(([^)]*)\)/.exec(header);
  const dims = m[1].split(',').map((s) => s.trim()).filter((s) => s.length).map(Number);
  const off = 10 + hlen;
  const data = new Float32Array(b.buffer.slice(b.byteOffset + off, b.byteOffset + b.length));
  return { dims, data };
}

function writeNpyF32(file, dims, data) {
  const shape = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let h = `{'descr': '<f4', 'fortran_order': False, 'shape': ${shape}, }`;
  while ((10 + h.length + 1) % 64) h += ' ';
  h += '\n';
  const pre = Buffer.alloc(10);
  pre.write('\x93NUMPY', 0, 'latin1');
  pre[6] = 1;
  pre[7] = 0;
  pre.writeUInt16LE(h.length, 8);
  const body = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  fs.writeFileSync(file, Buffer.concat([pre, Buffer.from(h, 'latin1'), body]));
}

async function main() {
  const [npmDir, model, prefix, ...feedArgs] = process.argv.slice(2);
  let ort;
  try {
    ort = createRequire(path.join(path.resolve(npmDir), 'package.json'))('onnxruntime-node');
  } catch (e) {
    console.log('skip: onnxruntime-node not found under ' + npmDir);
    process.exit(77);
  }
  const so = {
    executionProviders: ['cpu'], intraOpNumThreads: 1, interOpNumThreads: 1,
    graphOptimizationLevel: 'disabled',
  };
  const rest = [];
  for (const a of feedArgs) {
    if (a.startsWith('--level=')) so.graphOptimizationLevel = a.slice(8);
    else if (a.startsWith('--optimized=')) so.optimizedModelFilePath = a.slice(12);
    else rest.push(a);
  }
  const sess = await ort.InferenceSession.create(model, so);
  const feeds = {};
  for (const a of rest) {
    const k = a.indexOf('=');
    const arr = readNpyF32(a.slice(k + 1));
    feeds[a.slice(0, k)] = new ort.Tensor('float32', arr.data, arr.dims);
  }
  const out = await sess.run(feeds);
  for (const name of sess.outputNames)
    writeNpyF32(prefix + name + '.npy', out[name].dims, out[name].data);
}

main().catch((e) => { console.error(String(e && e.stack || e)); process.exit(1); });
