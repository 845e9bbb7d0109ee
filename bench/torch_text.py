#!/usr/bin/python3
"""The fedmoe text model in PyTorch, for the training-throughput comparison.

Same architecture and sizes as common/learn/src/model_text.c (docs/model.md "The text
model"): byte and position embeddings (d 128, context 32 by default), 2 blocks of
pre-LayerNorm causal self-attention (4 heads, one stacked QKV projection) and
the MoE layer of bench/torch_model.py (1 generalist + 2 specialists, top-2,
load balancing), final LayerNorm, output tied to the byte embedding, next-byte
cross-entropy. One lower-level AdamW step per batch of windows of random
bytes, single thread; prints one JSON line like fedmoe-bench train --task text.

    python3 bench/torch_text.py [--batch 32] [--context 32] [--steps 20] [--repeats 5] [--threads 1]
"""
import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_model import Block, D, LB_W, L, median_rate

HEADS, V = 4, 256
T = 32  # the default context (--context)


class Attention(nn.Module):
    def __init__(self, context):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.o = nn.Linear(D, D)
        self.register_buffer("mask", torch.ones(context, context, dtype=torch.bool).triu(1))

    def forward(self, h):
        B, Tn, _ = h.shape
        q, k, v = self.qkv(self.ln(h)).split(D, dim=-1)
        q, k, v = (t.view(B, Tn, HEADS, D // HEADS).transpose(1, 2) for t in (q, k, v))
        # (Debian 12's torch 1.13 has no fused attention: the same GEMMs as fedmoe's, T x T scores masked)
        s = (q @ k.transpose(-2, -1)) * (D // HEADS) ** -0.5
        s = s.masked_fill(self.mask[:Tn, :Tn], float("-inf"))
        o = F.softmax(s, dim=-1) @ v
        return h + self.o(o.transpose(1, 2).reshape(B, Tn, D))


class TextModel(nn.Module):
    def __init__(self, context, untied=False):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.pos = nn.Parameter(torch.randn(context, D) * 0.02)
        self.attn = nn.ModuleList([Attention(context) for _ in range(L)])
        self.moe = nn.ModuleList([Block() for _ in range(L)])
        self.lnf = nn.LayerNorm(D)
        self.out = nn.Linear(D, V, bias=False) if untied else None  # an output layer of its own

    def logits(self, tok):
        """Every position's logits ((B x T) x 256), the load-balancing term
        and the bytes to predict."""
        x, y = tok[:, :-1], tok[:, 1:]
        B, Tn = x.shape
        h = self.emb(x) + self.pos[:Tn]
        lb = 0.0
        for a, m in zip(self.attn, self.moe):
            h = a(h)
            flat, l = m(h.reshape(B * Tn, D))
            h = flat.view(B, Tn, D)
            lb = lb + l
        w = self.out.weight if self.out is not None else self.emb.weight
        return (self.lnf(h) @ w.t()).reshape(-1, V), lb, y.reshape(-1)

    def forward(self, tok):
        logits, lb, y = self.logits(tok)
        return F.cross_entropy(logits, y) + LB_W * lb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=T)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = TextModel(a.context)
    lower = [p for n, p in model.named_parameters() if "router" not in n]
    opt = torch.optim.AdamW(lower, lr=1e-3, weight_decay=1e-4)
    pool = 16
    toks = torch.randint(0, V, (pool, a.batch, a.context + 1))

    rate = median_rate(model, opt, [(toks[i],) for i in range(pool)], 5, a.repeats, a.steps, a.batch * a.context)
    print(json.dumps({"bench": "train", "impl": "pytorch", "torch": torch.__version__, "task": "text",
                      "batch": a.batch, "context": a.context, "threads": a.threads, "steps": a.steps, "repeats": a.repeats,
                      "tokens_per_s": round(rate, 1)}))


if __name__ == "__main__":
    main()
