"""ctest forward_reference: the C forward passes against second
implementations in NumPy written from the docs alone (not from the C code).
Finite differences check that the C gradients match the C forward; this
checks that the C forward is the documented model.

tests/forward_dump (C) writes a model's parameters as initialised from a seed
and a partition, the same parameters moved off those values, inputs, and the
logits it computes. Here NumPy draws its own initial parameters from the same
seed and partition (they must be equal, bit for bit: the docs' random
streams), takes the moved ones, and computes the logits itself: they must
agree to float32 rounding.
  - image: the NumPy model of examples/python (docs/model.md, "The image
    model's forward pass, exactly"), with the attention gating over non-local
    prompts and without it;
  - text, tied and untied: the byte-level language model below, written from
    docs/model.md ("The text model", "The forward pass, exactly") and
    docs/protocol.md's text layout table.
  python3 tests/forward_reference.py FORWARD_DUMP SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import types

import numpy as np

dump, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "examples", "python"))
import fedmoe_init  # noqa: E402
import fedmoe_model  # noqa: E402
from fedmoe_model import gelu, layernorm, softmax  # noqa: E402,F401


def load(d):
    raw = json.load(open(os.path.join(d, "spec.json")))
    model = dict(raw["model"])
    lam = model.pop("lambda")
    model.setdefault("gating_shared", False)  # (written only when set)
    spec = types.SimpleNamespace(**model)
    setattr(spec, "lambda", lam)
    names = [line.split() for line in open(os.path.join(d, "names.txt"))]
    return raw, spec, names


def read(d, name, dtype="<f4"):
    return np.fromfile(os.path.join(d, name), dtype=dtype)


def take_params(d, names, expected, p):
    """Checks C's initial draw against p (name -> array, drawn here) and
    replaces p's values with C's moved ones."""
    init, moved = read(d, "init.bin"), read(d, "params.bin")
    assert [n for n, _, _ in names] == expected, "the registry's order or names differ from the docs'"
    off, differ = 0, 0
    for name, rows, cols in names:
        size = int(rows) * int(cols)
        c_init = init[off:off + size].reshape(p[name].shape)
        if not np.array_equal(c_init, p[name]):
            differ += 1
            print("initial %s differs: C %s, NumPy %s" % (name, c_init.ravel()[:3], p[name].ravel()[:3]))
        p[name] = moved[off:off + size].reshape(p[name].shape).copy()
        off += size
    assert off == init.size, "the parameter count differs"
    assert differ == 0, "%d initial parameters differ from the docs' draw" % differ


def compare(tag, ours, theirs):
    err = np.abs(ours - theirs) / (1.0 + np.abs(theirs))
    print("%s: %d x %d logits: largest difference %.2e (logits up to %.1f)" %
          (tag, theirs.shape[0], theirs.shape[1], err.max(), np.abs(theirs).max()))
    assert np.isfinite(theirs).all() and np.abs(theirs).max() > 1.0, "the logits are degenerate"
    return float(err.max())


def check_image(d):
    raw, spec, names = load(d)
    m = fedmoe_model.Model(spec, "full", raw["seed"], raw["client_partition"])
    take_params(d, names, list(m.p), m.p)
    x = read(d, "x.bin").reshape(-1, spec.in_dim)
    nl = read(d, "nonlocal.bin").reshape(-1, spec.prompt_len, spec.prompt_dim)
    worst = 0.0
    for tag, prompts in (("logits0.bin", []), ("logitsK.bin", list(nl))):
        logits, _, _ = fedmoe_model.forward(m, x, prompts)
        worst = max(worst, compare("image, %d non-local prompts" % len(prompts), logits,
                                   read(d, tag).reshape(-1, spec.classes)))
    return worst


# ---- the text model, from docs/model.md and docs/protocol.md ---------------

def text_registry(s):
    """(name, rows, cols, kind, role) in the text layout table's order."""
    d = s.d
    p = [("emb", 256, d, "weight", "embedding"), ("pos", s.context, d, "weight", "embedding")]
    for b in range(s.blocks):
        a = "block%d.attn." % b
        p += [(a + "ln.g", 1, d, "gain", "norm"), (a + "ln.b", 1, d, "bias", "norm"),
              (a + "wqkv", 3 * d, d, "weight", "attention"), (a + "bqkv", 1, 3 * d, "bias", "attention"),
              (a + "wo", d, d, "weight", "attention"), (a + "bo", 1, d, "bias", "attention")]
        p += fedmoe_init.moe_registry(s, b)
    p += [("lnf.g", 1, d, "gain", "norm"), ("lnf.b", 1, d, "bias", "norm")]
    if s.untied:
        p += [("out", 256, d, "weight", "embedding")]
    return p


