#!/usr/bin/env python3
"""A minimal fedmoe client in Python, written from docs/protocol.md.

It joins a run over CURVE with its own key, says it has data of its own (so the
coordinator caps its averaging weight), and answers every Task with a valid
Update: the state it was sent, untrained (a zero step), and honest counts. A
client that trains would replace `train()` below; the parameter layout it needs
is in docs/protocol.md.

Needs Debian's python3-zmq and python3-protobuf, and the message module that
protoc makes from the project's proto file:

    protoc --python_out=DIR -I proto proto/fedmoe.proto

usage: fedmoe_client.py --connect tcp://HOST:5555 --id ID --key ID.key \\
                        --server-key coordinator.pub [--pb-dir DIR] [--check-init]
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
TRAIN, VAL, TEST = 120, 30, 40      # the examples of "its own data"
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


def train(model, prompt):
    """One round of local training: here none, the state as it was sent."""
    return model, prompt


def update_for(pb, task):
    model, prompt = train(checked(task.model[0]) if task.model else None,
                          checked(task.global_prompt) if task.HasField("global_prompt") else None)
    u = pb.Update(round=task.round, nonce=task.nonce, train_samples=TRAIN)
    if model is not None:
        u.model.append(tensor(pb, "model", task.model[0].shape, model))
    if prompt is not None:
        u.prompt.CopyFrom(tensor(pb, "prompt", task.global_prompt.shape, prompt))
    # counts as the Hello declared them; accuracy = correct / test examples
    u.metrics.CopyFrom(pb.Metrics(train_loss=0.0, val_loss=0.0, test_loss=0.0, test_accuracy=0.0,
                                  test_samples=TEST, test_correct=0, val_samples=VAL, val_correct=0,
                                  seconds=0.0))
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
    welcome = None
    while True:
        now = time.monotonic()
        if not ready and now - last_hello > HELLO_RETRY_S:
            hello()
            last_hello = now
        if welcomed and now - last_beat > HEARTBEAT_S:
            send(heartbeat=pb.Heartbeat(unix_ms=int(time.time() * 1000)))
            last_beat = now
        if not sock.poll(200):
            continue
        env = pb.Envelope()
        env.ParseFromString(b"".join(sock.recv_multipart()))  # a Task comes in frames
        kind = env.WhichOneof("body")
        if kind == "welcome":
            if not welcomed:  # it has "loaded its data": say so, with the counts
                print("welcomed to run %s (strategy %s), partition %d" %
                      (env.welcome.run_id, env.welcome.strategy, env.welcome.partition_index), flush=True)
                hello(env.welcome.partition_index, counts=True)
                welcome = env.welcome
            welcomed = ready = True
        elif kind == "task":
            if args.check_init and env.task.round == 1 and not check_init(welcome, env.task):
                return 1
            send(update=update_for(pb, env.task))
            rounds += 1
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
