#!/usr/bin/env python3
"""Writes PyTorch memory snapshots (the format torch.cuda.memory._dump_snapshot
writes: a pickled dict of segments, device_traces and allocator_settings) from
program shapes that occur in practice, with the figures each file must import to.

A small caching allocator stands in for PyTorch's: requests round up to 512 B,
a freed block is cached on its stream and reused by a later request of the same
stream that fits (within 2x), and a miss maps a new segment (2 MiB for small
requests, the request rounded up to 2 MiB otherwise) with a segment_alloc.

Usage: tools/gen-torch-snapshots.py OUT_DIR [--entries N]   (--help: what it writes)
"""
import argparse
import json
import os
import pickle
import sys

MB2 = 2 << 20


class Allocator:
    def __init__(self, device, base):
        self.device = device
        self.next_addr = base
        self.trace = []
        self.segments = {}   # addr -> [size, stream, blocks: {addr: [size, requested, state, frames]}]
        self.cache = {}      # stream -> [(addr, size, seg)]
        self.live = {}       # addr -> (requested, size, stream, seg)
        self.t = 0
        self.requested = 0
        self.reserved = 0
        self.peak_requested = 0
        self.peak_reserved = 0
        self.allocs = 0
        self.frees = 0
        self.deferred = 0
        self.segment_allocs = 0
        self.streams = []
        self.pending = {}    # addr -> stream that still uses it (record_stream)

    def _entry(self, action, addr, size, stream, frames):
        self.t += 1
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": stream,
                           "time_us": self.t, "frames": frames})

    def alloc(self, size, stream, where):
        frames = [{"filename": where[0], "line": where[1], "name": where[2]}]
        rounded = (size + 511) // 512 * 512
        if stream not in self.streams:
            self.streams.append(stream)
        cached = self.cache.setdefault(stream, [])
        fit = None
        for i, (addr, bsize, seg) in enumerate(cached):
            if rounded <= bsize <= 2 * rounded and (fit is None or bsize < cached[fit][1]):
                fit = i
        if fit is None:
            seg_size = MB2 if rounded <= (1 << 20) else (rounded + MB2 - 1) // MB2 * MB2
            seg = self.next_addr
            self.next_addr += seg_size + MB2
            self.segments[seg] = [seg_size, stream, {}]
            self._entry("segment_alloc", seg, seg_size, stream, frames)
            self.segment_allocs += 1
            self.reserved += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
            addr, bsize = seg, seg_size if seg_size - rounded < 512 else rounded
            if seg_size > bsize:  # the rest of a small segment is cached for later requests
                cached.append((seg + bsize, seg_size - bsize, seg))
        else:
            addr, bsize, seg = cached.pop(fit)
        self.live[addr] = (size, bsize, stream, seg)
        self.segments[seg][2][addr] = [bsize, size, "active_allocated", frames]
        self._entry("alloc", addr, size, stream, frames)
        self.allocs += 1
        self.requested += size
        self.peak_requested = max(self.peak_requested, self.requested)
        return addr

    def free(self, addr, where, used_by=None):
        frames = [{"filename": where[0], "line": where[1], "name": where[2]}]
        size, bsize, stream, seg = self.live[addr]
        self._entry("free_requested", addr, size, stream, frames)
        if used_by is not None:  # record_stream: completed when the using stream is done
            self.pending[addr] = frames
            self.segments[seg][2][addr][2] = "active_awaiting_free"
            return
        self._complete(addr, frames)

    def complete_pending(self):
        for addr, frames in list(self.pending.items()):
            self.deferred += 1
            self._complete(addr, frames)
        self.pending.clear()

    def _complete(self, addr, frames):
        size, bsize, stream, seg = self.live.pop(addr)
        self._entry("free_completed", addr, size, stream, frames)
        self.frees += 1
        self.requested -= size
        del self.segments[seg][2][addr]
        self.cache[stream].append((addr, bsize, seg))

    def oom(self, size, stream):
        self.t += 1
        self.trace.append({"action": "oom", "addr": 0, "size": size, "stream": stream, "time_us": self.t,
                           "device_free": 1 << 20, "frames": []})

    def segments_state(self):
        out = []
        for seg, (size, stream, blocks) in sorted(self.segments.items()):
            bl = [{"address": a, "size": b[0], "requested_size": b[1], "state": b[2], "frames": b[3]}
                  for a, b in sorted(blocks.items())]
            used = sum(b["size"] for b in bl)
            if size > used:
                bl.append({"address": seg + used, "size": size - used, "requested_size": 0,
                           "state": "inactive", "frames": []})
            out.append({"device": self.device, "address": seg, "total_size": size, "allocated_size": used,
                        "active_size": used, "requested_size": sum(b["requested_size"] for b in bl),
                        "stream": stream, "segment_type": "small" if size == MB2 else "large",
                        "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": bl})
        return out

    def figures(self, trace=None, reconstructed=0):
        return {"device": self.device, "events": len(self.trace if trace is None else trace),
                "allocs": self.allocs, "frees": self.frees, "streams": len(self.streams),
                "reconstructed_blocks": reconstructed, "peak_requested_bytes": self.peak_requested,
                "peak_reserved_bytes": self.peak_reserved, "segment_allocs": self.segment_allocs,
                "ooms": sum(1 for e in self.trace if e["action"] == "oom")}


