"""The fedmoe image model (MLP stem) and its client step in NumPy, from the docs.

docs/model.md ("The image model's forward pass, exactly", "Client step",
"Initialisation and agreement", "Data") and docs/protocol.md (the parameter
layout, the Task and the Update) are the whole source: this file was written
from them, not from the C code. It holds

  * the run's random streams (Philox4x32-10, vectorised) and the frozen
    class-text encoder they draw,
  * the forward pass and its hand-written backward pass (checked against
    finite differences by `python3 fedmoe_model.py`, the self-test that
    ctest runs),
  * the bi-level client step: AdamW on the lower level (experts, stem, norms,
    prompt, gating) over train batches, every T_e steps T_r router steps on
    validation batches, the specialist anchor, the Task's learning-rate scale,
  * the evaluation an Update reports (losses, accuracy, generalist share).

The client of this folder (fedmoe_client.py --train) joins a run with it.
Its numbers are float32 like the C client's but not bit-identical to them
(another order of sums, libm's tanh): a second implementation agrees with
the first to rounding, and the coordinator averages both.
"""
import math
import os
import sys
import zlib

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # small products: one thread is faster
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fedmoe_init  # noqa: E402  (the registry, the groups, what a strategy carries)

ENCODER, INIT, LOCAL = 1, 3, 6
M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = np.uint64(0xFFFFFFFF)
GELU_C = math.sqrt(2.0 / math.pi)


# ---- random streams ---------------------------------------------------------

def philox_blocks(seed, stream_id, first, count):
    """Blocks first .. first+count-1 of stream (seed, stream_id): count x 4 words."""
    n = np.arange(first, first + count, dtype=np.uint64)
    c0, c1 = n & MASK, n >> np.uint64(32)
    c2 = np.full(count, stream_id & 0xFFFFFFFF, dtype=np.uint64)
    c3 = np.full(count, stream_id >> 32, dtype=np.uint64)
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(10):
        p0, p1 = np.uint64(M0) * c0, np.uint64(M1) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ np.uint64(k0), p1 & MASK,
                          (p0 >> np.uint64(32)) ^ c3 ^ np.uint64(k1), p0 & MASK)
        k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


class Rng:
    """A stream's words in order, four a block (docs/model.md, "The generator")."""

    def __init__(self, seed, purpose, index):
        self.seed, self.id = seed, (purpose << 56) | index
        self.block, self.left = 0, np.zeros(0, dtype=np.uint32)

    def words(self, n):
        out = [self.left[:n]]
        need = n - len(out[0])
        self.left = self.left[len(out[0]):]
        if need > 0:
            blocks = (need + 3) // 4
            w = philox_blocks(self.seed, self.id, self.block, blocks).reshape(-1)
            self.block += blocks
            out.append(w[:need])
            self.left = w[need:]
        return np.concatenate(out)

    def fill_uniform(self, shape, bound):
        """Uniform in [-b, b): (2u - 1) x b in float arithmetic, b a float."""
        u = (self.words(int(np.prod(shape))) >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)
        return ((np.float32(2.0) * u - np.float32(1.0)) * np.float32(bound)).reshape(shape)


def sqrtf(x):
    return np.float32(math.sqrt(np.float32(x)))


# ---- the parameters ---------------------------------------------------------

def initial(rng, rows, cols, kind, role):
    """A parameter's initial values (docs/model.md, "Initial parameters"):
    gains 1, biases 0 (no words drawn), the prompt in (-0.05, 0.05), routers
    in (-0.01, 0.01), every other weight in (-1/sqrt(cols), 1/sqrt(cols))."""
    shape = (cols,) if rows == 1 and kind in ("bias", "gain") else (rows, cols)
    if kind == "gain":
        return np.ones(shape, np.float32)
    if kind == "bias":
        return np.zeros(shape, np.float32)
    bound = {"prompt": np.float32(0.05), "router": np.float32(0.01)}.get(role, np.float32(1.0) / sqrtf(cols))
    return rng.fill_uniform(shape, bound)


