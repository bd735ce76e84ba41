"""qcal.torch loggers (suite python): log_parameter_info, add_activation_loggers on the
Llama-shaped model and a conv net: statistics in the CSV columns of `qcal stats`, a dump
directory `qcal calibrate` reads, a qcal.Session fed directly, removal, rank shards joined
by `qcal merge`."""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np

try:
    import torch
except ImportError:
    print("skipped: PyTorch (python3-torch) is not installed")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinyllama as T  # noqa: E402

import qcal  # noqa: E402
import qcal.torch as qt  # noqa: E402

BIN = os.environ.get("QCAL_BIN")
DATA = os.environ.get("QCAL_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
MODEL = os.path.join(DATA, "llama", "tinyllama.safetensors")
HEADER = ["t", "c", "fqn", "op", "extra", "shape", "count", "nonfinite", "min", "max",
          "absmax", "mean", "std"]


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.fc(x.mean((2, 3)))


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def entries(table):
    return {(e["fqn"], e["role"]): e for e in table["entries"]}


def _dist_worker(rank, world, init_file, dump, batches):
    """One torch.distributed rank (gloo): logs its half of the batches."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=world)
    torch.manual_seed(0)
    net = ConvNet().eval()
    h = qt.add_activation_loggers(net, dump_dir=dump)
    with torch.no_grad():
        for b in batches[rank::world]:
            net(b)
    h.remove()
    dist.barrier()
    dist.destroy_process_group()


class Loggers(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.net = ConvNet().eval()
        self.batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]

    def tearDown(self):
        self.tmp.cleanup()

    def inputs_of(self, model, batches, name):
        got = []
        h = model.get_submodule(name).register_forward_pre_hook(
            lambda m, a: got.append(a[0].detach().clone()))
        with torch.no_grad():
            for b in batches:
                model(b)
        h.remove()
        return got

    def test_parameter_info(self):
        path = os.path.join(self.dir, "params.csv")
        rows = qt.log_parameter_info(self.net, csv=path)
        table = read_csv(path)
        self.assertEqual(table[0], HEADER)
        self.assertEqual(len(table) - 1, len(list(self.net.parameters())))
        by = {r[2]: r for r in table[1:]}
        w = self.net.conv1.weight.detach()
        r = by["conv1.weight"]
        self.assertEqual(r[0], "param")
        self.assertEqual(r[3], "Conv2d")
        self.assertEqual(np.float32(r[8]), w.min().numpy())
        self.assertEqual(np.float32(r[9]), w.max().numpy())
        self.assertEqual(int(r[6]), w.numel())
        self.assertAlmostEqual(float(r[11]), float(w.double().mean()), places=12)
        self.assertAlmostEqual(float(r[12]), float(w.double().std()), places=12)
        self.assertEqual(rows[0]["fqn"], "conv1.weight")

    def test_stats_dump_session_and_removal(self):
        with torch.no_grad():
            before = [self.net(b) for b in self.batches]
        path = os.path.join(self.dir, "act.csv")
        dump = os.path.join(self.dir, "dump")
        session = qcal.Session(observer="minmax")
        with qt.add_activation_loggers(self.net, stats_csv=path, dump_dir=dump,
                                       session=session, outputs=["fc"]) as h:
            with torch.no_grad():
                during = [self.net(b) for b in self.batches]
            self.assertEqual(h.names, ["conv1", "conv2", "fc"])
        for a, b in zip(before, during):
            self.assertTrue(torch.equal(a, b))
        for name, m in self.net.named_modules():
            self.assertFalse(m._forward_pre_hooks or m._forward_hooks, name)
        self.assertEqual(set(vars(self.net)), set(vars(ConvNet())))
        # Statistics: one record per call and tensor, qcal stats' columns.
        table = read_csv(path)
        self.assertEqual(table[0], HEADER)
        self.assertEqual(len(table) - 1, 3 * 4)
        conv2_in = self.inputs_of(self.net, self.batches, "conv2")
        rows = [r for r in table[1:] if r[2] == "conv2.input"]
        self.assertEqual([r[3] for r in rows], ["conv2d"] * 3)
        for r, x in zip(rows, conv2_in):
            self.assertEqual((np.float32(r[8]), np.float32(r[9])), (x.min().numpy(), x.max().numpy()))
            self.assertEqual(r[5], "4x8x8x8")
        fc = [r for r in table[1:] if r[2] == "fc.input"]
        self.assertEqual(fc[0][3:5], ["linear", "MKN=4|8|4"])
        # The dump: `qcal calibrate` reads it; its ranges are the tensors'.
        self.assertEqual(sorted(os.listdir(dump)),
                         ["conv1.input", "conv2.input", "fc.input", "fc.output"])
        self.assertEqual(sorted(os.listdir(os.path.join(dump, "conv2.input"))),
                         ["000000.npy", "000001.npy", "000002.npy"])
        lo = min(float(x.min()) for x in conv2_in)
        hi = max(float(x.max()) for x in conv2_in)
        mine = entries(json.loads(session.table().format("json")))
        self.assertEqual((np.float32(mine[("conv2.input", "activation")]["min"][0]),
                          np.float32(mine[("conv2.input", "activation")]["max"][0])),
                         (np.float32(lo), np.float32(hi)))
        if BIN:
            out = os.path.join(self.dir, "t.json")
            r = subprocess.run([BIN, "calibrate", dump, "-o", out, "--observer", "minmax"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            # The dump and the Session saw the same batches: the same entries.
            cli = entries(read_json(out))
            self.assertEqual(set(cli), set(mine))
            for k in cli:
                for f in ("min", "max", "scale", "zero_point", "elements"):
                    self.assertEqual(cli[k][f], mine[k][f], (k, f))

    def test_custom_module_type_on_llama(self):
        model = T.load_model(MODEL)
        x, _ = T.windows(T.text_bytes(T.CALIB_FILES), T.CONFIG["ctx"])
        path = os.path.join(self.dir, "norm.csv")
        h = qt.add_activation_loggers(model, module_types=[T.RMSNorm, torch.nn.Linear],
                                      names=["model.layers.0.*", "model.norm"], stats_csv=path)
        with torch.no_grad():
            model(x[:2])
        h.remove()
        got = [r[2] for r in read_csv(path)[1:]]
        self.assertEqual(got, [
            "model.layers.0.input_layernorm.input", "model.layers.0.self_attn.q_proj.input",
            "model.layers.0.self_attn.k_proj.input", "model.layers.0.self_attn.v_proj.input",
            "model.layers.0.self_attn.o_proj.input",
            "model.layers.0.post_attention_layernorm.input",
            "model.layers.0.mlp.gate_proj.input", "model.layers.0.mlp.up_proj.input",
            "model.layers.0.mlp.down_proj.input", "model.norm.input"])
        q = [r for r in read_csv(path)[1:] if r[2].endswith("q_proj.input")][0]
        self.assertEqual(q[4], "MKN=%d|64|64" % (2 * T.CONFIG["ctx"]))

    def test_ranks_from_torch_distributed_and_mpi(self):
        dump = os.path.join(self.dir, "dist")
        torch.multiprocessing.spawn(_dist_worker, args=(2, os.path.join(self.dir, "init"), dump,
                                                        self.batches), nprocs=2, join=True)
        self.assertEqual(sorted(os.listdir(dump)), ["rank00000", "rank00001"])
        # rank 0 logged batches 0 and 2, rank 1 batch 1: the conv1 inputs themselves
        for rank, idx in ((0, [0, 2]), (1, [1])):
            d = os.path.join(dump, "rank%05d" % rank, "conv1.input")
            files = sorted(os.listdir(d))
            self.assertEqual(len(files), len(idx))
            for f, i in zip(files, idx):
                self.assertTrue(np.array_equal(np.load(os.path.join(d, f)),
                                               self.batches[i].numpy()))
        # An MPI launcher's environment names the rank and size.
        env = dict(os.environ)
        try:
            os.environ["OMPI_COMM_WORLD_RANK"], os.environ["OMPI_COMM_WORLD_SIZE"] = "1", "3"
            h = qt.add_activation_loggers(self.net, dump_dir=os.path.join(self.dir, "mpi"),
                                          stats_csv=os.path.join(self.dir, "m.csv"))
            with torch.no_grad():
                self.net(self.batches[0])
            h.remove()
        finally:
            os.environ.clear()
            os.environ.update(env)
        self.assertEqual(os.listdir(os.path.join(self.dir, "mpi")), ["rank00001"])
        self.assertEqual(h.csv, os.path.join(self.dir, "m.rank00001.csv"))
        self.assertTrue(os.path.exists(h.csv))

    @unittest.skipIf(BIN is None, "QCAL_BIN not set")
    def test_rank_shards_join_with_merge(self):
        dump = os.path.join(self.dir, "dump")
        for rank in (0, 1):   # two ranks, each its half of the batches
            h = qt.add_activation_loggers(self.net, dump_dir=dump, rank=rank, world_size=2,
                                          stats_csv=os.path.join(self.dir, "s.csv"))
            with torch.no_grad():
                for b in self.batches[rank::2]:
                    self.net(b)
            h.remove()
        self.assertEqual(sorted(os.listdir(dump)), ["rank00000", "rank00001"])
        self.assertTrue(os.path.exists(os.path.join(self.dir, "s.rank00001.csv")))
        states = []
        for rank in (0, 1):
            st = os.path.join(self.dir, "r%d.state" % rank)
            r = subprocess.run([BIN, "calibrate", os.path.join(dump, "rank%05d" % rank), "-o",
                                os.path.join(self.dir, "r%d.json" % rank), "--save-state", st],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            states.append(st)
        merged = os.path.join(self.dir, "merged.json")
        r = subprocess.run([BIN, "merge"] + states + ["-o", merged], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        # One process over all the batches gives the same table.
        one = os.path.join(self.dir, "one")
        h = qt.add_activation_loggers(self.net, dump_dir=one)
        with torch.no_grad():
            for b in self.batches:
                self.net(b)
        h.remove()
        single = os.path.join(self.dir, "single.json")
        r = subprocess.run([BIN, "calibrate", one, "-o", single], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        a, b = entries(read_json(merged)), entries(read_json(single))
        self.assertEqual(set(a), set(b))
        for k in a:
            for f in ("min", "max", "scale", "zero_point", "elements"):
                self.assertEqual(a[k][f], b[k][f], (k, f))


if __name__ == "__main__":
    unittest.main(verbosity=2)
