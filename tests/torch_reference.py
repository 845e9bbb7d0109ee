"""ctest torch_reference: the C forward passes against the PyTorch twins of
bench/ (torch_model.py, the image model; torch_text.py, the text model), the
same parameters loaded into both: logits and loss (the mean cross-entropy and
the load-balancing term) agree to 1e-5 relative. The twins are a third
implementation, in another library's kernels (its LayerNorm, GELU, softmax,
top-k, convolution-free linear layers, cross-entropy), so an error common to
the C model and the NumPy reference (tests/forward_reference.py) that both
took from the docs would still show here only if the twin differs; what this
adds is that the models the speed comparison measures are the same models.

The frozen class-text encoder is not a parameter: it is drawn here as the
docs say (the NumPy model of examples/python draws it, and
forward_reference checks that model's logits against C's).

Exits 77 (ctest: skipped) with one line when PyTorch is missing
(scripts/install-deps.sh --bench or --ci installs Debian's python3-torch).
  python3 tests/torch_reference.py FORWARD_DUMP SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("torch_reference: skipped: PyTorch is missing (scripts/install-deps.sh --bench installs python3-torch)")
    sys.exit(77)
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402

dump, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "bench"))
sys.path.insert(0, os.path.join(src, "examples", "python"))
sys.path.insert(0, os.path.join(src, "tests"))
import torch_model  # noqa: E402
import torch_text  # noqa: E402

torch.set_num_threads(1)


def read(d, name, dtype="<f4"):
    return np.fromfile(os.path.join(d, name), dtype=dtype)


def c_params(d):
    """name -> the moved parameters forward_dump used (a tensor each)."""
    flat = read(d, "params.bin")
    out, off = {}, 0
    for line in open(os.path.join(d, "names.txt")):
        name, rows, cols = line.split()
        size = int(rows) * int(cols)
        shape = (int(cols),) if int(rows) == 1 else (int(rows), int(cols))
        out[name] = torch.from_numpy(flat[off:off + size].reshape(shape).copy())
        off += size
    assert off == flat.size
    return out


def moe_targets(blocks):
    """C's names of the MoE blocks' parameters -> the twin's tensors."""
    t = {}
    for b, blk in enumerate(blocks):
        t["block%d.ln.g" % b], t["block%d.ln.b" % b] = blk.ln.weight, blk.ln.bias
        t["block%d.router" % b] = blk.router.weight
        for e, ex in enumerate(blk.experts):
            x = "block%d.expert%d." % (b, e)
            t[x + "w1"], t[x + "b1"], t[x + "w2"], t[x + "b2"] = ex.w1.weight, ex.w1.bias, ex.w2.weight, ex.w2.bias
    return t


def load(targets, params):
    """Every C parameter into its twin tensor; none left over on either side."""
    assert sorted(targets) == sorted(params), "names differ: C only %s, twin only %s" % (
        sorted(set(params) - set(targets)), sorted(set(targets) - set(params)))
    with torch.no_grad():
        for name, t in targets.items():
            assert tuple(t.shape) == tuple(params[name].shape), "%s: twin %s, C %s" % (
                name, tuple(t.shape), tuple(params[name].shape))
            t.copy_(params[name])


def rel(a, b):
    return float((np.abs(a - b) / (1.0 + np.abs(b))).max())


def check(tag, logits, lb, y, d, logits_file, loss_file):
    c_logits = read(d, logits_file).reshape(logits.shape)
    c_ce, c_lb = read(d, loss_file)
    ce = float(F.cross_entropy(logits, y))
    ours = logits.detach().numpy()
    e_logits = rel(ours, c_logits)
    e_loss = max(abs(ce - c_ce) / abs(c_ce), abs(float(lb) - c_lb) / abs(c_lb))
    print("%s: %d x %d logits, largest difference %.2e; cross-entropy %.6f (C %.6f), load balancing %.6f (C %.6f)" %
          (tag, ours.shape[0], ours.shape[1], e_logits, ce, c_ce, float(lb), c_lb))
    assert np.isfinite(c_logits).all() and np.abs(c_logits).max() > 1.0, "the logits are degenerate"
    return max(e_logits, e_loss)


