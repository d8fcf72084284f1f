"""ferry.Graph on the sim: Runtime.begin_capture / end_capture, Graph.launch and
destroy over the C ABI's graph capture (include/ferry/graph.hpp)."""
import gc
import json
import weakref

import pytest

import ferry
from conftest import MiB


def _add_one(ctx):
    ctx.views[0][0] = (ctx.views[0][0] + 1) % 256


def test_a_captured_launch_runs_its_callable_at_every_replay(rt):
    h = rt.alloc(4096)
    rt.upload(h, bytes(4096))
    rt.begin_capture(1)
    rt.launch(1, [(h, "rw")], _add_one)
    graph = rt.end_capture(1)
    assert rt.download(h, 1) == b"\x00"  # recorded, not run
    for _ in range(5):
        graph.launch(1)
    rt.synchronize()
    assert rt.download(h, 1) == b"\x05"
    graph.destroy()
    graph.destroy()  # idempotent
    assert graph.destroyed
    with pytest.raises(ferry.InvalidArgumentError, match="destroyed"):
        graph.launch(1)


def test_a_block_freed_outside_the_graph_refuses_the_replay(rt):
    h = rt.alloc(4096)
    rt.begin_capture(0)
    rt.launch(0, [(h, "w")], lambda ctx: None)
    with rt.end_capture(0) as graph:
        graph.launch(0)
        rt.free(h)
        with pytest.raises(ferry.StaleHandleError, match="freed outside it"):
            graph.launch(0)
    assert graph.destroyed


def test_what_cannot_be_captured_spoils_the_capture(rt):
    h = rt.alloc(4096)
    rt.begin_capture(0)
    with pytest.raises(ferry.InvalidArgumentError, match="capturing stream 0 is refused"):
        rt.download(h, 16)
    with pytest.raises(ferry.InvalidArgumentError, match="spoiled"):
        rt.end_capture(0)
    with pytest.raises(ferry.InvalidArgumentError, match="not capturing"):
        rt.end_capture(0)


def test_graphs_share_a_private_pool_and_close_destroys_them():
    with ferry.Runtime() as rt:
        rt.begin_capture(0)
        a = rt.alloc(MiB, 0)
        rt.launch(0, [(a, "w")], lambda ctx: None)
        rt.free(a)  # the pool's until its last graph goes
        first = rt.end_capture(0)
        rt.begin_capture(0, pool=first)
        b = rt.alloc(MiB, 0)  # the block `a` had, under a new handle
        rt.launch(0, [(b, "w")], lambda ctx: None)
        second = rt.end_capture(0)
        assert b != a
        with pytest.raises(ferry.StaleHandleError):
            rt.free(a)
        summary = rt.memory_summary()
        assert "graph pool 1: 1 block(s)" in summary and "2 graph(s)" in summary
        with pytest.raises(ferry.InvalidArgumentError, match="not a ferry.Graph"):
            rt.begin_capture(1, pool="first")
    assert first.destroyed and second.destroyed


class _CountingAddOne:
    """_add_one as an object, so a test can see when ferry's side lets it go."""

    def __init__(self):
        self.calls = 0

    def __call__(self, ctx):
        self.calls += 1
        _add_one(ctx)


def test_replays_in_flight_run_after_destroy_until_synchronize(rt):
    h = rt.alloc(4096)
    rt.upload(h, bytes(4096), stream=1)
    fn = _CountingAddOne()
    rt.begin_capture(1)
    rt.launch(1, [(h, "rw")], fn)
    graph = rt.end_capture(1)
    for _ in range(4):
        graph.launch(1)
    gone = weakref.ref(fn)
    del fn
    graph.destroy()  # the sim runs the callables at completion: during synchronize
    rt.synchronize()
    assert rt.download(h, 1, stream=1) == b"\x04"
    gc.collect()
    assert gone() is None  # dropped once the replays before the synchronize completed


