#!/usr/bin/env python3
"""A fedmoe client in Python, written from docs/protocol.md and docs/model.md.

It joins a run over CURVE with its own key, says it has data of its own (so the
coordinator caps its averaging weight), and answers every Task with a valid
Update. With --train it trains: 500 Fashion-MNIST images of its own (240
train, 60 validation, 200 test, drawn by its partition index), the image
model (MLP stem) and the bi-level client step in NumPy (fedmoe_model.py), and
it reports its real losses, accuracy and routing share. Without --train it
sends the state it was sent (a zero step) and zero metrics.

Needs Debian's python3-zmq, python3-protobuf (and python3-numpy for --train),
and the message module that protoc makes from the project's proto file:

    protoc --python_out=DIR -I proto proto/fedmoe.proto

usage: fedmoe_client.py --connect tcp://HOST:5555 --id ID --key ID.key \\
                        --server-key coordinator.pub [--pb-dir DIR] [--check-init] [--train]
Exits 0 when the coordinator says the run is over, 1 when it refuses the client
(or, with --check-init, when the run's first Task is not the state that
fedmoe_init.py draws from the docs).
"""
import argparse
import hashlib
import struct
import sys
import time

PROTOCOL_VERSION = 1
REJECTED, VERSION = 9, 2            # error codes after which a client gives up
TRAIN, VAL, TEST = 240, 60, 200     # the examples of "its own data"
HELLO_RETRY_S, HEARTBEAT_S = 3.0, 1.0


def read_key_file(path):
    """The `name = value` lines of a fedmoe-keygen file (ID.key or ID.pub)."""
    fields = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                name, value = line.split("=", 1)
                fields[name.strip()] = value.strip()
    return fields


def tensor(pb, name, shape, data):
    """A Tensor: float32 little-endian values and their SHA-256."""
    return pb.Tensor(name=name, shape=list(shape), data=data, sha256=hashlib.sha256(data).digest())


def checked(t):
    """The tensor's data after the checks every receiver makes."""
    n = 1
    for d in t.shape:
        n *= d
    if len(t.data) != 4 * n or hashlib.sha256(t.data).digest() != t.sha256:
        raise ValueError("tensor %r: wrong length or digest" % t.name)
    for (v,) in struct.iter_unpack("<f", t.data):
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError("tensor %r: a value is not finite" % t.name)
    return t.data


class Untrained:
    """A client that does not train: its Update is the state it was sent."""

    def round(self, task, beat):
        model = checked(task.model[0]) if task.model else None
        prompt = checked(task.global_prompt) if task.HasField("global_prompt") else None
        idx = TEST if task.eval_sample <= 0 else min(TEST, task.eval_sample)
        idv = VAL if task.eval_sample <= 0 else min(VAL, task.eval_sample)
        return model, prompt, dict(train_loss=0.0, val_loss=0.0, test_loss=0.0, test_accuracy=0.0,
                                   test_samples=idx, test_correct=0, val_samples=idv, val_correct=0,
                                   generalist_share=0.0)


class Trained:
    """A client that trains the image model on data of its own (fedmoe_model.py)."""

    def __init__(self, welcome):
        import numpy as np
        import fedmoe_model as fm
        self.np, self.fm = np, fm
        spec = welcome.model
        if spec.family not in ("", "image") or spec.stem not in ("", "mlp"):
            raise SystemExit("--train: this client trains the image model with the mlp stem only")
        # its own data: 500 of the train file's images, drawn by its partition index
        pick = np.random.default_rng(1000 + welcome.partition_index).permutation(60000)[:TRAIN + VAL + TEST]
        x, y = fm.fashion_mnist(pick)
        self.data = {"train": (x[:TRAIN], y[:TRAIN]), "val": (x[TRAIN:TRAIN + VAL], y[TRAIN:TRAIN + VAL]),
                     "test": (x[TRAIN + VAL:], y[TRAIN + VAL:])}
        self.model = fm.Model(spec, welcome.strategy, welcome.seed, welcome.partition_index)
        self.trainer = fm.Trainer(self.model, welcome.train, welcome.seed + welcome.partition_index)
        self.rows, self.cols = spec.prompt_len, spec.prompt_dim

    def _prompt(self, t):
        return self.np.frombuffer(checked(t), dtype="<f4").reshape(self.rows, self.cols).astype(self.np.float32)

    def round(self, task, beat):
        fm, m = self.fm, self.model
        if task.model:
            m.unpack(checked(task.model[0]))
        if task.HasField("global_prompt"):
            m.p["prompt"] = self._prompt(task.global_prompt)
        nonlocal_prompts = [self._prompt(t) for t in task.nonlocal_prompts]
        scale = task.lr_scale if task.lr_scale > 0 else 1.0
        train_loss, val_loss = self.trainer.round(self.data, nonlocal_prompts, scale, beat)
        test_loss, correct, n, share = fm.evaluate(m, *self.data["test"], nonlocal_prompts, task.eval_sample)
        _, vcorrect, vn, _ = fm.evaluate(m, *self.data["val"], nonlocal_prompts, task.eval_sample)
        prompt = m.p["prompt"].astype("<f4").tobytes() if task.HasField("global_prompt") else None
        print("round %d: train loss %.4f, test loss %.4f, test accuracy %.2f%% (%d of %d), generalist share %.3f" %
              (task.round, train_loss, test_loss, 100.0 * correct / n, correct, n, share), flush=True)
        return m.pack(), prompt, dict(train_loss=train_loss, val_loss=val_loss, test_loss=test_loss,
                                      test_accuracy=correct / n, test_samples=n, test_correct=correct,
                                      val_samples=vn, val_correct=vcorrect, generalist_share=share)