def check_image(d):
    import fedmoe_model
    import types
    raw = json.load(open(os.path.join(d, "spec.json")))
    spec = types.SimpleNamespace(**{k: v for k, v in raw["model"].items() if k != "lambda"})
    spec.gating_shared = raw["model"].get("gating_shared", False)
    enc = fedmoe_model.Model(spec, "full", raw["seed"], raw["client_partition"]).enc  # the docs' draw
    torch.manual_seed(0)
    m = torch_model.Model("mlp")
    p = c_params(d)
    t = {"stem.w": m.stem.fc.weight, "stem.b": m.stem.fc.bias, "feature.ln.g": m.lnf.weight,
         "feature.ln.b": m.lnf.bias, "prompt": m.prompt}
    t.update(moe_targets(m.blocks))
    for k in "qkvo":
        lin = getattr(m, "w" + k)
        t["gating.w" + k], t["gating.b" + k] = lin.weight, lin.bias
    load(t, p)
    with torch.no_grad():
        m.emb.copy_(torch.from_numpy(enc["e"]))
        m.wa.weight.copy_(torch.from_numpy(enc["Wa"]))
        m.wa.bias.copy_(torch.from_numpy(enc["ba"]))
        m.wb.weight.copy_(torch.from_numpy(enc["Wb"]))
        m.wb.bias.copy_(torch.from_numpy(enc["bb"]))
        nl = torch.from_numpy(read(d, "nonlocal.bin").reshape(-1, spec.prompt_len, spec.prompt_dim))
        m.t_nl = torch.stack([m.text(q) for q in nl])
        x = torch.from_numpy(read(d, "x.bin").reshape(-1, spec.in_dim))
        y = torch.from_numpy(read(d, "y.bin", np.uint8).astype(np.int64))
        worst = 0.0
        for gated, lf, sf in ((False, "logits0.bin", "loss0.bin"), (True, "logitsK.bin", "lossK.bin")):
            logits, lb = m.logits(x, gated)
            worst = max(worst, check("image, %d non-local prompts" % (len(nl) if gated else 0),
                                     logits, lb, y, d, lf, sf))
    return worst


def check_text(d):
    raw = json.load(open(os.path.join(d, "spec.json")))
    s = raw["model"]
    torch.manual_seed(0)
    m = torch_text.TextModel(s["context"], s["untied"])
    t = {"emb": m.emb.weight, "pos": m.pos, "lnf.g": m.lnf.weight, "lnf.b": m.lnf.bias}
    if s["untied"]:
        t["out"] = m.out.weight
    for b, a in enumerate(m.attn):
        x = "block%d.attn." % b
        t.update({x + "ln.g": a.ln.weight, x + "ln.b": a.ln.bias, x + "wqkv": a.qkv.weight, x + "bqkv": a.qkv.bias,
                  x + "wo": a.o.weight, x + "bo": a.o.bias})
    t.update(moe_targets(m.moe))
    load(t, c_params(d))
    tok = torch.from_numpy(read(d, "tok.bin", np.uint8).astype(np.int64).reshape(-1, s["context"] + 1))
    with torch.no_grad():
        logits, lb, y = m.logits(tok)
    return check("text (%s)" % ("untied" if s["untied"] else "tied"), logits, lb, y, d, "logits.bin", "loss.bin")


worst = 0.0
for family, fn in (("image", check_image), ("text", check_text), ("text-untied", check_text)):
    with tempfile.TemporaryDirectory(prefix="fedmoe-torch-") as d:
        subprocess.run([dump, d, family], check=True, stdout=subprocess.DEVNULL)
        worst = max(worst, fn(d))
assert worst < 1e-5, "the C forward pass and the PyTorch twin differ by %.2e (relative)" % worst
print("torch_reference: the C models and the PyTorch twins agree (torch %s; largest relative difference %.2e)" %
      (torch.__version__, worst))
