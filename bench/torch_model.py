#!/usr/bin/python3
"""The fedmoe default model in PyTorch, for the training-throughput comparison.

Same architecture and sizes as common/learn/src/model.c (docs/model.md): MLP or CNN
stem, 2 MoE blocks (1 generalist + 2 specialists, top-2 of softmax over the kept
logits, sparse dispatch per expert), load-balancing term, LayerNorm feature,
frozen class-text encoder, local prompt, 4 frozen non-local prompts, 8-head
attention gating with the output projection re-associated the same way as the C
code (<nf, Wo o> = <Wo^T nf, o>). One lower-level AdamW step per batch of 32 on
synthetic inputs, single thread; prints one JSON line like fedmoe-bench train.

    python3 bench/torch_model.py [--stem mlp|cnn] [--batch 32] [--steps 200] [--repeats 5] [--threads 1]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

D, L, G, S, HF, K_TOP = 128, 2, 1, 2, 256, 2
C, M, DP, HT, HEADS, KNL = 10, 4, 64, 256, 8, 4
TAU, LAM, ATT_SCALE, LB_W, GEN_IMP = 10.0, 0.5, 10.0, 0.01, 0.5


def gelu(x):
    return F.gelu(x, approximate="tanh")


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(D, HF)
        self.w2 = nn.Linear(HF, D)

    def forward(self, u):
        return self.w2(gelu(self.w1(u)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.router = nn.Linear(D, G + S, bias=False)
        self.experts = nn.ModuleList([Expert() for _ in range(G + S)])
        q = [GEN_IMP / G] * G + [(1 - GEN_IMP) / S] * S
        self.register_buffer("q", torch.tensor(q))

    def forward(self, h):
        u = self.ln(h)
        r = self.router(u)
        p = F.softmax(r, dim=-1)
        topv, topi = r.topk(K_TOP, dim=-1)
        w = F.softmax(topv, dim=-1)
        y = torch.zeros_like(h)
        counts = []
        for e, ex in enumerate(self.experts):
            rows, slots = (topi == e).nonzero(as_tuple=True)
            counts.append(rows.numel())
            if rows.numel():
                y = y.index_add(0, rows, w[rows, slots].unsqueeze(1) * ex(u[rows]))
        frac = torch.tensor(counts, dtype=h.dtype) / (h.shape[0] * K_TOP)
        lb = (frac * p.mean(0) / self.q).sum()
        return h + y, lb


class Stem(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        if kind == "mlp":
            self.fc = nn.Linear(784, D)
        else:
            self.c1 = nn.Conv2d(1, 32, 5)
            self.c2 = nn.Conv2d(32, 64, 5)
            self.fc = nn.Linear(1024, D)

    def forward(self, x):
        if self.kind == "mlp":
            return gelu(self.fc(x))
        x = x.view(-1, 1, 28, 28)
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return gelu(self.fc(x.flatten(1)))


class Model(nn.Module):
    def __init__(self, stem):
        super().__init__()
        self.stem = Stem(stem)
        self.blocks = nn.ModuleList([Block() for _ in range(L)])
        self.lnf = nn.LayerNorm(D)
        self.prompt = nn.Parameter(torch.empty(M, DP).uniform_(-0.05, 0.05))
        # frozen class-text encoder
        self.register_buffer("emb", torch.empty(C, DP).uniform_(-1.7, 1.7))
        self.wa = nn.Linear((M + 1) * DP, HT)
        self.wb = nn.Linear(HT, D)
        for p in list(self.wa.parameters()) + list(self.wb.parameters()):
            p.requires_grad_(False)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(D, D) for _ in range(4))
        nl = torch.empty(KNL, M, DP).uniform_(-0.05, 0.05)
        with torch.no_grad():
            self.register_buffer("t_nl", torch.stack([self.text(p) for p in nl]))  # (K, C, D)

    def text(self, prompt):
        v = torch.cat([prompt.reshape(1, -1).expand(C, -1), self.emb], dim=1)
        return F.normalize(self.wb(gelu(self.wa(v))), dim=-1)

    def logits(self, x, gated=True):
        """The logits and the load-balancing term (gated=False: no non-local
        prompts, logits tau cos(f, t_c(P_L)), as in a client's first round)."""
        h = self.stem(x)
        lb = 0.0
        for b in self.blocks:
            h, l = b(h)
            lb = lb + l
        f = self.lnf(h)
        nf = F.normalize(f, dim=-1)
        tl = self.text(self.prompt)
        c1 = nf @ tl.t()
        if not gated:
            return TAU * c1, lb
        tall = torch.cat([tl.unsqueeze(0), self.t_nl], 0)  # (J, C, D)
        J = tall.shape[0]
        dh = D // HEADS
        q = self.wq(f).view(-1, HEADS, dh)
        k = self.wk(tall).view(J, C, HEADS, dh)
        v = self.wv(tall).view(J, C, HEADS, dh)
        a = F.softmax(ATT_SCALE * torch.einsum("bhd,jchd->bchj", q, k), dim=-1)
        gq = (nf @ self.wo.weight).view(-1, HEADS, dh)
        vdot = torch.einsum("bhd,jchd->bchj", gq, v)
        c2 = (a * vdot).sum((2, 3)) + (nf @ self.wo.bias).unsqueeze(1)
        return TAU * (LAM * c1 + c2), lb

    def forward(self, x, y):
        logits, lb = self.logits(x)
        return F.cross_entropy(logits, y) + LB_W * lb


def median_rate(model, opt, batches, warmup, repeats, steps, per_step):
    """One AdamW step of model on batches[i % len] (a tuple of its arguments) per
    i, warmup steps first; the median over repeats of steps steps, in units of
    per_step a step."""
    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = model(*batches[i % len(batches)])
        loss.backward()
        opt.step()

    for i in range(warmup):
        step(i)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(steps):
            step(i)
        rates.append(steps * per_step / (time.perf_counter() - t0))
    return statistics.median(rates)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stem", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    model = Model(a.stem)
    lower = [p for n, p in model.named_parameters() if p.requires_grad and "router" not in n]
    opt = torch.optim.AdamW(lower, lr=1e-3, weight_decay=1e-4)
    pool = 16
    xs = torch.randn(pool, a.batch, 784)
    ys = torch.randint(0, C, (pool, a.batch))

    rate = median_rate(model, opt, [(xs[i], ys[i]) for i in range(pool)], 20, a.repeats, a.steps, a.batch)
    print(json.dumps({"bench": "train", "impl": "pytorch", "torch": torch.__version__, "stem": a.stem,
                      "batch": a.batch, "threads": a.threads, "steps": a.steps, "repeats": a.repeats,
                      "samples_per_s": round(rate, 1)}))


if __name__ == "__main__":
    main()
