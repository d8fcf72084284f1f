#!/usr/bin/env python3
"""Writes the replay traces in tests/traces/ (docs/spec.md §3).

Deterministic: the same options write the same bytes. Standard library only.

    python3 tools/gen-traces.py [--out DIR] [--only NAME] [--seed N] [--ops N] [--max-bytes B]

With no options it writes the committed traces into tests/traces next to this
script. Each trace is meant for one pool capacity (see CAPACITY below and
tests/traces/README.md), written in its first line ({"op":"meta","capacity":C});
the script prints each trace's op count, peak live bytes and the pressure at
that capacity. Run with --help for the options.
"""

import argparse
import json
import math
import os
import random
import sys

KiB = 1 << 10
MiB = 1 << 20

# The --capacity each trace is replayed with (tests/cli and the README use these).
CAPACITY = {
    "report003": 64 * MiB,
    "oom-expected": 32 * MiB,
    "dequant-pattern": 128 * MiB,
    "mixed-random": 128 * MiB,
    "decode-graph": 64 * MiB,
    "two-devices": 64 * MiB,
}

# The meta line's other fields, for a trace over several devices (each pool gets the capacity).
DEVICES = {
    "two-devices": {"devices": 2, "links": "0-1:nvlink"},
}


class Trace:
    """Collects ops and tracks the live bytes the trace asks for."""

    def __init__(self):
        self.lines = []
        self.live = {}
        self.peak = 0

    def ops(self):
        return sum(1 for line in self.lines if not line.startswith('{"op":"meta"'))

    def op(self, **fields):
        self.lines.append(json.dumps(fields, separators=(",", ":")))

    def alloc(self, id, bytes, stream, expect=None):
        if expect is None:
            self.op(op="alloc", id=id, bytes=bytes, stream=stream)
            self.live[id] = bytes
            self.peak = max(self.peak, sum(self.live.values()))
        else:
            self.op(op="alloc", id=id, bytes=bytes, stream=stream, expect=expect)

    def free(self, id):
        self.op(op="free", id=id)
        self.live.pop(id, None)

    def fill(self, id, stream, seed):
        self.op(op="fill", id=id, stream=stream, seed=seed)

    def upload(self, id, stream, seed):
        self.op(op="upload", id=id, stream=stream, seed=seed)

    def compute(self, inputs, output, stream):
        self.op(op="compute", inputs=inputs, output=output, stream=stream)

    def hold(self, stream):
        self.op(op="hold", stream=stream)

    def release(self, stream):
        self.op(op="release", stream=stream)

    def sync(self, stream=None):
        if stream is None:
            self.op(op="sync")
        else:
            self.op(op="sync", stream=stream)

    def trim(self):
        self.op(op="trim")

    def check(self, id):
        self.op(op="check", id=id)

    def text(self):
        return "\n".join(self.lines) + "\n"


def report003():
    """Report 003's four steps, three times: a transient bound (upload), a kernel
    that reads it queued on a held stream, its handle dropped, an allocation on
    another stream that only fits in the transient's memory; then the
    hold is released and the kernel's output checked. 48 MiB resident of 64."""
    t = Trace()
    for i in range(6):
        t.alloc(f"resident{i}", 8 * MiB, 0)
        t.fill(f"resident{i}", 0, 1000 + i)
    t.sync(0)
    for k in range(3):
        t.hold(1)
        t.alloc(f"transient{k}", 12 * MiB, 1)
        t.upload(f"transient{k}", 1, 2000 + k)
        t.alloc(f"out{k}", 256 * KiB, 1)
        t.compute([f"resident{k}", f"transient{k}"], f"out{k}", 1)
        t.free(f"transient{k}")
        # A stream sync does not help: the kernel is not on any stream yet.
        t.sync(0)
        t.alloc(f"other{k}", 10 * MiB, 2)
        t.fill(f"other{k}", 2, 3000 + k)
        t.release(1)
        t.sync()
        t.check(f"out{k}")
        t.check(f"resident{k}")
        t.check(f"other{k}")
        t.free(f"other{k}")
    t.trim()
    for i in range(6):
        t.check(f"resident{i}")
    for k in range(3):
        t.check(f"out{k}")
    return t