def test_uploads_copies_launches_and_record_use_are_captured():
    with ferry.Runtime(integrity="off") as rt:
        src, dst = rt.alloc(4096), rt.alloc(4096)
        rt.upload(dst, bytes(4096), stream=0)
        data = bytearray(b"\x05" * 4096)
        rt.begin_capture(0)
        rt.upload(src, data, stream=0)
        data[:] = b"\x09" * 4096  # the graph reads the copy it took
        rt.launch(0, [(src, "rw")], _add_one)
        rt.copy_peer(dst, src, 4096, stream=0)
        rt.record_use(0, [src, dst])
        graph = rt.end_capture(0)
        assert rt.download(dst, 4096, stream=0) == bytes(4096)  # recorded, not run
        for _ in range(3):
            graph.launch(0)
        graph.destroy()
        del data
        gc.collect()
        rt.synchronize()
        assert rt.download(dst, 4096, stream=0) == b"\x06" + b"\x05" * 4095


def test_a_verified_upload_and_a_copy_across_devices_spoil_the_capture():
    with ferry.Runtime(devices=2) as rt:  # integrity verify
        a, b = rt.alloc(4096), rt.alloc(4096, device=1)
        rt.begin_capture(0)
        with pytest.raises(ferry.InvalidArgumentError, match="integrity policy is verify"):
            rt.upload(a, bytes(4096), stream=0)
        with pytest.raises(ferry.InvalidArgumentError, match="spoiled"):
            rt.end_capture(0)
        rt.begin_capture(0)
        with pytest.raises(ferry.InvalidArgumentError, match="copy_peer across devices on capturing stream 0"):
            rt.copy_peer(b, a, 4096, stream=0)
        with pytest.raises(ferry.InvalidArgumentError, match="spoiled"):
            rt.end_capture(0)
        rt.upload(a, bytes(4096), stream=1)  # another stream runs as before


def test_a_recorded_capture_is_written_as_capture_and_replay_lines(tmp_path):
    """ferry_trace_start over a program that captures: the trace holds the capture's
    calls once, between its begin and end lines, and one replay line per launch
    (the recorder sits in front of the capture, include/ferry/trace_recorder.hpp)."""
    with ferry.Runtime(profile="tiny") as rt:
        trace = tmp_path / "graph.jsonl"
        rt.trace_start(str(trace))
        kv = rt.alloc(4096)
        rt.upload(kv, bytes(4096), stream=1)
        rt.begin_capture(1)
        act = rt.alloc(4096, 1)
        rt.launch(1, [(act, "w")], lambda ctx: None)
        rt.launch(1, [(kv, "rw"), (act, "r")], _add_one)
        rt.free(act)  # deferred: the graph's pool keeps it
        graph = rt.end_capture(1)
        for _ in range(3):
            graph.launch(1)
        rt.synchronize()
        graph.destroy()
        assert rt.download(kv, 1, stream=1) == bytes([3])
        rt.free(kv)
        rt.trace_stop()
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    ops = [line["op"] + (" " + line["phase"] if line["op"] == "capture" else "") for line in lines]
    assert ops == ["meta", "alloc", "upload", "capture begin", "alloc", "user", "user", "free", "capture end",
                   "replay", "replay", "replay", "sync", "capture destroy", "check", "free"]
    assert lines[3] == {"op": "capture", "phase": "begin", "graph": "g1", "stream": 1}
    assert lines[6]["operands"] == [{"id": "b1", "access": "read_write"}, {"id": "b2", "access": "read"}]
    assert all(line == {"op": "replay", "graph": "g1", "stream": 1} for line in lines[9:12])
    assert lines[13] == {"op": "capture", "phase": "destroy", "graph": "g1"}


def test_recording_refuses_to_start_inside_a_capture(tmp_path):
    """A capture begun before recording cannot be written (its calls so far were
    not seen): ferry_trace_start refuses, naming the stream."""
    with ferry.Runtime(profile="tiny") as rt:
        rt.begin_capture(2)
        with pytest.raises(ferry.InvalidArgumentError, match="stream 2 is capturing"):
            rt.trace_start(str(tmp_path / "t.jsonl"))
        rt.end_capture(2).destroy()
        rt.trace_start(str(tmp_path / "t.jsonl"))
        rt.trace_stop()
