// Runs ONNX models on ONNX Runtime (onnxruntime-node, CPU, graph optimization level
// 'disabled') for tests/ort/test_upgrade.py, all in one process:
//
//   node ort_pairs.cjs JOBS.json
//
// JOBS.json: [{"model": M, "input": X.npy, "out": PREFIX}, ...]; every output k of a run is
// written as its raw little-endian bytes to PREFIX.k.bin (dims and type in PREFIX.json).
// Without onnxruntime-node: one line and exit 77.
'use strict';
const fs = require('fs');
const { loadOrt, readNpy } = require('./ort_common.cjs');

async function main() {
  const jobs = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
  const ort = loadOrt('ort.upgrade');
  for (const j of jobs) {
    const sess = await ort.InferenceSession.create(j.model,
      { graphOptimizationLevel: 'disabled', executionMode: 'sequential', intraOpNumThreads: 1 });
    const x = readNpy(j.input);
    const r = await sess.run({ [sess.inputNames[0]]: new ort.Tensor('float32', x.data, x.shape) });
    const meta = [];
    sess.outputNames.forEach((name, k) => {
      const t = r[name];
      const d = t.data;
      fs.writeFileSync(`${j.out}.${k}.bin`, Buffer.from(d.buffer, d.byteOffset, d.byteLength));
      meta.push({ name, type: t.type, dims: t.dims });
    });
    fs.writeFileSync(`${j.out}.json`, JSON.stringify(meta));
  }
}

main().catch(e => { console.error(`ort_pairs: ${e.message || e}`); process.exit(1); });