def oom_expected():
    """A live set that does not fit 32 MiB: the allocation that would exceed it
    returns out_of_memory as expected, ops on it are skipped, and every earlier
    live buffer keeps its bytes. So do requests of 2^62 bytes and of 0 bytes."""
    t = Trace()
    t.alloc("a", 10 * MiB, 0)
    t.fill("a", 0, 11)
    t.alloc("b", 10 * MiB, 0)
    t.upload("b", 0, 12)
    t.alloc("c", 8 * MiB, 1)
    t.compute(["a", "b"], "c", 1)
    t.alloc("d", 12 * MiB, 0, expect="oom")
    t.fill("d", 0, 13)
    t.check("d")
    t.alloc("huge", 1 << 62, 1, expect="oom")
    t.alloc("empty", 0, 0, expect="invalid_argument")
    t.check("a")
    t.check("b")
    t.check("c")
    t.sync()
    t.check("a")
    t.check("b")
    t.check("c")
    t.free("d")
    t.free("a")
    t.alloc("d", 12 * MiB, 0)
    t.fill("d", 0, 14)
    t.check("d")
    t.check("b")
    t.check("c")
    for id in ("b", "c", "d"):
        t.free(id)
    return t


def dequant_pattern(seed=260):
    """Report 003's second account: ~260 frozen weights dequantized (uploaded on a
    copy stream) for one matmul each on the compute stream and dropped, forward
    then backward, one weight prefetched ahead, beside an 84 MiB resident set.
    Peak live is ~83% of the 128 MiB capacity."""
    rng = random.Random(seed)
    t = Trace()
    for i in range(20):
        t.alloc(f"frozen{i}", 4 * MiB, 0)
        t.fill(f"frozen{i}", 0, 100 + i)
    for x in ("x0", "x1"):
        t.alloc(x, 2 * MiB, 0)
    t.fill("x0", 0, 7)
    half = [2560 * 2 * rng.randint(1200, 2400) for _ in range(130)]
    sizes = half + half[::-1]  # backward visits the weights in reverse
    n = len(sizes)
    seed = 5000
    t.alloc("w0", sizes[0], 1)
    t.upload("w0", 1, seed)
    cur = "x0"
    for i in range(n):
        if i + 1 < n:
            t.alloc(f"w{i + 1}", sizes[i + 1], 1)
            t.upload(f"w{i + 1}", 1, seed + i + 1)
        nxt = "x1" if cur == "x0" else "x0"
        t.compute([cur, f"w{i}", f"frozen{i % 20}"], nxt, 0)
        t.free(f"w{i}")
        cur = nxt
        if i % 26 == 25:
            t.check(cur)
    t.sync()
    t.check(cur)
    for i in range(20):
        t.check(f"frozen{i}")
    return t


def mixed_random(seed=3, ops=1500, max_bytes=24 * MiB):
    """Random traffic on 3 streams: `ops` steps, sizes log-uniform in
    256 B..max_bytes, live set kept under 96 MiB, fills, uploads, computes across
    streams, frees, holds, syncs, trims and checks."""
    rng = random.Random(seed)
    t = Trace()
    streams = [0, 1, 2]
    budget = 96 * MiB
    live = {}          # id -> bytes
    written = set()
    held = {}          # stream -> ops left before release
    next_id = 0
    seed = 1
    lo, hi = math.log(256), math.log(max_bytes)
    for _ in range(ops):
        for s in list(held):
            held[s] -= 1
            if held[s] <= 0:
                t.release(s)
                del held[s]
        r = rng.random()
        used = sum(live.values())
        if r < 0.25 or len(live) < 3:
            size = int(math.exp(rng.uniform(lo, hi)))
            if used + size > budget:
                r = 0.55  # free instead
            else:
                id = f"m{next_id}"
                next_id += 1
                t.alloc(id, size, rng.choice(streams))
                live[id] = size
                continue
        if r < 0.45:
            id = rng.choice(sorted(live))
            if rng.random() < 0.5:
                t.fill(id, rng.choice(streams), seed)
            else:
                t.upload(id, rng.choice(streams), seed)
            seed += 1
            written.add(id)
        elif r < 0.55 and written:
            ins = rng.sample(sorted(written), k=min(len(written), rng.randint(1, 3)))
            out = rng.choice(sorted(live))
            t.compute(ins, out, rng.choice(streams))
            written.add(out)
        elif r < 0.75:
            id = rng.choice(sorted(live))
            t.free(id)
            del live[id]
            written.discard(id)
        elif r < 0.85:
            t.check(rng.choice(sorted(live)))
        elif r < 0.90:
            if rng.random() < 0.5:
                t.sync(rng.choice(streams))
            else:
                t.sync()
        elif r < 0.97:
            s = rng.choice(streams)
            if s not in held and len(held) < 2:
                t.hold(s)
                held[s] = rng.randint(3, 15)
        else:
            t.trim()
        t.live = dict(live)
        t.peak = max(t.peak, sum(live.values()))
    for s in sorted(held):
        t.release(s)
    t.sync()
    for id in sorted(written):
        t.check(id)
    for id in sorted(live):
        t.free(id)
    return t


