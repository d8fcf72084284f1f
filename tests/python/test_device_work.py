"""Runtime.fill, Runtime.compute and Runtime.copy_to_host on the sim (ferry.h
"ferry's own device work"): their bytes, the host buffer ferry holds while it
may still be written, and a graph capturing them with a launch, replayed."""
import json

import numpy as np
import pytest

import ferry

N = 4096


def _reference(rt, seed):
    """The bytes of compute([fill(seed)]) made uncaptured, downloaded."""
    a, b = rt.alloc(N), rt.alloc(N)
    rt.fill(a, seed)
    rt.compute([a], b, flops=1e6, mem_bytes=N)
    out = rt.download(b)
    rt.free(a)
    rt.free(b)
    return out


def test_fill_is_deterministic_per_seed_and_compute_reads_every_input(rt):
    a, b, c = rt.alloc(N), rt.alloc(N), rt.alloc(N)
    rt.fill(a, 7)
    rt.fill(b, 7)
    rt.fill(c, 8)
    assert rt.download(a) == rt.download(b)
    assert rt.download(a) != rt.download(c)
    assert _reference(rt, 7) == _reference(rt, 7)
    assert _reference(rt, 7) != _reference(rt, 8)
    out1, out2 = rt.alloc(N), rt.alloc(N)
    rt.compute([a, c], out1)
    rt.compute([a, b], out2)
    assert rt.download(out1) != rt.download(out2)


def test_copy_to_host_writes_at_completion_and_holds_the_buffer_until_synchronize(rt):
    h = rt.alloc(N)
    rt.fill(h, 3)
    arr = np.full(N, 0xEE, dtype=np.uint8)
    rt.copy_to_host(h, arr)
    assert arr[0] == 0xEE and arr[-1] == 0xEE  # not yet: the sim's clock has not moved
    held = bytearray(N)
    rt.copy_to_host(h, held)
    with pytest.raises(BufferError):
        held.extend(b"x")  # ferry holds it: not resizable while it may be written
    rt.synchronize()
    assert arr.tobytes() == rt.download(h)
    assert bytes(held) == rt.download(h)
    held.extend(b"x")  # released by the synchronize


def test_copy_to_host_refusals(rt):
    h = rt.alloc(N)
    with pytest.raises(ferry.InvalidArgumentError, match="dst holds 4095 bytes, the block 4096"):
        rt.copy_to_host(h, bytearray(N - 1))
    with pytest.raises(ferry.InvalidArgumentError, match="writable"):
        rt.copy_to_host(h, bytes(N))
    with pytest.raises(ferry.InvalidArgumentError, match="stream"):
        rt.copy_to_host(h, bytearray(N), stream=64)
    with pytest.raises(ferry.InvalidArgumentError, match="stream"):
        rt.fill(h, 1, stream=64)
    rt.free(h)
    with pytest.raises(ferry.StaleHandleError):
        rt.copy_to_host(h, bytearray(N))
    with pytest.raises(ferry.StaleHandleError):
        rt.fill(h, 1)
    live = rt.alloc(N)
    with pytest.raises(ferry.StaleHandleError):
        rt.compute([h], live)
    with pytest.raises(ferry.StaleHandleError):
        rt.compute([live], h)
    with pytest.raises(ferry.InvalidArgumentError, match="flops"):
        rt.compute([live], live, flops="many")
    rt.synchronize()


def _accumulate(ctx):
    src, acc = ctx.views
    for i in range(len(acc)):
        acc[i] = (acc[i] + 1 + src[i]) % 256


def test_a_graph_of_fill_compute_launch_and_copy_to_host_replays_with_the_right_bytes(rt):
    n = 256  # the callable works byte by byte in Python
    ref_a, ref_b = rt.alloc(n), rt.alloc(n)
    rt.fill(ref_a, 7)
    rt.compute([ref_a], ref_b)
    ref = np.frombuffer(rt.download(ref_b), dtype=np.uint8)
    acc = rt.alloc(n)
    rt.upload(acc, bytes(n))
    host_acc = np.zeros(n, dtype=np.uint8)
    host_b = bytearray(n)

    rt.begin_capture(1)
    a, b = rt.alloc(n, 1), rt.alloc(n, 1)  # the graph's private pool
    rt.fill(a, 7, stream=1)
    rt.compute([a], b, stream=1)
    rt.launch(1, [(b, "r"), (acc, "rw")], _accumulate)
    rt.copy_to_host(acc, host_acc, stream=1)
    rt.copy_to_host(b, host_b, stream=1)
    rt.free(a)
    rt.free(b)
    graph = rt.end_capture(1)
    rt.synchronize()
    assert not host_acc.any()  # recorded, not run
    for k in range(1, 51):
        host_acc[:] = 0xEE
        graph.launch(1)
        rt.synchronize()
        assert bytes(host_b) == ref.tobytes()
        assert (host_acc == ((k * (1 + ref.astype(np.uint32))) % 256).astype(np.uint8)).all(), k
    with pytest.raises(BufferError):
        host_b.extend(b"x")  # the graph's while it lives
    graph.destroy()
    with pytest.raises(BufferError):
        host_b.extend(b"x")  # until a synchronize after destroy: a replay may still write it
    rt.synchronize()
    host_b.extend(b"x")


def test_a_spoiled_capture_lets_its_buffers_go(rt):
    h = rt.alloc(N)
    out = bytearray(N)
    rt.begin_capture(0)
    rt.copy_to_host(h, out)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.download(h, 16)
    with pytest.raises(ferry.InvalidArgumentError, match="spoiled"):
        rt.end_capture(0)
    out.extend(b"x")


def test_each_call_acts_on_the_device_its_handle_names():
    with ferry.Runtime(profile="tiny", capacity=8 << 20, devices=2) as rt:
        on1 = rt.alloc(N, device=1)
        rt.fill(on1, 5)
        other = rt.alloc(N, device=1)
        rt.compute([on1], other)
        out = np.zeros(N, dtype=np.uint8)
        rt.copy_to_host(other, out)
        rt.synchronize(device=1)
        assert out.tobytes() == rt.download(other, N)
        on0 = rt.alloc(N)
        with pytest.raises(ferry.StaleHandleError):
            rt.compute([on0], other)  # device 0's block in device 1's kernel


def test_the_trace_writes_fill_compute_and_check_lines(rt, tmp_path):
    path = tmp_path / "work.jsonl"
    rt.trace_start(path)
    a, b = rt.alloc(N), rt.alloc(N)
    rt.fill(a, 3)
    rt.compute([a], b)
    rt.copy_to_host(b, bytearray(N))
    rt.synchronize()
    rt.trace_stop()
    ops = [json.loads(line).get("op") for line in path.read_text().splitlines()]
    assert ops.count("fill") == 1 and ops.count("compute") == 1 and ops.count("check") == 1


def test_trace_start_refuses_a_runtime_of_several_devices(tmp_path):
    """The recorder writes device 0's calls only (docs/scale.md): a two-device
    runtime's trace would miss device 1's work, so it is refused and nothing is written."""
    path = tmp_path / "two.jsonl"
    with ferry.Runtime(profile="tiny", devices=2) as rt:
        with pytest.raises(ferry.UnsupportedError, match="drives 2 devices"):
            rt.trace_start(path)
    assert not path.exists()