class TextModel:
    """The parameters drawn as docs/model.md's "Initial parameters" says."""

    def __init__(self, s, seed, partition):
        self.spec, self.E = s, s.generalists + s.specialists
        shared = fedmoe_model.Rng(seed, fedmoe_model.INIT, 0)
        local = fedmoe_model.Rng(seed, fedmoe_model.LOCAL, partition)
        self.registry, self.p = text_registry(s), {}
        for name, rows, cols, kind, role in self.registry:
            rng = local if fedmoe_init.group(role, s.shared or "all") == "local" else shared
            self.p[name] = fedmoe_model.initial(rng, rows, cols, kind, role)
        G, gi = s.generalists, s.generalist_importance
        self.q = np.array([gi / G if e < G else (1.0 - gi) / max(s.specialists, 1) for e in range(self.E)],
                          dtype=np.float32)


def text_logits(m, tok):
    """Every position's logits ((windows x T) x 256) of windows tok (N x T+1)."""
    s, p = m.spec, m.p
    T, d = s.context, s.d
    w = d // s.heads
    scale = np.float32(1.0) / fedmoe_model.sqrtf(w)
    out = []
    for win in tok:
        h = p["emb"][win[:T]] + p["pos"]
        for b in range(s.blocks):
            a = "block%d.attn." % b
            u, _ = layernorm(h, p[a + "ln.g"], p[a + "ln.b"])
            qkv = u @ p[a + "wqkv"].T + p[a + "bqkv"]
            q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
            o = np.zeros_like(h)
            causal = np.tril(np.ones((T, T), dtype=bool))
            for j in range(s.heads):
                sl = slice(j * w, (j + 1) * w)
                sc = np.where(causal, (q[:, sl] @ k[:, sl].T) * scale, -np.inf)
                o[:, sl] = softmax(sc) @ v[:, sl]
            h = h + o @ p[a + "wo"].T + p[a + "bo"]
            h = h + fedmoe_model.moe_block(m, b, h)[0]
        f, _ = layernorm(h, p["lnf.g"], p["lnf.b"])
        out.append(f @ (p["out"] if s.untied else p["emb"]).T)
    return np.concatenate(out)


def check_text(d):
    raw, spec, names = load(d)
    m = TextModel(spec, raw["seed"], raw["client_partition"])
    take_params(d, names, [n for n, _, _, _, _ in m.registry], m.p)
    tok = read(d, "tok.bin", np.uint8).reshape(-1, spec.context + 1)
    return compare("text (%s)" % ("untied" if spec.untied else "tied"), text_logits(m, tok),
                   read(d, "logits.bin").reshape(-1, 256))


worst = 0.0
for family, check in (("image", check_image), ("text", check_text), ("text-untied", check_text)):
    with tempfile.TemporaryDirectory(prefix="fedmoe-forward-") as d:
        subprocess.run([dump, d, family], check=True)
        worst = max(worst, check(d))
assert worst < 1e-4, "a C forward pass and the documented one differ by %.2e" % worst
print("forward_reference: the C forward passes are the documented models (largest relative difference %.2e)" % worst)