class Model:
    """A client's parameters (name -> array; vectors 1-D, matrices out x in),
    their registry order, and the frozen encoder."""

    def __init__(self, spec, strategy, seed, partition, dtype=np.float32):
        self.spec, self.strategy = spec, strategy
        self.gating = bool(spec.gating)
        self.registry = fedmoe_init.registry(spec, self.gating)
        self.E = spec.generalists + spec.specialists
        self.S = spec.specialists
        shared, local = Rng(seed, INIT, 0), Rng(seed, LOCAL, partition)
        self.p, self.kind, self.role, self.group = {}, {}, {}, {}
        for name, rows, cols, kind, role in self.registry:
            grp = fedmoe_init.group(role, spec.shared or "all", spec.gating_shared)
            rng = local if grp == "local" else shared
            self.p[name] = initial(rng, rows, cols, kind, role).astype(dtype)
            self.kind[name], self.role[name], self.group[name] = kind, role, grp
        enc = Rng(seed, ENCODER, 0)
        C, M, dp, th, d = spec.classes, spec.prompt_len, spec.prompt_dim, spec.text_hidden, spec.d
        fan = (M + 1) * dp
        self.enc = {"e": enc.fill_uniform((C, dp), sqrtf(3.0)),
                    "Wa": enc.fill_uniform((th, fan), sqrtf(np.float32(3.0) / np.float32(fan))),
                    "ba": enc.fill_uniform((th,), np.float32(0.1)),
                    "Wb": enc.fill_uniform((d, th), sqrtf(np.float32(3.0) / np.float32(th))),
                    "bb": enc.fill_uniform((d,), np.float32(0.1))}
        self.enc = {k: v.astype(dtype) for k, v in self.enc.items()}
        # the load-balancing target: generalist_importance over the generalists, the rest over the specialists
        G, gi = spec.generalists, spec.generalist_importance
        self.q = np.array([gi / G if e < G else (1.0 - gi) / max(self.S, 1) for e in range(self.E)], dtype=dtype)

    def carried(self):
        """The names the strategy's `model` tensor carries, in registry order."""
        return [n for n, _, _, _, role in self.registry
                if fedmoe_init.carried(self.strategy, self.group[n], role)]

    def pack(self):
        names = self.carried()
        if not names:
            return None
        return np.concatenate([self.p[n].reshape(-1) for n in names]).astype("<f4").tobytes()

    def unpack(self, data):
        flat = np.frombuffer(data, dtype="<f4")
        at = 0
        for n in self.carried():
            size = self.p[n].size
            if at + size > len(flat):
                raise ValueError("the Task's model has %d values, fewer than the layout's" % len(flat))
            self.p[n] = flat[at:at + size].reshape(self.p[n].shape).astype(self.p[n].dtype)
            at += size
        if at != len(flat):
            raise ValueError("the Task's model has %d values, the layout %d" % (len(flat), at))


# ---- pieces of the forward pass and their backward ------------------------

def gelu(x):
    t = np.tanh(GELU_C * (x + 0.044715 * x * x * x))
    return 0.5 * x * (1.0 + t), t


def gelu_back(x, t, dy):
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3 * 0.044715 * x * x))


