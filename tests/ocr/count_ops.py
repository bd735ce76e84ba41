"""Counts the op types of ONNX models (e.g. the graph ONNX Runtime optimized, written by
tests/ocr/ocr_eval.cjs --optimized-out) and prints one JSON object per model:

    count_ops.py MODEL.onnx [MODEL.onnx ...] [--only QLinearConv,QLinearMatMul,...]

Ops outside the default domain are named domain:op (com.microsoft:QLinearAdd); nodes inside
subgraphs (If/Loop/Scan bodies) are counted too. Needs python3-onnx (exit 77 without it)."""
import argparse
import collections
import json
import sys

try:
    import onnx
except ImportError:
    print("count_ops: skipped: no python3-onnx")
    sys.exit(77)


def count(graph, c):
    for n in graph.node:
        c[n.op_type if n.domain in ("", "ai.onnx") else "%s:%s" % (n.domain, n.op_type)] += 1
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                count(a.g, c)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    count(g, c)
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--only", help="comma-separated op types to report (0 when absent)")
    a = ap.parse_args()
    for path in a.models:
        m = onnx.load(path, load_external_data=False)
        c = count(m.graph, collections.Counter())
        ops = dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))
        if a.only:
            ops = {k: c.get(k, 0) for k in a.only.split(",")}
        print(json.dumps({"model": path, "nodes": sum(c.values()), "ops": ops}))


if __name__ == "__main__":
    main()