def snapshot(allocators, traces=None):
    return {"segments": [s for a in allocators for s in a.segments_state()],
            "device_traces": traces if traces is not None else [a.trace for a in allocators],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1}}


DEFAULT, COPY, LOAD, EVICT = 0, 0x55d0a1e0, 0x55d0a2f0, 0x55d0a400
MB = 1 << 20


def training(a, steps=3, layers=6, width=4 * MB):
    params = [a.alloc(width, DEFAULT, ("model.py", 10, "__init__")) for _ in range(layers)]
    for step in range(steps):
        acts = [a.alloc(width // 2, DEFAULT, ("model.py", 31, "forward")) for _ in range(layers)]
        grads = []
        for i in reversed(range(layers)):
            grads.append(a.alloc(width, DEFAULT, ("train.py", 55, "backward")))
            a.free(acts[i], ("train.py", 56, "backward"))
        if step == 0:
            state = [a.alloc(2 * width, DEFAULT, ("optim.py", 88, "_init_group")) for _ in range(layers)]
        for g in grads:
            a.free(g, ("optim.py", 120, "zero_grad"))
    return params, state


def decode(a, tokens=24, kv_step=256 * 1024):
    cache = a.alloc(kv_step, DEFAULT, ("generate.py", 40, "prefill"))
    for t in range(tokens):
        logits = a.alloc(64 * 1024, DEFAULT, ("model.py", 200, "lm_head"))
        new = a.alloc(kv_step * (t + 2), DEFAULT, ("generate.py", 71, "torch.cat"))
        a.free(cache, ("generate.py", 71, "torch.cat"))
        cache = new
        a.free(logits, ("generate.py", 75, "sample"))


def moe(a, steps=8, experts=4, size=3 * MB):
    for s in range(steps):
        loaded = [a.alloc(size, COPY, ("moe.py", 30, "load_expert")) for _ in range(experts)]
        out = a.alloc(MB, DEFAULT, ("moe.py", 52, "expert_forward"))
        for e in loaded:  # used on the compute stream: record_stream, freed when it is done
            a.free(e, ("moe.py", 60, "drop_expert"), used_by=DEFAULT)
        a.free(out, ("moe.py", 61, "combine"))
        a.complete_pending()


def streaming(a, layers=10, size=2 * MB + 4096):
    prev = None
    for i in range(layers):
        w = a.alloc(size, LOAD, ("stream.py", 12, "upload_layer"))
        act = a.alloc(MB, DEFAULT, ("stream.py", 20, "run_layer"))
        if prev is not None:
            a.free(prev, ("stream.py", 25, "evict_layer"), used_by=EVICT)
            a.complete_pending()
        scratch = a.alloc(512 * 1024, EVICT, ("stream.py", 30, "offload"))
        a.free(scratch, ("stream.py", 31, "offload"))
        a.free(act, ("stream.py", 21, "run_layer"))
        prev = w


def write(out, name, snap, figures):
    with open(os.path.join(out, name + ".pickle"), "wb") as f:
        pickle.dump(snap, f, protocol=4)
    with open(os.path.join(out, name + ".expect.json"), "w") as f:
        json.dump(figures, f, indent=1, sort_keys=True)
        f.write("\n")


def cut_figures(a, keep):
    """The figures of a's history with only its last `keep` entries, as the importer must see them."""
    kept = a.trace[-keep:]
    dropped = a.trace[:-keep]
    live_before = {}
    for e in dropped:
        if e["action"] == "alloc":
            live_before[e["addr"]] = e["size"]
        elif e["action"] == "free_completed":
            live_before.pop(e["addr"], None)
    requested = sum(live_before.values())
    reserved_before = sum(e["size"] * (1 if e["action"] == "segment_alloc" else -1)
                          for e in dropped if e["action"] in ("segment_alloc", "segment_free"))
    peak_req, peak_res, res = requested, reserved_before, reserved_before
    live, streams, reconstructed, allocs, frees = dict(live_before), [], set(), 0, 0
    alloc_addrs = set()
    for e in kept:
        if e["action"] == "alloc":
            allocs += 1
            live[e["addr"]] = e["size"]
            alloc_addrs.add(e["addr"])
            requested += e["size"]
        elif e["action"] in ("free_requested", "free_completed"):
            if e["addr"] in live_before and e["addr"] not in alloc_addrs:
                reconstructed.add(e["addr"])
            if e["action"] == "free_completed":
                frees += 1
                requested -= live.pop(e["addr"])
        elif e["action"] == "segment_alloc":
            res += e["size"]
        elif e["action"] == "segment_free":
            res -= e["size"]
        peak_req, peak_res = max(peak_req, requested), max(peak_res, res)
        if e["action"] in ("alloc",) or e["addr"] in reconstructed and e["action"] == "free_requested":
            if e["stream"] not in streams:
                streams.append(e["stream"])
    # Blocks alive at the start and never touched by the kept history: from `segments`.
    untouched = [addr for addr in live_before if addr not in reconstructed and addr not in alloc_addrs]
    for addr in untouched:
        for seg in a.segments.values():
            if addr in seg[2] and seg[1] not in streams:
                streams.append(seg[1])
    return {"device": a.device, "events": len(kept), "allocs": allocs, "frees": frees, "streams": len(streams),
            "reconstructed_blocks": len(reconstructed) + len(untouched), "peak_requested_bytes": peak_req,
            "peak_reserved_bytes": peak_res, "segment_allocs": sum(1 for e in kept if e["action"] == "segment_alloc"),
            "ooms": 0}


class Hostile:
    """An object whose unpickling would run a shell command."""
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def hostile(out, marker):
    cmd = "touch " + marker  # a relative path: where the reader ran
    with open(os.path.join(out, "hostile-reduce-top.pickle"), "wb") as f:
        pickle.dump(Hostile(cmd), f, protocol=4)
    a = Allocator(0, 0x7f0000000000)
    decode(a, tokens=2)
    a.trace[1]["frames"][0]["name"] = Hostile(cmd)
    with open(os.path.join(out, "hostile-reduce-frame.pickle"), "wb") as f:
        pickle.dump(snapshot([a]), f, protocol=4)


def malformed(out):
    """Snapshots with one wrong value each, and the words the refusal must say."""
    cases = {}

    def variant(name, change, words):
        a = Allocator(0, 0x7f0000000000)
        decode(a, tokens=2)
        snap = snapshot([a])
        change(snap["device_traces"][0])
        with open(os.path.join(out, name + ".pickle"), "wb") as f:
            pickle.dump(snap, f, protocol=4)
        cases[name] = words

    variant("bad-text-address", lambda t: t[3].update(addr=hex(t[3]["addr"])), "device_traces[0][3].addr: a str")
    variant("bad-negative-size", lambda t: t[3].update(size=-5), "device_traces[0][3].size: negative")
    variant("bad-unknown-action", lambda t: t[4].update(action="teleport"), "device_traces[0][4].action: unknown")
    variant("bad-second-alloc", lambda t: t.insert(3, dict(t[1])), "device_traces[0][3].addr: a second alloc")
    variant("bad-entry-type", lambda t: t.insert(2, [1, 2]), "device_traces[0][2]: a list, not a dict")
    deep = []
    for _ in range(5000):  # Python's own pickler recurses: deeper would need its C stack
        deep = [deep]
    variant("bad-deep-nesting", lambda t: t[1].update(frames=deep), "device_traces[0][1].frames[0]: a list")
    with open(os.path.join(out, "malformed.json"), "w") as f:
        json.dump(cases, f, indent=1, sort_keys=True)
        f.write("\n")


def arguments(argv):
    p = argparse.ArgumentParser(
        prog="gen-torch-snapshots.py",
        description="Writes PyTorch memory snapshots (the pickles torch.cuda.memory._dump_snapshot writes) from "
                    "program shapes that occur in practice, drawn by this script's model of PyTorch's caching "
                    "allocator (not by PyTorch).",
        epilog="Into OUT_DIR: NAME.pickle and NAME.expect.json (the figures `ferry import torch-snapshot` must "
               "report) for training, decode-kv-cache, moe-record-stream, layer-streaming, layer-streaming-cut and "
               "two-devices; the hostile files (hostile-reduce-*.pickle: unpickling them with Python's pickle would "
               "run a command) and the malformed ones (bad-*.pickle, their expected refusals in malformed.json). "
               "tests/snapshots holds what it writes.")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write into (made if missing)")
    p.add_argument("--entries", metavar="N", type=int,
                   help="also write big.pickle, a training loop of N history entries (for bench/import_bench.cpp)")
    args = p.parse_args(argv)
    if args.entries is not None and args.entries < 1:
        p.error("--entries must be at least 1, got %d" % args.entries)
    if args.out_dir.startswith("-"):
        p.error("OUT_DIR %r looks like an option" % args.out_dir)
    return args


def main(argv=None):
    args = arguments(sys.argv[1:] if argv is None else argv)
    sys.setrecursionlimit(50000)
    out = args.out_dir
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        sys.exit("gen-torch-snapshots.py: cannot make %s: %s" % (out, e.strerror))
    a = Allocator(0, 0x7f0000000000)
    training(a)
    write(out, "training", snapshot([a]), a.figures())
    a = Allocator(0, 0x7f0000000000)
    decode(a)
    write(out, "decode-kv-cache", snapshot([a]), a.figures())
    a = Allocator(0, 0x7f0000000000)
    moe(a)
    write(out, "moe-record-stream", snapshot([a]), a.figures())
    a = Allocator(0, 0x7f0000000000)
    streaming(a)
    write(out, "layer-streaming", snapshot([a]), a.figures())
    keep = len(a.trace) * 2 // 3
    write(out, "layer-streaming-cut", snapshot([a], [a.trace[-keep:]]), cut_figures(a, keep))
    a0, a1 = Allocator(0, 0x7f0000000000), Allocator(1, 0x7e0000000000)
    decode(a0, tokens=6)
    training(a1, steps=2)
    write(out, "two-devices", snapshot([a0, a1]), a1.figures())
    hostile(out, "ferry-hostile-ran")
    malformed(out)
    if args.entries is not None:
        n = args.entries
        a = Allocator(0, 0x7f0000000000)
        while len(a.trace) < n:  # a model per pass, freed at its end: the segments stay cached and bounded
            params, state = training(a, steps=1, layers=8)
            for block in params + state:
                a.free(block, ("train.py", 140, "main"))
        with open(os.path.join(out, "big.pickle"), "wb") as f:
            pickle.dump(snapshot([a], [a.trace[:n]]), f, protocol=4)


if __name__ == "__main__":
    main()