def layernorm(x, g, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    xh = (x - mu) * inv
    return xh * g + b, (xh, inv)


def layernorm_back(dy, g, cache):
    xh, inv = cache
    dxh = dy * g
    dx = inv * (dxh - dxh.mean(axis=-1, keepdims=True) - xh * (dxh * xh).mean(axis=-1, keepdims=True))
    return dx, (dy * xh).sum(axis=0), dy.sum(axis=0)


def normalize(x):
    norm = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    return x / (norm + 1e-12), (x, norm)


def normalize_back(dn, cache):
    x, norm = cache
    rho = norm + 1e-12
    return dn / rho - x * (x * dn).sum(axis=-1, keepdims=True) / (rho * rho * np.maximum(norm, 1e-30))


def softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def text_features(m, P):
    """t_c(P) for every class (C x d): the frozen encoder on [P's rows, e_c]."""
    enc = m.enc
    C = enc["e"].shape[0]
    v = np.concatenate([np.broadcast_to(P.reshape(1, -1), (C, P.size)), enc["e"]], axis=1)
    z = v @ enc["Wa"].T + enc["ba"]
    a, t = gelu(z)
    o = a @ enc["Wb"].T + enc["bb"]
    tn, nc = normalize(o)
    return tn, (z, t, nc, P.shape)


def text_features_back(m, dtn, cache):
    """The gradient of the prompt P from that of its class features."""
    z, t, nc, shape = cache
    da = normalize_back(dtn, nc) @ m.enc["Wb"]
    dv = gelu_back(z, t, da) @ m.enc["Wa"]
    return dv[:, :int(np.prod(shape))].sum(axis=0).reshape(shape)


# ---- forward and backward ---------------------------------------------------

def moe_block(m, b, h):
    """MoE block b on the rows of h (docs/model.md, "The image model's forward
    pass, exactly", step 3; the text model's too): what it adds to h, the
    cache backward needs, its load-balancing term and each row's generalist
    share (over the blocks)."""
    s, p = m.spec, m.p
    B = h.shape[0]
    u, lnc = layernorm(h, p["block%d.ln.g" % b], p["block%d.ln.b" % b])
    r = u @ p["block%d.router" % b].T
    order = np.argsort(-r, axis=1, kind="stable")[:, :s.top_k]  # ties to the lower index
    w = softmax(np.take_along_axis(r, order, axis=1))
    out = np.zeros_like(h)
    experts = []
    for e in range(m.E):
        rows, slot = np.nonzero(order == e)
        if len(rows) == 0:
            experts.append(None)
            continue
        x_ = "block%d.expert%d." % (b, e)
        ue = u[rows]
        z1 = ue @ p[x_ + "w1"].T + p[x_ + "b1"]
        a1, t1 = gelu(z1)
        y = a1 @ p[x_ + "w2"].T + p[x_ + "b2"]
        out[rows] += w[rows, slot][:, None] * y
        experts.append((rows, slot, ue, z1, t1, a1, y))
    share = np.where(order < s.generalists, w, 0.0).sum(axis=1) / s.blocks
    probs = softmax(r)
    f = np.bincount(order.reshape(-1), minlength=m.E).astype(h.dtype) / (B * s.top_k)
    lb = s.lb_weight * float((f * probs.mean(axis=0) / m.q).sum())
    return out, (h, u, lnc, r, order, w, experts, probs, f), lb, share


def forward(m, x, nonlocal_prompts):
    """Logits (B x C), the load-balancing term, and what backward needs."""
    s, p = m.spec, m.p
    B = x.shape[0]
    c = {"x": x}
    a0 = x @ p["stem.w"].T + p["stem.b"]
    h, t0 = gelu(a0)
    c["stem"] = (a0, t0)
    lb, blocks, share = 0.0, [], np.zeros(B, dtype=x.dtype)
    for b in range(s.blocks):
        out, cache, lb_b, share_b = moe_block(m, b, h)
        lb, share = lb + lb_b, share + share_b
        blocks.append(cache)
        h = h + out
    c["blocks"], c["share"] = blocks, share
    f, fc = layernorm(h, p["feature.ln.g"], p["feature.ln.b"])
    n, nc = normalize(f)
    c["feature"], c["n"], c["f"] = (fc, nc), n, f
    T0, tc0 = text_features(m, p["prompt"])
    c["T0"], c["tc0"] = T0, tc0
    gated = m.gating and len(nonlocal_prompts) > 0
    c["gated"] = gated
    if not gated:
        return s.tau * n @ T0.T, lb, c
    H, d = s.heads, s.d
    dh = d // H
    Ts = np.stack([T0] + [text_features(m, P)[0] for P in nonlocal_prompts])  # J x C x d
    J, C = Ts.shape[0], Ts.shape[1]
    q = f @ p["gating.wq"].T + p["gating.bq"]
    K = Ts @ p["gating.wk"].T + p["gating.bk"]
    V = Ts @ p["gating.wv"].T + p["gating.bv"]
    sv = n @ p["gating.wo"]  # s = wo^T n
    qh, sh = q.reshape(B, H, dh), sv.reshape(B, H, dh)
    kh, vh = K.reshape(J, C, H, dh), V.reshape(J, C, H, dh)
    att = softmax(s.attn_scale * np.einsum("bhd,jchd->bhjc", qh, kh), axis=2)
    vs = np.einsum("bhd,jchd->bhjc", sh, vh)
    g = (n @ p["gating.bo"])[:, None] + np.einsum("bhjc,bhjc->bc", att, vs)
    c["gate"] = (Ts, qh, kh, vh, sh, att, vs)
    return s.tau * getattr(s, "lambda") * n @ T0.T + s.tau * g, lb, c


def backward(m, c, dlogits, lb_scale=1.0):
    """Gradients of (loss whose logit gradient is dlogits) + lb_scale x the
    load-balancing term, for every parameter (name -> array)."""
    s, p = m.spec, m.p
    grads = {n: np.zeros_like(v) for n, v in m.p.items()}
    n, f, T0 = c["n"], c["f"], c["T0"]
    B = n.shape[0]
    df = np.zeros_like(f)
    if c["gated"]:
        lam = getattr(s, "lambda")
        Ts, qh, kh, vh, sh, att, vs = c["gate"]
        H, d = s.heads, s.d
        J, C = Ts.shape[0], Ts.shape[1]
        dT0 = s.tau * lam * dlogits.T @ n
        dn = s.tau * lam * dlogits @ T0
        G = s.tau * dlogits
        gsum = G.sum(axis=1, keepdims=True)
        grads["gating.bo"] = (gsum * n).sum(axis=0)
        dn += gsum * p["gating.bo"]
        dA = G[:, None, None, :] * vs
        dVs = G[:, None, None, :] * att
        ds = np.einsum("bhjc,jchd->bhd", dVs, vh).reshape(B, d)
        dV = np.einsum("bhjc,bhd->jchd", dVs, sh).reshape(J, C, d)
        dS = att * (dA - (att * dA).sum(axis=2, keepdims=True))
        dq = s.attn_scale * np.einsum("bhjc,jchd->bhd", dS, kh).reshape(B, d)
        dK = s.attn_scale * np.einsum("bhjc,bhd->jchd", dS, qh).reshape(J, C, d)
        grads["gating.wo"] = n.T @ ds
        dn += ds @ p["gating.wo"].T
        grads["gating.wq"], grads["gating.bq"] = dq.T @ f, dq.sum(axis=0)
        df += dq @ p["gating.wq"]
        flat = Ts.reshape(J * C, d)
        grads["gating.wk"], grads["gating.bk"] = dK.reshape(J * C, d).T @ flat, dK.sum(axis=(0, 1))
        grads["gating.wv"], grads["gating.bv"] = dV.reshape(J * C, d).T @ flat, dV.sum(axis=(0, 1))
        dT0 += dK[0] @ p["gating.wk"] + dV[0] @ p["gating.wv"]  # the non-local prompts are frozen
    else:
        dT0 = s.tau * dlogits.T @ n
        dn = s.tau * dlogits @ T0
    grads["prompt"] = text_features_back(m, dT0, c["tc0"])
    fc, nc = c["feature"]
    df += normalize_back(dn, nc)
    dh, grads["feature.ln.g"], grads["feature.ln.b"] = layernorm_back(df, p["feature.ln.g"], fc)
    for b in reversed(range(s.blocks)):
        h_in, u, lnc, r, order, w, experts, probs, fr = c["blocks"][b]
        du = np.zeros_like(u)
        dw = np.zeros_like(w)
        for e, ex in enumerate(experts):
            if ex is None:
                continue
            rows, slot, ue, z1, t1, a1, y = ex
            x_ = "block%d.expert%d." % (b, e)
            dout = dh[rows]
            dw[rows, slot] = (dout * y).sum(axis=1)
            dy = dout * w[rows, slot][:, None]
            grads[x_ + "w2"] += dy.T @ a1
            grads[x_ + "b2"] += dy.sum(axis=0)
            dz = gelu_back(z1, t1, dy @ p[x_ + "w2"])
            grads[x_ + "w1"] += dz.T @ ue
            grads[x_ + "b1"] += dz.sum(axis=0)
            du[rows] += dz @ p[x_ + "w1"]
        dr = np.zeros_like(r)
        np.put_along_axis(dr, order, w * (dw - (w * dw).sum(axis=1, keepdims=True)), axis=1)
        if lb_scale:
            gv = fr / m.q  # f is a count: no gradient through it
            dr += lb_scale * s.lb_weight / B * probs * (gv - (probs * gv).sum(axis=1, keepdims=True))
        grads["block%d.router" % b] = dr.T @ u
        du += dr @ p["block%d.router" % b]
        dx, grads["block%d.ln.g" % b], grads["block%d.ln.b" % b] = layernorm_back(du, p["block%d.ln.g" % b], lnc)
        dh = dh + dx
    a0, t0 = c["stem"]
    da = gelu_back(a0, t0, dh)
    grads["stem.w"], grads["stem.b"] = da.T @ c["x"], da.sum(axis=0)
    return grads


def cross_entropy(logits, y):
    """The mean cross-entropy and its gradient on the logits."""
    pr = softmax(logits)
    B = len(y)
    loss = float(-np.log(np.maximum(pr[np.arange(B), y], 1e-30)).mean())
    pr[np.arange(B), y] -= 1.0
    return loss, pr / B


# ---- the client step --------------------------------------------------------

class Trainer:
    """AdamW state and the step counts of both levels (kept across rounds)."""

    def __init__(self, model, train_spec, seed):
        self.m, self.t = model, train_spec
        self.adam = {n: (np.zeros_like(v), np.zeros_like(v)) for n, v in model.p.items()}
        self.steps = [0, 0]
        self.rng = np.random.default_rng(seed)

    def _level(self, name):
        role = self.m.role[name]
        upper = role == "router" or (role == "gating" and self.m.spec.gating_on_validation)
        return 1 if upper else 0

    def _adamw(self, names, grads, lr, level):
        self.steps[level] += 1
        t = self.steps[level]
        for n in names:
            g = grads[n]
            m_, v_ = self.adam[n]
            m_ *= 0.9
            m_ += 0.1 * g
            v_ *= 0.999
            v_ += 0.001 * g * g
            decay = level == 0 and self.m.kind[n] == "weight" and self.m.role[n] not in ("prompt", "router")
            w = self.m.p[n]
            if decay:
                w -= lr * self.t.weight_decay * w
            w -= lr * (m_ / (1 - 0.9 ** t)) / (np.sqrt(v_ / (1 - 0.999 ** t)) + 1e-8)

    def _anchor(self, lr):
        """Specialists move lr x A of the way toward their block's mean generalist."""
        A, s = self.t.anchor, self.m.spec
        if not A or self.m.strategy not in ("local", "comigs", "full"):
            return
        for b in range(s.blocks):
            for part in ("w1", "b1", "w2", "b2"):
                mean = sum(self.m.p["block%d.expert%d.%s" % (b, e, part)] for e in range(s.generalists)) / s.generalists
                for e in range(s.generalists, self.m.E):
                    w = self.m.p["block%d.expert%d.%s" % (b, e, part)]
                    w -= lr * A * (w - mean)

    def _batches(self, n):
        """Batch index arrays forever, a new order each pass."""
        while True:
            order = self.rng.permutation(n)
            for i in range(0, n, self.t.batch):
                yield order[i:i + self.t.batch]

    def round(self, data, nonlocal_prompts, lr_scale, beat=lambda: None):
        """One round of local training; the mean lower-level and upper-level
        losses (each batch's before its step). beat() is called between steps
        (a client heartbeats while it trains)."""
        xtr, ytr, xva, yva = data["train"][0], data["train"][1], data["val"][0], data["val"][1]
        lower = [n for n in self.m.p if self._level(n) == 0]
        upper = [n for n in self.m.p if self._level(n) == 1]
        per_pass = -(-len(ytr) // self.t.batch)
        steps = self.t.local_steps or self.t.local_epochs * per_pass
        lr, rlr = self.t.lr * lr_scale, self.t.router_lr * lr_scale
        tr, va = self._batches(len(ytr)), self._batches(len(yva)) if len(yva) else None
        losses, vlosses, since = [], [], 0
        upper_on = self.t.router_steps > 0 and va is not None and upper

        def upper_steps(k):
            for _ in range(k):
                i = next(va)
                logits, lb, c = forward(self.m, xva[i], nonlocal_prompts)
                loss, dl = cross_entropy(logits, yva[i])
                vlosses.append(loss)
                g = backward(self.m, c, dl, 1.0 if self.t.lb_in_upper else 0.0)
                self._adamw(upper, g, rlr, 1)

        for _ in range(steps):
            i = next(tr)
            logits, lb, c = forward(self.m, xtr[i], nonlocal_prompts)
            loss, dl = cross_entropy(logits, ytr[i])
            losses.append(loss)
            self._adamw(lower, backward(self.m, c, dl), lr, 0)
            self._anchor(lr)
            beat()
            since += 1
            if upper_on and since == self.t.expert_steps:
                upper_steps(self.t.router_steps)
                since = 0
        if upper_on and since:
            upper_steps(int(math.floor(since * self.t.router_steps / self.t.expert_steps + 0.5)))
        return float(np.mean(losses)), float(np.mean(vlosses)) if vlosses else 0.0


def sample(n, k):
    """docs/protocol.md's eval_sample: the examples (2j + 1) n / (2k), j < k."""
    if k <= 0 or k >= n:
        return np.arange(n)
    return np.array([(2 * j + 1) * n // (2 * k) for j in range(k)])


def evaluate(m, x, y, nonlocal_prompts, k=0):
    """(mean loss, correct, predictions, mean generalist share) on x, y."""
    idx = sample(len(y), k)
    if len(idx) == 0:
        return 0.0, 0, 0, 0.0
    loss, correct, share = 0.0, 0, 0.0
    for i in range(0, len(idx), 256):
        j = idx[i:i + 256]
        logits, _, c = forward(m, x[j], nonlocal_prompts)
        loss += cross_entropy(logits, y[j])[0] * len(j)
        correct += int((logits.argmax(axis=1) == y[j]).sum())
        share += float(c["share"].sum())
    return loss / len(idx), correct, len(idx), share / len(idx)


# ---- data: Fashion-MNIST as docs/model.md ("Data") loads it ----------------

FMNIST = "/usr/share/datasets/fashion-mnist"


def _idx(path, offset):
    with open(path, "rb") as f:
        return np.frombuffer(zlib.decompress(f.read(), 31), dtype=np.uint8, offset=offset)


def fashion_mnist(rows, folder=FMNIST):
    """Rows `rows` of the 70,000 examples (train file, then test file): pixels
    / 255, standardised with one mean and one standard deviation over every
    pixel of the 70,000 (the sums taken over a histogram of the byte values:
    the same double sums up to their order)."""
    x = np.concatenate([_idx(os.path.join(folder, "train-images-idx3-ubyte.gz"), 16),
                        _idx(os.path.join(folder, "t10k-images-idx3-ubyte.gz"), 16)]).reshape(-1, 784)
    y = np.concatenate([_idx(os.path.join(folder, "train-labels-idx1-ubyte.gz"), 8),
                        _idx(os.path.join(folder, "t10k-labels-idx1-ubyte.gz"), 8)]).astype(np.int64)
    values = (np.arange(256, dtype=np.float32) / np.float32(255.0)).astype(np.float64)
    count = np.bincount(x.reshape(-1), minlength=256).astype(np.float64)
    mean = (count * values).sum() / x.size
    var = (count * values * values).sum() / x.size - mean * mean
    xf = x[rows].astype(np.float32) / np.float32(255.0)
    return (xf - np.float32(mean)) * np.float32(1.0 / math.sqrt(var)), y[rows]


# ---- self-test: the backward pass against finite differences --------------

class _Spec:
    """A small ModelSpec for the self-test."""

    def __init__(self, gating):
        self.in_dim, self.classes, self.stem, self.d, self.blocks = 6, 3, "mlp", 8, 2
        self.generalists, self.specialists, self.ffn_hidden, self.top_k = 1, 2, 5, 2
        self.lb_weight, self.generalist_importance = 0.01, 0.5
        self.prompt_len, self.prompt_dim, self.text_hidden, self.heads = 2, 3, 7, 2
        self.max_nonlocal, self.attn_scale, self.tau, self.gating = 2, 10.0, 10.0, gating
        self.gating_on_validation, self.shared, self.gating_shared = False, "all", False
        setattr(self, "lambda", 0.5)


def self_test():
    """Every parameter's gradient against central differences (float64), with
    and without the gating; returns the largest relative error."""
    worst = 0.0
    rs = np.random.default_rng(7)
    for gating in (False, True):
        m = Model(_Spec(gating), "full", 5, 3, dtype=np.float64)
        for name in m.p:  # away from the initial zeros and ones
            m.p[name] = m.p[name] + 0.3 * rs.standard_normal(m.p[name].shape)
        x = rs.standard_normal((5, m.spec.in_dim))
        y = rs.integers(0, m.spec.classes, 5)
        nl = [rs.standard_normal((2, 3)), rs.standard_normal((2, 3))] if gating else []

        def loss_of():
            logits, lb, _ = forward(m, x, nl)
            return cross_entropy(logits, y)[0] + lb

        logits, lb, c = forward(m, x, nl)
        grads = backward(m, c, cross_entropy(logits, y)[1])
        for name, w in m.p.items():
            flat, g = w.reshape(-1), grads[name].reshape(-1)
            for i in rs.choice(flat.size, min(flat.size, 6), replace=False):
                keep = flat[i]
                flat[i] = keep + 1e-6
                up = loss_of()
                flat[i] = keep - 1e-6
                down = loss_of()
                flat[i] = keep
                num = (up - down) / 2e-6
                err = abs(num - g[i]) / max(1e-4, abs(num) + abs(g[i]))
                if err > 1e-5:
                    print("self-test: %s[%d] (gating %s): backward %.9g, finite differences %.9g" %
                          (name, i, gating, g[i], num))
                worst = max(worst, err)
    return worst


def _check_streams():
    """The vectorised generator against fedmoe_init's word by word."""
    a = Rng(0x1234567890, INIT, 0).words(11)
    r = fedmoe_init.Rng(0x1234567890, fedmoe_init.stream(INIT, 0))
    b = [r.u32() for _ in range(11)]
    return list(map(int, a)) == b


if __name__ == "__main__":
    streams = _check_streams()
    worst = self_test()
    print("self-test: streams %s; largest relative gradient error %.2e (every parameter, with and without "
          "the gating)" % ("agree" if streams else "DISAGREE", worst))
    sys.exit(0 if streams and worst < 1e-5 else 1)