def decode_graph(tokens=4):
    """Graph capture (include/ferry/graph.hpp): a decode step captured once on
    stream 1 and replayed per token, and a second step for another batch size
    sharing its private pool; a block freed inside a capture reused by the next
    allocation of that pool; a capture spoiled by a host wait; a replay refused
    (stale_handle) once a block it reads was freed outside it."""
    t = Trace()
    for i in range(4):
        t.alloc(f"w{i}", 8 * MiB, 0)
        t.fill(f"w{i}", 0, 400 + i)
    t.alloc("kv", 4 * MiB, 0)
    t.fill("kv", 0, 500)
    t.alloc("logits", 1 * MiB, 0)
    t.alloc("logits_b2", 1 * MiB, 0)
    t.op(op="wait", stream=1, **{"for": 0})

    t.op(op="capture", phase="begin", graph="decode", stream=1)
    t.alloc("act", 2 * MiB, 1)
    t.compute(["w0", "kv"], "act", 1)
    t.alloc("tmp", 1 * MiB, 1)
    t.compute(["act", "w1"], "tmp", 1)
    t.free("tmp")
    t.alloc("tmp2", 1 * MiB, 1)  # tmp's block, under a new handle
    t.compute(["act", "w2"], "tmp2", 1)
    t.compute(["tmp2", "w3"], "logits", 1)
    t.op(op="user", stream=1, operands=[{"id": "kv", "access": "read_write"}, {"id": "act", "access": "read"}],
         tag="kv-append")
    t.free("tmp2")
    t.op(op="capture", phase="end", graph="decode", stream=1)

    t.op(op="capture", phase="begin", graph="decode_b2", stream=1, pool="decode")
    t.alloc("act_b2", 2 * MiB, 1)
    t.compute(["w0", "kv"], "act_b2", 1)
    t.alloc("tmp_b2", 1 * MiB, 1)  # the shared pool's freed block
    t.compute(["act_b2", "w1"], "tmp_b2", 1)
    t.compute(["tmp_b2", "w3"], "logits_b2", 1)
    t.free("tmp_b2")
    t.op(op="capture", phase="end", graph="decode_b2", stream=1)

    for k in range(tokens):
        t.op(op="replay", graph="decode", stream=1)
        t.op(op="replay", graph="decode_b2", stream=1)
        t.check("logits")
        t.check("logits_b2")
    t.check("kv")

    t.op(op="capture", phase="begin", graph="spoiled", stream=2)
    t.alloc("scratch", 1 * MiB, 2)
    t.fill("scratch", 2, 600)
    t.op(op="sync", stream=2, expect="invalid_argument")
    t.op(op="capture", phase="end", graph="spoiled", stream=2, expect="invalid_argument")
    t.free("scratch")

    t.free("w3")
    t.op(op="replay", graph="decode", stream=1, expect="stale_handle")
    t.op(op="capture", phase="destroy", graph="decode")
    t.op(op="capture", phase="destroy", graph="decode_b2")
    for i in range(3):
        t.check(f"w{i}")
    t.check("kv")
    t.check("logits")
    for id in ("act", "act_b2", "logits", "logits_b2", "kv", "w0", "w1", "w2"):
        t.free(id)
    return t


