"""ctest forward_reference: the C image model's forward pass against a second
implementation, the NumPy model of examples/python (written from the docs
alone, not from the C code). Finite differences check that the C gradients
match the C forward; this checks that the C forward is the documented model.

tests/forward_dump (C) writes a model's parameters as initialised from a seed
and a partition, the same parameters moved off those values, inputs, non-local
prompts and the logits it computes with and without them. Here the NumPy model
draws its own initial parameters from the same seed and partition (they must
be equal, bit for bit: the docs' random streams), takes the moved ones, and
computes the logits itself: they must agree to float32 rounding, with the
attention gating over the non-local prompts and without it.
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
import fedmoe_model  # noqa: E402

with tempfile.TemporaryDirectory(prefix="fedmoe-forward-") as d:
    subprocess.run([dump, d], check=True)
    raw = json.load(open(os.path.join(d, "spec.json")))
    model = dict(raw["model"])
    lam = model.pop("lambda")
    model.setdefault("gating_shared", False)  # (written only when set)
    spec = types.SimpleNamespace(**model)
    setattr(spec, "lambda", lam)
    read = lambda name: np.fromfile(os.path.join(d, name), dtype="<f4")  # noqa: E731
    names = [line.split() for line in open(os.path.join(d, "names.txt"))]
    init, moved, x = read("init.bin"), read("params.bin"), read("x.bin").reshape(-1, spec.in_dim)
    nl = read("nonlocal.bin").reshape(-1, spec.prompt_len, spec.prompt_dim)
    C = spec.classes

    m = fedmoe_model.Model(spec, "full", raw["seed"], raw["client_partition"])
    assert [n for n, _, _ in names] == list(m.p), "the registry's order or names differ from the docs'"
    off, worst_init = 0, 0
    for name, rows, cols in names:
        size = int(rows) * int(cols)
        c_init = init[off:off + size].reshape(m.p[name].shape)
        if not np.array_equal(c_init, m.p[name]):
            worst_init += 1
            print("initial %s differs: C %s, NumPy %s" % (name, c_init.ravel()[:3], m.p[name].ravel()[:3]))
        m.p[name] = moved[off:off + size].reshape(m.p[name].shape).copy()
        off += size
    assert off == init.size, "the parameter count differs"
    assert worst_init == 0, "%d initial parameters differ from the docs' draw" % worst_init

    worst = 0.0
    for tag, prompts in (("logits0.bin", []), ("logitsK.bin", list(nl))):
        c_logits = read(tag).reshape(-1, C)
        logits, _, _ = fedmoe_model.forward(m, x, prompts)
        err = np.abs(logits - c_logits) / (1.0 + np.abs(c_logits))
        print("%s: %d inputs x %d classes, %d non-local prompts: largest difference %.2e (logits up to %.1f)" %
              (tag, c_logits.shape[0], C, len(prompts), err.max(), np.abs(c_logits).max()))
        assert np.isfinite(c_logits).all() and np.abs(c_logits).max() > 1.0, "the logits are degenerate"
        worst = max(worst, float(err.max()))
    assert worst < 1e-4, "the C forward pass and the documented one differ by %.2e" % worst
    print("forward_reference: the C forward pass is the documented model (largest relative difference %.2e)" % worst)
