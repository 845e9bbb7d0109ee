"""The initial state of a fedmoe image model, drawn from the docs alone.

docs/model.md, "Initialisation and agreement", lays out the generator
(Philox4x32-10), its streams and every draw; docs/protocol.md the parameter
registry and which parameters a strategy carries. From them and a Welcome's
seed, ModelSpec and strategy, this module computes the `model` and `prompt`
tensors of the run's first Task bit for bit, without the coordinator: the
client of this folder checks them (--check-init), so a change of the code
that the docs do not follow fails a test. Pure Python (no NumPy).
"""
import math
import struct

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF

# stream purposes (docs/model.md, the stream table)
ENCODER, PARTITION, INIT, SPLIT, HOLDOUT, LOCAL, SHUFFLE = 1, 2, 3, 4, 5, 6, 7


def philox4x32_10(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & MASK, p1 & MASK, ((p0 >> 32) ^ c3 ^ k1) & MASK, p0 & MASK
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c0, c1, c2, c3


def stream(purpose, index):
    return (purpose << 56) | index


def f32(x):
    """x rounded to float32 (as C's float arithmetic does)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


class Rng:
    """(seed, stream): the words of blocks 0, 1, ..., four a block, in order."""

    def __init__(self, seed, stream_id):
        self.key = (seed & MASK, seed >> 32)
        self.stream = stream_id
        self.counter = 0
        self.buf, self.used = (), 4

    def u32(self):
        if self.used == 4:
            n, s = self.counter, self.stream
            self.buf = philox4x32_10((n & MASK, n >> 32, s & MASK, s >> 32), self.key)
            self.counter += 1
            self.used = 0
        self.used += 1
        return self.buf[self.used - 1]

    def uniform(self):
        return (self.u32() >> 8) * (1.0 / 16777216.0)

    def fill_uniform(self, n, bound):
        """n values (2u - 1) x bound, in float arithmetic; bound a float32."""
        return [f32((2.0 * self.uniform() - 1.0) * bound) for _ in range(n)]


def moe_registry(spec, b):
    """MoE block b's parameters (both model families), in registry order."""
    d, hf, E = spec.d, spec.ffn_hidden, spec.generalists + spec.specialists
    p = [("block%d.ln.g" % b, 1, d, "gain", "norm"), ("block%d.ln.b" % b, 1, d, "bias", "norm"),
         ("block%d.router" % b, E, d, "weight", "router")]
    for e in range(E):
        role = "generalist" if e < spec.generalists else "specialist"
        x = "block%d.expert%d." % (b, e)
        p += [(x + "w1", hf, d, "weight", role), (x + "b1", 1, hf, "bias", role),
              (x + "w2", d, hf, "weight", role), (x + "b2", 1, d, "bias", role)]
    return p


def registry(spec, gating):
    """The image model's parameters in registry order (docs/protocol.md's
    layout table): (name, rows, cols, kind, role). MLP stem only."""
    if spec.stem not in ("", "mlp"):
        raise ValueError("this example draws the mlp stem only")
    d = spec.d
    p = [("stem.w", d, spec.in_dim, "weight", "stem"), ("stem.b", 1, d, "bias", "stem")]
    for b in range(spec.blocks):
        p += moe_registry(spec, b)
    p += [("feature.ln.g", 1, d, "gain", "norm"), ("feature.ln.b", 1, d, "bias", "norm"),
          ("prompt", spec.prompt_len, spec.prompt_dim, "weight", "prompt")]
    if gating:
        for m in "qkvo":
            p += [("gating.w" + m, d, d, "weight", "gating"), ("gating.b" + m, 1, d, "bias", "gating")]
    return p


def group(role, shared, gating_shared=False):
    """The group of a role (docs/model.md, "Parameters"): ModelSpec.shared
    ("experts": only the generalists are shared) and ModelSpec.gating_shared
    (the gating joins the shared group) decide."""
    if role == "gating":
        return "shared" if gating_shared else "local"
    if role in ("specialist", "router"):
        return "local"
    if role == "prompt":
        return "prompt"
    if role == "generalist":
        return "shared"
    return "local" if shared == "experts" else "shared"


def carried(strategy, grp, role):
    """Whether the strategy's `model` tensor carries the parameter."""
    if strategy in ("comigs", "full"):
        return grp == "shared"
    if strategy in ("fedavg", "pfedmoap"):
        return grp == "shared" or (grp == "local" and role != "gating")
    return False


def initial_state(seed, spec, strategy, local_stream):
    """The values every parameter starts with (name -> list of floats), the
    local group from local_stream: the coordinator draws its own with
    stream(INIT, 1), a client with stream(LOCAL, its partition)."""
    shared_rng, local_rng = Rng(seed, stream(INIT, 0)), Rng(seed, local_stream)
    values = {}
    for name, rows, cols, kind, role in registry(spec, strategy in ("pfedmoap", "full")):
        n = rows * cols
        rng = local_rng if group(role, spec.shared, spec.gating_shared) == "local" else shared_rng
        if kind == "gain":
            values[name] = [1.0] * n
        elif kind == "bias":
            values[name] = [0.0] * n
        elif role == "prompt":
            values[name] = rng.fill_uniform(n, f32(0.05))
        elif role == "router":
            values[name] = rng.fill_uniform(n, f32(0.01))
        else:
            values[name] = rng.fill_uniform(n, f32(1.0 / f32(math.sqrt(cols))))
    return values


def first_task(seed, spec, strategy):
    """The `model` and `prompt` tensors' bytes (float32 little-endian) of a
    run's first Task, as docs/protocol.md and docs/model.md define them."""
    values = initial_state(seed, spec, strategy, stream(INIT, 1))
    model = []
    for name, rows, cols, kind, role in registry(spec, strategy in ("pfedmoap", "full")):
        if carried(strategy, group(role, spec.shared, spec.gating_shared), role):
            model += values[name]
    pack = lambda v: struct.pack("<%df" % len(v), *v)
    return pack(model), pack(values["prompt"])