def two_devices():
    """Two devices (docs/scale.md): an expert on device 1, the activation copied
    to it peer to peer and overwritten on device 0 after a wait across devices
    (stream 2 of device 0 waits for device 1's pull on its stream 0), the expert's
    output copied back to device 0 after another; every op on
    device 1 carries "device":1, every trace line's own waits order the streams
    (it passes under --strict --race-check)."""
    t = Trace()
    d1 = {"device": 1}
    t.alloc("w0", 8 * MiB, 0)
    t.fill("w0", 0, 700)
    t.op(op="alloc", id="e1", bytes=8 * MiB, stream=0, **d1)
    t.op(op="upload", id="e1", stream=0, seed=701, **d1)
    t.alloc("x", 1 * MiB, 0)
    t.fill("x", 0, 702)
    t.op(op="alloc", id="x1", bytes=1 * MiB, stream=0, **d1)
    t.op(op="copy_peer", src="x", dst="x1", stream=0, bytes=1 * MiB)  # ordered after x's fill by copy_peer
    t.op(op="wait", stream=2, **{"for": 0, "for_device": 1})  # x's next write follows device 1's pull of it
    t.fill("x", 2, 703)
    t.op(op="alloc", id="y1", bytes=1 * MiB, stream=0, **d1)
    t.op(op="compute", inputs=["x1", "e1"], output="y1", stream=0, **d1)
    t.alloc("y", 1 * MiB, 1)
    t.op(op="wait", stream=1, **{"for": 0, "for_device": 1})  # the pull of y1 on device 0's stream 1
    t.op(op="wait", stream=1, **{"for": 0}, **d1)  # the source's hash on device 1's stream 1 (verify)
    t.op(op="wait", stream=1, **{"for": 0})  # w0's fill
    t.op(op="copy_peer", src="y1", dst="y", stream=1, bytes=1 * MiB)
    t.alloc("z", 1 * MiB, 1)
    t.compute(["y", "w0"], "z", 1)
    t.op(op="sync", stream=0, **d1)
    t.op(op="trim", **d1)
    t.check("z")
    t.check("y")
    t.check("x")
    for id in ("y1", "x1", "e1"):
        t.op(op="check", id=id, **d1)
    t.sync()
    for id in ("y1", "x1", "e1"):
        t.op(op="free", id=id, **d1)
        t.live.pop(id, None)
    for id in ("w0", "x", "y", "z"):
        t.free(id)
    return t


def byte_size(text):
    """A byte count: digits, optionally followed by KiB, MiB or GiB."""
    units = {"": 1, "B": 1, "KiB": KiB, "MiB": MiB, "GiB": 1 << 30}
    digits = text.rstrip("BKMGikB")
    unit = text[len(digits):]
    if not digits.isdigit() or unit not in units or int(digits) * units[unit] < 256:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte count of at least 256 (e.g. 4096, 64KiB, 24MiB)")
    return int(digits) * units[unit]


def positive(text):
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(
        description="Write the replay traces of tests/traces (docs/spec.md section 3), deterministically.")
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "traces"),
                        help="directory to write into (default: tests/traces next to this script)")
    parser.add_argument("--only", choices=sorted(CAPACITY), action="append",
                        help="write only this trace (repeatable; default: all)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the random traces (default: dequant-pattern 260, mixed-random 3)")
    parser.add_argument("--ops", type=positive, default=1500,
                        help="mixed-random: random steps before the final checks and frees (default 1500)")
    parser.add_argument("--max-bytes", type=byte_size, default=24 * MiB,
                        help="mixed-random: largest allocation, bytes or KiB|MiB|GiB (default 24MiB)")
    args = parser.parse_args(argv)
    makers = {
        "report003": report003,
        "oom-expected": oom_expected,
        "dequant-pattern": lambda: dequant_pattern(*([] if args.seed is None else [args.seed])),
        "mixed-random": lambda: mixed_random(3 if args.seed is None else args.seed, args.ops, args.max_bytes),
        "decode-graph": decode_graph,
        "two-devices": two_devices,
    }
    os.makedirs(args.out, exist_ok=True)
    for name, make in makers.items():
        if args.only and name not in args.only:
            continue
        t = make()
        cap = CAPACITY[name]
        # The meta line: the capacity the trace is meant for, used when replay gets no --capacity.
        t.lines.insert(0, json.dumps({"op": "meta", "capacity": cap, **DEVICES.get(name, {})}, separators=(",", ":")))
        path = os.path.join(args.out, name + ".jsonl")
        with open(path, "w", newline="\n") as f:
            f.write(t.text())
        print(f"{name + '.jsonl':22} {t.ops():5} ops {os.path.getsize(path):7} B  "
              f"peak live {t.peak / MiB:7.2f} MiB  capacity {cap // MiB} MiB  "
              f"pressure {100 * t.peak / cap:.0f}%")


if __name__ == "__main__":
    main()