def update_for(pb, task, client, beat):
    t0 = time.monotonic()
    model, prompt, metrics = client.round(task, beat)
    u = pb.Update(round=task.round, nonce=task.nonce, train_samples=TRAIN)
    if model is not None:
        u.model.append(tensor(pb, "model", task.model[0].shape, model))
    if prompt is not None:
        u.prompt.CopyFrom(tensor(pb, "prompt", task.global_prompt.shape, prompt))
    # counts as the Hello declared them (or eval_sample's); accuracy = correct / test examples
    u.metrics.CopyFrom(pb.Metrics(seconds=time.monotonic() - t0, **metrics))
    return u


def check_init(welcome, task):
    """Round 1's Task against the initial state drawn from the docs alone."""
    import fedmoe_init
    model, prompt = fedmoe_init.first_task(welcome.seed, welcome.model, welcome.strategy)
    got_model = task.model[0].data if task.model else b""
    got_prompt = task.global_prompt.data if task.HasField("global_prompt") else b""
    for what, want, got in (("model", model, got_model), ("prompt", prompt, got_prompt)):
        if want != got:
            n = min(len(want), len(got)) // 4
            first = next((i for i in range(n) if want[4 * i:4 * i + 4] != got[4 * i:4 * i + 4]), n)
            print("initial state: the Task's %s differs from the docs' draw (%d and %d values; first at %d)" %
                  (what, len(got) // 4, len(want) // 4, first), flush=True)
            return False
    print("initial state: round 1's Task is the docs' draw, bit for bit (%s: model %d values, prompt %d)" %
          (welcome.strategy, len(model) // 4, len(prompt) // 4), flush=True)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connect", required=True)
    ap.add_argument("--id", required=True)
    ap.add_argument("--key", required=True, help="this client's key pair file (fedmoe-keygen)")
    ap.add_argument("--server-key", required=True, help="the coordinator's .pub file")
    ap.add_argument("--pb-dir", help="where protoc wrote fedmoe_pb2.py")
    ap.add_argument("--check-init", action="store_true",
                    help="check that round 1's Task is the initial state drawn from the docs (fedmoe_init.py)")
    ap.add_argument("--train", action="store_true",
                    help="train the image model on 500 Fashion-MNIST images of its own (NumPy)")
    args = ap.parse_args()
    if args.pb_dir:
        sys.path.insert(0, args.pb_dir)
    import fedmoe_pb2 as pb
    import zmq

    mine, server = read_key_file(args.key), read_key_file(args.server_key)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = server["public"].encode()
    sock.curve_publickey = mine["public"].encode()
    sock.curve_secretkey = mine["secret"].encode()
    sock.connect(args.connect)

    def send(**body):
        sock.send(pb.Envelope(protocol_version=PROTOCOL_VERSION, **body).SerializeToString())

    def hello(partition=-1, counts=False):
        h = pb.Hello(client_id=args.id, protocol_version=PROTOCOL_VERSION, specialists=2,
                     partition_index=partition)
        if counts:
            h.train_samples, h.val_samples, h.test_samples, h.own_data = TRAIN, VAL, TEST, True
        send(hello=h)

    hello()
    welcomed = ready = False
    last_hello = last_beat = time.monotonic()
    rounds = 0
    welcome = client = None
    answered = {}  # (round, nonce) -> its Update: a Task sent again gets the same one

    def beat():
        """A heartbeat when one is due (also between training steps)."""
        nonlocal last_beat
        if time.monotonic() - last_beat > HEARTBEAT_S:
            send(heartbeat=pb.Heartbeat(unix_ms=int(time.time() * 1000)))
            last_beat = time.monotonic()
    while True:
        now = time.monotonic()
        if not ready and now - last_hello > HELLO_RETRY_S:
            hello()
            last_hello = now
        if welcomed:
            beat()
        if not sock.poll(200):
            continue
        env = pb.Envelope()
        env.ParseFromString(b"".join(sock.recv_multipart()))  # a Task comes in frames
        kind = env.WhichOneof("body")
        if kind == "welcome":
            if not welcomed:  # it has "loaded its data": say so, with the counts
                print("welcomed to run %s (strategy %s), partition %d" %
                      (env.welcome.run_id, env.welcome.strategy, env.welcome.partition_index), flush=True)
                welcome = env.welcome
                client = Trained(welcome) if args.train else Untrained()
                hello(env.welcome.partition_index, counts=True)
            welcomed = ready = True
        elif kind == "task":
            if args.check_init and env.task.round == 1 and not check_init(welcome, env.task):
                return 1
            key = (env.task.round, env.task.nonce)
            if key not in answered:
                answered = {key: update_for(pb, env.task, client, beat)}
                rounds += 1
            send(update=answered[key])
            print("round %d: update sent" % env.task.round, flush=True)
        elif kind == "error":
            print("coordinator error %d: %s" % (env.error.code, env.error.text), flush=True)
            if env.error.code in (REJECTED, VERSION):
                return 1
        elif kind == "shutdown":
            print("shut down after %d rounds: %s" % (rounds, env.shutdown.reason), flush=True)
            return 0


if __name__ == "__main__":
    sys.exit(main())
