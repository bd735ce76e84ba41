"""A small Llama-shaped byte-level decoder (PyTorch 1.13) for the FP8 checkpoint tests.

Modules are named as Hugging Face's LlamaForCausalLM names them, so the checkpoint
conventions vLLM loads apply as they are: model.embed_tokens, model.layers.N.input_layernorm,
model.layers.N.self_attn.{q,k,v,o}_proj, model.layers.N.post_attention_layernorm,
model.layers.N.mlp.{gate,up,down}_proj, model.norm, lm_head (bias-free Linear layers,
RMSNorm, rotary position embeddings, SiLU-gated MLP).

Text: the licence texts of Debian's base-files package (/usr/share/common-licenses), present
on every Debian system. Training, calibration and held-out evaluation use different files.

    /usr/bin/python3 tests/python/tinyllama.py train OUT.safetensors   # seeded, 1000 steps

tests/data/llama/tinyllama.safetensors is that output (1000 steps, seed 0: 59 s of CPU,
~10 min wall on the shared 2-core build machine; held-out loss 1.80 nats/byte on MPL-2.0);
tests/data/llama/config.json is its Hugging Face config (LlamaForCausalLM fields).
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

LICENSES = "/usr/share/common-licenses/"
TRAIN_FILES = ["GPL-2", "GPL-3", "Apache-2.0", "GFDL-1.3", "LGPL-2.1", "Artistic"]
CALIB_FILES = ["LGPL-3"]
EVAL_FILES = ["MPL-2.0"]

CONFIG = dict(vocab=256, dim=64, layers=3, heads=4, kv_heads=2, hidden=176, ctx=64)


def text_bytes(names):
    parts = []
    for n in names:
        with open(LICENSES + n, "rb") as f:
            parts.append(f.read())
    return np.frombuffer(b"".join(parts), dtype=np.uint8).astype(np.int64)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, pos):
    # x (B, H, T, D): rotate pairs (first half, second half) as HF's rotate_half does
    d = x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = pos[:, None].float() * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.h, self.kvh, self.hd = c["heads"], c["kv_heads"], c["dim"] // c["heads"]
        self.q_proj = nn.Linear(c["dim"], self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(c["dim"], self.kvh * self.hd, bias=False)
        self.v_proj = nn.Linear(c["dim"], self.kvh * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, c["dim"], bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        pos = torch.arange(T)
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kvh, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kvh, self.hd).transpose(1, 2)
        q, k = rope(q, pos), rope(k, pos)
        rep = self.h // self.kvh
        k = k.repeat_interleave(rep, 1)
        v = v.repeat_interleave(rep, 1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.h * self.hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["dim"], c["hidden"], bias=False)
        self.up_proj = nn.Linear(c["dim"], c["hidden"], bias=False)
        self.down_proj = nn.Linear(c["hidden"], c["dim"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["dim"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["dim"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["layers"])])
        self.norm = RMSNorm(c["dim"])


class TinyLlama(nn.Module):
    def __init__(self, c=CONFIG):
        super().__init__()
        self.config = dict(c)
        self.model = Body(c)
        self.lm_head = nn.Linear(c["dim"], c["vocab"], bias=False)

    def forward(self, idx):
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def windows(data, ctx):
    """Non-overlapping (input, target) windows over data, in order."""
    n = (len(data) - 1) // ctx
    x = torch.from_numpy(data[: n * ctx].reshape(n, ctx).copy())
    y = torch.from_numpy(data[1: n * ctx + 1].reshape(n, ctx).copy())
    return x, y


def loss_of(model, data, ctx=CONFIG["ctx"]):
    x, y = windows(data, ctx)
    with torch.no_grad():
        return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()


def save_safetensors(path, tensors, metadata=None):
    """Writes float32 tensors in the safetensors layout (names sorted, as safetensors does)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name].detach().numpy(), dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.tobytes())
        off += a.nbytes
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load_safetensors_f32(path):
    """The float32 tensors of a safetensors file (numpy parse of the header)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8: 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        assert info["dtype"] == "F32"
        out[name] = np.frombuffer(raw[base + b: base + e], dtype="<f4").reshape(info["shape"])
    return out


def load_model(path):
    m = TinyLlama()
    sd = {k: torch.from_numpy(v.copy()) for k, v in load_safetensors_f32(path).items()}
    m.load_state_dict(sd)
    m.eval()
    return m


def train(out, steps=1000, batch=16, seed=0):
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.set_num_threads(1)
    c = CONFIG
    data = text_bytes(TRAIN_FILES)
    held = text_bytes(EVAL_FILES)
    m = TinyLlama(c)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    for step in range(steps):
        lr = 3e-3 * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(data) - c["ctx"] - 1, batch)
        x = torch.from_numpy(np.stack([data[s: s + c["ctx"]] for s in starts]))
        y = torch.from_numpy(np.stack([data[s + 1: s + c["ctx"] + 1] for s in starts]))
        loss = F.cross_entropy(m(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    m.eval()
    print(f"held-out loss {loss_of(m, held):.4f} (nats/byte)")
    save_safetensors(out, dict(m.state_dict()),
                     {"format": "pt", "config": json.dumps(c, sort_keys=True)})


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "train":
        train(sys.argv[2], steps=int(sys.argv[3]) if len(sys.argv) > 3 else 1000)
    else:
        sys.exit(__doc__)
