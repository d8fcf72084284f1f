"""ferry.Runtime on the sim: every function of the C ABI through ctypes, its errors,
the launch callable, numpy buffers, and reports 000 and 003."""
import ctypes
import dataclasses
import json
import os
import re
import threading

import numpy as np
import pytest

import ferry
from conftest import MiB, REPO

POOL_KEYS = {"allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
             "pending_free_bytes", "allocs", "frees", "ooms", "reclaims", "internal_allocs", "internal_frees"}
INTEGRITY_KEYS = {"bytes_moved", "bytes_verified", "mismatches", "retries", "fallbacks"}
CACHE_KEYS = {"hits", "misses", "evictions", "uploads", "bytes_uploaded", "prefetches"}


def pattern(n, seed=0):
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


# ---- the module -----------------------------------------------------------------

def test_versions_and_status_names():
    # One version: CMakeLists.txt's project(VERSION) (ctest passes it), the library's and the package's.
    project = os.environ.get("FERRY_PROJECT_VERSION")
    if project is None:
        with open(os.path.join(REPO, "CMakeLists.txt")) as f:
            project = re.search(r"project\(ferry VERSION ([0-9.]+)", f.read()).group(1)
    assert ferry.library_version() == ferry.__version__ == project
    assert ferry.status_name(0) == "ok"
    assert ferry.status_name(1) == "out_of_memory"


def test_every_mirror_struct_has_the_librarys_size():
    loaded = ferry._lib.lib()  # loading checked them already; this says which ones
    assert set(ferry._lib.MIRRORS) >= {"ferry_runtime_options", "ferry_pool_stats", "ferry_integrity_stats",
                                       "ferry_cache_stats", "ferry_race", "ferry_launch_context"}
    for name, mirror in ferry._lib.MIRRORS.items():
        assert loaded.ferry_struct_size(name.encode()) == ctypes.sizeof(mirror), name
    assert loaded.ferry_struct_size(b"ferry_no_such_struct") == 0


class _ShortPoolStats(ctypes.Structure):
    """ferry_pool_stats as a mirror copied from another header would have it."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("allocated_bytes", ctypes.c_uint64)]


def test_a_mirror_of_the_wrong_size_is_refused_when_the_library_loads(monkeypatch):
    with pytest.raises(OSError, match=r"ferry_pool_stats in \d+ bytes, this package's mirror \(_ShortPoolStats\) "
                                      r"in 16: the library .* different versions of ferry.h"):
        ferry._lib.check_mirrors(ferry._lib.lib(), {"ferry_pool_stats": _ShortPoolStats})
    # And lib() itself refuses to hand out such a library.
    monkeypatch.setattr(ferry._lib, "_lib", None)
    monkeypatch.setitem(ferry._lib.MIRRORS, "ferry_pool_stats", _ShortPoolStats)
    with pytest.raises(OSError, match="ferry_pool_stats"):
        ferry._lib.lib()


def test_stats_structs_carry_their_size():
    for cls in (ferry._lib.PoolStats, ferry._lib.IntegrityStats, ferry._lib.CacheStats, ferry._lib.RuntimeOptions):
        assert cls._fields_[0][0] == "struct_size" and cls().struct_size == ctypes.sizeof(cls)


def test_stats_getters_pass_the_mirrors_size(rt):
    # The package calls the ..._sized functions: the mirror's struct_size need not be set.
    loaded = ferry._lib.lib()
    for name, cls in (("pool", ferry._lib.PoolStats), ("integrity", ferry._lib.IntegrityStats)):
        out = cls()
        out.struct_size = 0
        sized = getattr(loaded, "ferry_get_%s_stats_sized" % name)
        assert sized(rt._live(), ctypes.byref(out), ctypes.sizeof(out)) == ferry._lib.OK, name
        assert out.struct_size == ctypes.sizeof(cls), name
        # The unsized symbol reads struct_size from the struct: 0 is refused.
        out.struct_size = 0
        assert getattr(loaded, "ferry_get_%s_stats" % name)(rt._live(), ctypes.byref(out)) == \
            ferry.InvalidArgumentError.status, name
        assert ferry._lib.as_dict(out) == getattr(rt, name + "_stats")(), name


def test_every_error_is_a_ferry_error_with_its_status():
    expected = {ferry.OutOfMemoryError: 1, ferry.StaleHandleError: 2, ferry.InvalidArgumentError: 3,
                ferry.TransferCorruptError: 4, ferry.BackendError: 5, ferry.UnsupportedError: 6,
                ferry.FerryTimeoutError: 7}
    for cls, status in expected.items():
        assert issubclass(cls, ferry.Error)
        e = cls("why")
        assert e.status == status and str(e) == "why"
    assert issubclass(ferry.FerryTimeoutError, TimeoutError)
    assert issubclass(ferry.InvalidArgumentError, ValueError)
    assert issubclass(ferry.OutOfMemoryError, MemoryError)


def test_handle_is_a_frozen_value():
    h = ferry.Handle(1, 2, 3)
    assert (h.pool, h.slot, h.generation) == (1, 2, 3)
    assert h == ferry.Handle(1, 2, 3) and hash(h) == hash(ferry.Handle(1, 2, 3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.slot = 4
    assert not ferry.Handle() and h
    c = h._as_c()
    assert (c.pool, c.slot, c.generation) == (1, 2, 3)


# ---- the runtime's lifetime and options -----------------------------------------

def test_context_manager_closes_and_a_closed_runtime_refuses():
    with ferry.Runtime(profile="tiny") as rt:
        assert not rt.closed
        rt.alloc(4096)
    assert rt.closed
    with pytest.raises(ferry.InvalidArgumentError, match="closed"):
        rt.alloc(4096)
    rt.close()  # idempotent


def test_close_destroys_with_work_in_flight():
    rt = ferry.Runtime(profile="tiny")
    h = rt.alloc(MiB)
    ran = []
    rt.hold(0)
    rt.launch(0, [(h, "w")], lambda ctx: ran.append(True))
    rt.close()  # waits for the runtime's work: the held launch runs
    assert ran == [True]


@pytest.mark.parametrize("options, match", [
    ({"profile": "no-such-gpu"}, "no-such-gpu"),
    ({"integrity": "sometimes"}, "sometimes"),
    ({"inject": "gremlins"}, "gremlins"),
    ({"backend": "tpu"}, "tpu"),
    ({"capacity": -1}, "capacity"),
    ({"profile": 7}, "profile"),
])
def test_bad_options_are_invalid_arguments(options, match):
    with pytest.raises(ferry.InvalidArgumentError, match=match) as e:
        ferry.Runtime(**options)
    assert e.value.status == 3


def test_cuda_without_a_gpu_is_unsupported():
    try:
        rt = ferry.Runtime(backend="cuda")
    except ferry.UnsupportedError as e:
        assert e.status == 6 and str(e)
        return
    rt.close()
    pytest.skip("this machine has a GPU")


def test_faults_asked_of_cuda_are_invalid():
    with pytest.raises((ferry.InvalidArgumentError, ferry.UnsupportedError)):
        ferry.Runtime(backend="cuda", inject="pinned-noop")


# ---- device memory -----------------------------------------------------------------

def test_alloc_free_and_device_address(rt):
    h = rt.alloc(MiB + 3, stream=2)
    assert isinstance(h, ferry.Handle) and h
    addr, nbytes = rt.device_address(h)
    assert addr != 0 and nbytes == MiB + 3
    stats = rt.pool_stats()
    assert set(stats) == POOL_KEYS and stats["allocated_bytes"] >= MiB
    rt.free(h)
    assert rt.pool_stats()["frees"] >= 1


def test_stale_handles_are_refused(rt):
    h = rt.alloc(4096)
    rt.free(h)
    for call in (lambda: rt.free(h), lambda: rt.device_address(h), lambda: rt.upload(h, b"x"),
                 lambda: rt.download(h, 1), lambda: rt.record_use(0, [h]),
                 lambda: rt.launch(0, [(h, "r")], lambda ctx: None)):
        with pytest.raises(ferry.StaleHandleError) as e:
            call()
        assert e.value.status == 2 and "stale" in str(e.value)
    forged = ferry.Handle(h.pool, h.slot + 100, 1)
    with pytest.raises(ferry.StaleHandleError):
        rt.free(forged)
    with pytest.raises(ferry.StaleHandleError):
        rt.free(ferry.Handle())


def test_a_handle_of_another_runtime_is_stale(rt, tiny):
    h = tiny.alloc(4096)
    with pytest.raises(ferry.StaleHandleError):
        rt.device_address(h)


@pytest.mark.parametrize("nbytes, stream", [(0, 0), (-1, 0), (4096, 64), (4096, -1), (1.5, 0), ("8", 0)])
def test_bad_alloc_arguments_are_invalid(rt, nbytes, stream):
    with pytest.raises(ferry.InvalidArgumentError):
        rt.alloc(nbytes, stream)


def test_out_of_memory_carries_the_diagnostic(tiny):
    keep = tiny.alloc(6 * MiB)
    with pytest.raises(ferry.OutOfMemoryError) as e:
        tiny.alloc(4 * MiB)
    message = str(e.value)
    assert e.value.status == 1
    for word in ("capacity", "reserved", "live", "pending-free"):
        assert word in message, message
    assert tiny.pool_stats()["ooms"] == 1
    assert tiny.device_address(keep)[1] == 6 * MiB  # the live block is untouched


def test_trim_releases_cached_memory(tiny):
    h = tiny.alloc(2 * MiB)
    tiny.free(h)
    tiny.synchronize()
    tiny.trim()
    assert tiny.pool_stats()["reserved_bytes"] <= tiny.pool_stats()["peak_reserved_bytes"]
    assert tiny.pool_stats()["pending_free_bytes"] == 0


# ---- transfers -----------------------------------------------------------------------

def test_upload_download_round_trip_of_every_buffer_kind(rt):
    h = rt.alloc(4096)
    data = pattern(4096)
    for buf in (data, bytearray(data), memoryview(data), memoryview(bytearray(data)).toreadonly()):
        rt.upload(h, b"\0" * 4096)
        rt.upload(h, buf)
        assert rt.download(h) == data
    assert isinstance(rt.download(h), bytes)


def test_upload_and_download_at_an_offset(rt):
    h = rt.alloc(1000)
    rt.upload(h, b"\0" * 1000)
    rt.upload(h, b"abc", offset=500, stream=3)
    assert rt.download(h, 3, offset=500) == b"abc"
    assert rt.download(h, offset=997) == b"\0\0\0"  # the rest of the block
    assert len(rt.download(h)) == 1000


def test_numpy_arrays_upload_without_a_copy_and_download_into(rt):
    a = np.arange(1024, dtype=np.float32)
    h = rt.alloc(a.nbytes)
    rt.upload(h, a)
    assert np.frombuffer(rt.download(h), dtype=np.float32).tolist() == a.tolist()
    out = np.zeros_like(a)
    rt.download_into(h, out)
    assert (out == a).all()
    strided = np.arange(2048, dtype=np.int32)[::2]  # not contiguous: copied once
    rt.upload(h, strided)
    assert (np.frombuffer(rt.download(h, strided.nbytes), dtype=np.int32) == strided).all()
    with pytest.raises((ferry.InvalidArgumentError, BufferError, TypeError)):
        rt.download_into(h, b"read-only")


def test_transfer_ranges_outside_the_block_are_invalid(rt):
    h = rt.alloc(100)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.upload(h, b"x" * 101)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.upload(h, b"x", offset=100)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.download(h, 10, offset=95)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.download(h, offset=101)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.upload(h, b"")


def test_integrity_stats_count_verified_bytes(rt):
    h = rt.alloc(MiB)
    rt.upload(h, pattern(MiB))
    stats = rt.integrity_stats()
    assert set(stats) == INTEGRITY_KEYS
    assert stats["bytes_verified"] >= MiB and stats["mismatches"] == 0


# ---- the program's own kernels --------------------------------------------------------

def test_launch_views_are_writable_only_where_marked(rt):
    a, b, c = rt.alloc(256), rt.alloc(256), rt.alloc(256)
    rt.upload(a, pattern(256, 1))
    rt.upload(b, pattern(256, 2))
    seen = {}

    def kernel(ctx):
        seen["readonly"] = [v.readonly for v in ctx.views]
        seen["native_stream"] = ctx.native_stream
        seen["bytes"] = list(ctx.bytes)
        seen["addresses"] = list(ctx.device_addresses)
        x = np.frombuffer(ctx.views[0], dtype=np.uint8)
        y = np.frombuffer(ctx.views[1], dtype=np.uint8)
        out = np.frombuffer(ctx.views[2], dtype=np.uint8)
        out[:] = x ^ y
        ctx.views[1][0] = 0xEE  # read-write: lands

    rt.launch(0, [(a, "r"), (b, "rw"), (c, "w")], kernel, flops=256, mem_bytes=768)
    expected = bytes(p ^ q for p, q in zip(pattern(256, 1), pattern(256, 2)))
    assert rt.download(c) == expected
    assert rt.download(b, 1) == b"\xee"
    assert rt.download(a) == pattern(256, 1)
    assert seen["readonly"] == [True, False, False]
    assert seen["native_stream"] is None  # sim
    assert seen["bytes"] == [256, 256, 256]
    assert seen["addresses"] == [rt.device_address(h)[0] for h in (a, b, c)]


def test_launch_operand_ranges(rt):
    h = rt.alloc(1024)
    rt.upload(h, b"\0" * 1024)
    got = []

    def kernel(ctx):
        got.append(list(ctx.bytes))
        ctx.views[0][:] = b"\x01" * len(ctx.views[0])

    rt.launch(1, [(h, "w", 512, 256)], kernel)
    rt.synchronize()
    assert got == [[256]]
    assert rt.download(h) == b"\0" * 512 + b"\x01" * 256 + b"\0" * 256
    rt.launch(1, [(h, "rw", 1000, 0)], lambda ctx: got.append(list(ctx.bytes)))  # 0: to the end
    rt.synchronize()
    assert got[-1] == [24]


def test_writing_a_read_only_view_fails_the_op(rt):
    h = rt.alloc(64)
    rt.upload(h, b"\x05" * 64)

    def kernel(ctx):
        ctx.views[0][0] = 1  # TypeError: read-only

    rt.launch(0, [(h, "r")], kernel)
    with pytest.raises(ferry.BackendError):
        rt.synchronize()


def test_an_exception_in_the_callable_is_the_ops_error(tiny):
    h = tiny.alloc(64)
    tiny.upload(h, b"\x05" * 64)

    def kernel(ctx):
        ctx.views[0][:] = b"\x09" * 64
        raise ValueError("the kernel's own complaint")

    tiny.launch(4, [(h, "rw")], kernel)
    with pytest.raises(ferry.BackendError) as e:
        tiny.synchronize()
    assert e.value.status == 5
    assert "ValueError: the kernel's own complaint" in str(e.value)
    assert isinstance(e.value.callable_errors[0], ValueError)
    assert isinstance(e.value.__cause__, ValueError)
    with pytest.raises(ferry.BackendError, match="own complaint"):  # sticky, as the stream's fault
        tiny.synchronize()


def test_a_kept_view_is_released_after_the_call(rt):
    h = rt.alloc(64)
    kept = []
    rt.launch(0, [(h, "w")], lambda ctx: kept.append(ctx.views[0]))
    rt.synchronize()
    with pytest.raises(ValueError):
        kept[0][0]


def test_a_slice_kept_past_the_call_never_touches_ferrys_memory(rt):
    # Issue 24 item 2: a slice or cast of the view outlived release() and read or
    # wrote freed heap.
    h = rt.alloc(4096)
    rt.upload(h, pattern(4096, 3))
    keep = []

    def kernel(ctx):
        keep.append(ctx.views[0][:])
        keep.append(ctx.views[0].cast("B"))
        ctx.views[0][0] = 7

    rt.launch(0, [(h, "rw")], kernel)
    rt.synchronize()
    for _ in range(3):  # churn the sim's host buffers
        rt.launch(0, [(h, "rw")], lambda ctx: None)
        rt.synchronize()
    for k in keep:
        assert bytes(k[1:]) == pattern(4096, 3)[1:]
    for k in keep:
        k[:] = b"\xff" * len(k)  # lands in the copy only
    assert rt.download(h) == b"\x07" + pattern(4096, 3)[1:]


def test_a_callable_that_calls_ferry_is_refused(rt):
    # Issue 24 item 5: download, free, synchronize, close from inside a callable
    # deadlocked; each is an InvalidArgumentError naming the rule.
    h = rt.alloc(64)
    other = rt.alloc(64)
    refused = []

    def kernel(ctx):
        for call in (lambda: rt.download(other, 8), lambda: rt.free(other), rt.synchronize, rt.close,
                     lambda: rt.launch(0, [], lambda c: None)):
            try:
                call()
            except ferry.InvalidArgumentError as e:
                refused.append(str(e))

    rt.launch(0, [(h, "r")], kernel)
    rt.synchronize()
    assert len(refused) == 5, refused
    assert all("inside" in m and "callable" in m or "inside a user kernel" in m for m in refused), refused
    assert not rt.closed
    rt.free(other)


def test_a_download_after_a_failed_launch_raises(rt):
    # Issue 24 item 6: the download returned the pre-kernel bytes as a success.
    h = rt.alloc(64)
    rt.upload(h, b"\x05" * 64)

    def kernel(ctx):
        ctx.views[0][:] = b"\x09" * 64
        raise ValueError("no luck")

    rt.launch(2, [(h, "rw")], kernel)
    with pytest.raises(ferry.BackendError, match="no luck"):
        rt.download(h, stream=2)


@pytest.mark.parametrize("returned", [99, "err", 2.5, True])
def test_a_callable_returning_something_else_fails_the_op(rt, returned):
    # Issue 24 item 13: 99 or 'err' counted as success.
    h = rt.alloc(64)
    rt.launch(0, [(h, "r")], lambda ctx: returned)
    with pytest.raises(ferry.BackendError, match="returned"):
        rt.synchronize()


def test_python_arguments_c_would_misread_are_refused(rt, tmp_path):
    # Issue 24 item 13: each of these was silently taken as something else.
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.status_name(2 ** 40)
    with pytest.raises(ferry.InvalidArgumentError):
        ferry.status_name("ok")
    assert ferry.status_name(1234) == "unknown"
    with pytest.raises(ferry.InvalidArgumentError):
        rt.trace_start(None)
    assert not (tmp_path / "None").exists()
    with pytest.raises(ferry.InvalidArgumentError, match="NUL"):
        ferry.Runtime(profile="tiny\0x")
    with pytest.raises(ferry.InvalidArgumentError, match="bool"):
        rt.alloc(True)
    rt.trace_start(tmp_path / "t.jsonl")  # a path object is still a path
    rt.trace_stop()


def test_a_held_launch_runs_after_release(rt):
    h = rt.alloc(64)
    ran = []
    rt.hold(5)
    rt.launch(5, [(h, "w")], lambda ctx: ran.append(1))
    rt.free(h)  # legal: the held launch leases the block
    assert ran == []
    rt.release(5)
    rt.synchronize()
    assert ran == [1]


def test_bad_launch_arguments_are_invalid(rt):
    h = rt.alloc(64)
    for operands in ([(h, "x")], [(h,)], [h], [(h, "r", 0)], [(h, "r", 60, 8)], [(h, "r", 65, 0)]):
        with pytest.raises(ferry.InvalidArgumentError):
            rt.launch(0, operands, lambda ctx: None)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.launch(0, [(h, "r")], "not callable")
    with pytest.raises(ferry.InvalidArgumentError):
        rt.launch(64, [(h, "r")], lambda ctx: None)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.launch(0, [(h, "r")], lambda ctx: None, flops=-1.0)
    rt.synchronize()  # nothing refused was enqueued


def test_a_launch_without_operands(rt):
    ran = []
    rt.launch(0, [], lambda ctx: ran.append((ctx.views, list(ctx.bytes))))
    rt.synchronize()
    assert ran in ([([], [])], [(None, [])])


def test_record_use(rt):
    a, b = rt.alloc(4096), rt.alloc(4096)
    rt.record_use(3, [a, b])
    rt.record_use(3, [])
    rt.free(a)
    rt.free(b)
    with pytest.raises(ferry.StaleHandleError):
        rt.record_use(3, [a])
    with pytest.raises(ferry.InvalidArgumentError):
        rt.record_use(99, [])
    rt.synchronize()


# ---- streams -----------------------------------------------------------------------------

def test_hold_release_and_synchronize_check_the_stream(rt):
    rt.hold(7)
    rt.release(7)
    rt.synchronize()
    for call in (rt.hold, rt.release):
        with pytest.raises(ferry.InvalidArgumentError):
            call(64)


def test_native_and_adopted_streams(rt):
    token = rt.native_stream(1)
    assert isinstance(token, int) and token != 0
    mine = 0x5EED0000
    s = rt.adopt_stream(mine)
    assert s >= 32
    with pytest.raises(ferry.InvalidArgumentError):
        rt.adopt_stream(mine)  # adopted already
    with pytest.raises(ferry.InvalidArgumentError):
        rt.adopt_stream(0)
    h = rt.alloc(64, s)
    rt.upload(h, b"\x03" * 64, stream=s)
    rt.launch(s, [(h, "rw")], lambda ctx: ctx.views[0].__setitem__(0, 4))
    assert rt.download(h, 2, stream=s) == b"\x04\x03"
    rt.release_stream(s, timeout_ms=5000)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.release_stream(s)
    with pytest.raises(ferry.InvalidArgumentError):
        rt.native_stream(64)


# ---- statistics, summary, trace -----------------------------------------------------------

def test_memory_summary(tiny):
    tiny.alloc(MiB)
    text = tiny.memory_summary()
    assert isinstance(text, str) and "capacity" in text and "\n" in text


def test_trace_start_stop(tiny, tmp_path):
    path = tmp_path / "run.jsonl"
    tiny.trace_start(str(path))
    h = tiny.alloc(4096)
    tiny.upload(h, b"\1" * 4096)
    tiny.download(h)
    tiny.free(h)
    tiny.synchronize()
    tiny.trace_stop()
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(lines) >= 4
    with pytest.raises(ferry.InvalidArgumentError):
        tiny.trace_stop()


# ---- the cache ---------------------------------------------------------------------------

def test_cache_define_acquire_release_and_stats():
    pieces = {k: [pattern(3000, k), pattern(1000, k + 50)] for k in (1, 2, 3)}
    with ferry.Runtime(profile="tiny", cache_slots=2) as rt:
        for key, ps in pieces.items():
            rt.cache_define(key, ps)
        with pytest.raises(ferry.InvalidArgumentError):
            rt.cache_define(1, [b"again"])
        with pytest.raises(ferry.InvalidArgumentError):
            rt.cache_define(9, [])
        for key in (1, 2, 3, 1):
            slot = rt.cache_acquire(key, stream=0)
            assert isinstance(slot, ferry.CacheSlot) and len(slot.offsets) == 2
            for offset, piece in zip(slot.offsets, pieces[key]):
                assert rt.download(slot.handle, len(piece), offset=offset) == piece
            rt.cache_release(key)
        again = rt.cache_acquire(1)
        assert again.hit
        rt.cache_release(1)
        stats = rt.cache_stats()
        assert set(stats) == CACHE_KEYS
        assert stats["misses"] >= 3 and stats["hits"] >= 1 and stats["evictions"] >= 1
        with pytest.raises(ferry.InvalidArgumentError):
            rt.cache_acquire(42)


def test_without_a_cache_the_cache_calls_are_invalid(rt):
    with pytest.raises(ferry.InvalidArgumentError):
        rt.cache_define(1, [b"piece"])
    with pytest.raises(ferry.InvalidArgumentError):
        rt.cache_acquire(1)


def test_cache_pieces_may_be_numpy_arrays():
    weights = np.arange(4096, dtype=np.float32)
    with ferry.Runtime(profile="tiny", cache_slots=1) as rt:
        rt.cache_define(7, weights)
        slot = rt.cache_acquire(7)
        got = np.frombuffer(rt.download(slot.handle, weights.nbytes, offset=slot.offsets[0]), dtype=np.float32)
        assert (got == weights).all()
        rt.cache_release(7)


# ---- threads --------------------------------------------------------------------------------

def test_threads_share_a_runtime(rt):
    errors = []

    def worker(n):
        try:
            for i in range(10):
                h = rt.alloc(8192, stream=n)
                data = pattern(8192, n * 10 + i)
                rt.upload(h, data, stream=n)
                out = rt.alloc(8192, stream=n)
                rt.launch(n, [(h, "r"), (out, "w")], lambda ctx: ctx.views[1].__setitem__(slice(None), ctx.views[0]))
                assert rt.download(out, stream=n) == data
                rt.free(h)
                rt.free(out)
        except BaseException as e:  # noqa: B902
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rt.synchronize()


# ---- the seed reports -------------------------------------------------------------------------

def _report000(integrity):
    wrong = 0
    with ferry.Runtime(integrity=integrity, inject="pinned-noop") as rt:
        h = rt.alloc(MiB)
        for i in range(8):
            data = pattern(MiB, i)
            rt.upload(h, data)
            wrong += rt.download(h) != data
        return wrong, rt.integrity_stats()


def test_report000_verify_delivers_the_bytes_and_counts_the_mismatches():
    wrong, stats = _report000("verify")
    assert wrong == 0
    assert stats["mismatches"] > 0 and stats["retries"] > 0


def test_report000_with_integrity_off_the_bytes_are_wrong():
    wrong, stats = _report000("off")
    assert wrong > 0
    assert stats["mismatches"] == 0


def test_report003_the_held_launch_reads_the_right_bytes(tiny):
    rt = tiny
    resident = rt.alloc(6 * MiB, 0)
    transient = rt.alloc(1 * MiB, 0)
    out = rt.alloc(64 << 10, 0)
    data = pattern(MiB, 3)
    rt.upload(transient, data)

    def copy(ctx):
        ctx.views[1][:] = ctx.views[0][:len(ctx.views[1])]

    rt.hold(0)  # 1. a launch reading the transient, held
    rt.launch(0, [(transient, "r", 0, 64 << 10), (out, "w")], copy)
    rt.free(transient)  # 2. the transient freed
    reclaims = rt.pool_stats()["reclaims"]
    with pytest.raises(ferry.OutOfMemoryError):
        rt.alloc(3 * MiB, 1)  # more than a reclaim can give: the diagnostic, no abort
    big = rt.alloc(1536 << 10, 1)  # 3. fits only by reclaiming around the held operand
    assert rt.pool_stats()["reclaims"] > reclaims
    rt.upload(big, b"\x07" * (1536 << 10), stream=1)
    rt.release(0)  # 4. dispatch
    assert rt.download(out) == data[:64 << 10]
    assert rt.device_address(resident)[1] == 6 * MiB


def test_a_dropped_runtime_is_destroyed_at_once():
    import gc
    import weakref
    gc.disable()  # no cycle: refcounting alone destroys it, never the cyclic GC later
    try:
        rt = ferry.Runtime(profile="tiny")
        ran = []
        rt.launch(0, [(rt.alloc(64), "w")], lambda ctx: ran.append(1))
        ref = weakref.ref(rt)
        del rt
        assert ref() is None and ran == [1]
    finally:
        gc.enable()


def test_race_check_names_both_sides_of_an_unordered_write():
    with ferry.Runtime(profile="tiny", race_check=True) as rt:
        h = rt.alloc(4096)
        rt.set_tag(h, "kv")

        def touch(ctx):
            pass

        rt.launch(0, [(h, "w")], touch)
        rt.launch(1, [(h, "r")], touch)  # nothing orders stream 1 after stream 0
        rt.synchronize()
        races = rt.races()
        assert races["count"] == 1
        race = races["list"][0]
        assert (race["earlier"]["stream"], race["later"]["stream"]) == (0, 1)
        assert race["earlier"]["access"] == "w" and race["later"]["access"] == "r"
        assert race["later"]["kind"] == "user" and race["bytes"] == 4096
        assert race["earlier"]["block"] == h and race["earlier"]["block_tag"] == "kv"
        assert race["reuse"] is False
        with pytest.raises(ValueError):
            rt.set_tag(h, "a\0b")


def test_a_stream_wait_orders_the_streams_and_is_traced(tmp_path):
    with ferry.Runtime(profile="tiny", race_check=True) as rt:
        trace = tmp_path / "ordered.jsonl"
        rt.trace_start(str(trace))
        h = rt.alloc(4096)  # after trace_start: the recorder names only what it handed out
        rt.launch(0, [(h, "w")], lambda ctx: None)
        rt.stream_wait(1, 0)
        rt.launch(1, [(h, "r")], lambda ctx: None)
        rt.synchronize()
        rt.trace_stop()
        assert rt.races()["count"] == 0
        ops = [line.split('"op":"')[1].split('"')[0] for line in trace.read_text().splitlines()]
        assert ops.count("user") == 2 and "wait" in ops
        with pytest.raises(ferry.InvalidArgumentError):
            rt.stream_wait(64, 0)


def test_a_race_across_devices_names_each_sides_device():
    """Device 1's direct pull reads the source on device 0; a write of it on another
    stream of device 0 races with that read, and each side says its device."""
    data = bytes(range(256)) * 16
    with ferry.Runtime(profile="tiny", devices=2, links="0-1:pcie", integrity="off", race_check=True) as rt:
        a = rt.alloc(len(data), stream=1)
        b = rt.alloc(len(data), stream=1, device=1)
        rt.upload(a, data, stream=1)
        rt.synchronize()
        rt.copy_peer(b, a, len(data), stream=1)
        rt.upload(a, data, stream=2)
        rt.synchronize()
        races = rt.races()
        across = [r for r in races["list"] if r["earlier"]["kind"] == "copy_peer"]
        assert across, races
        assert (across[0]["earlier"]["device"], across[0]["later"]["device"]) == (1, 0)
        assert across[0]["later"]["stream"] == 2
        assert all("device" in r["earlier"] and "device" in r["later"] for r in races["list"])


def test_races_without_race_check_is_unsupported():
    with ferry.Runtime(profile="tiny") as rt:
        with pytest.raises(ferry.UnsupportedError):
            rt.races()


def test_devices_makes_a_stack_per_device_and_refuses_too_many():
    """Runtime(devices=N) (docs/scale.md): its calls act on device 0; more than 64 is refused."""
    with ferry.Runtime(profile="tiny", devices=2) as rt:
        h = rt.alloc(4096)
        rt.upload(h, bytes(range(256)) * 16)
        assert rt.download(h) == bytes(range(256)) * 16
        rt.free(h)
    with pytest.raises(ferry.InvalidArgumentError, match="at most 64"):
        ferry.Runtime(profile="tiny", devices=65)


def test_calls_select_the_device_a_handle_names():
    """alloc(device=i) allocates there; free, upload, download and copy_peer follow the handle."""
    data = bytes(range(256)) * 32
    with ferry.Runtime(profile="tiny", devices=2, integrity="verify") as rt:
        assert rt.device_count == 2
        a = rt.alloc(len(data), device=1)
        b = rt.alloc(len(data))
        assert (rt.device_of(a), rt.device_of(b)) == (1, 0)
        rt.upload(a, data, stream=1)
        assert rt.download(a, len(data), stream=1) == data
        assert rt.copy_peer(b, a, len(data)) is True
        assert rt.download(b) == data
        with pytest.raises(ferry.StaleHandleError, match="device 1"):
            rt.device_address(a)
        with pytest.raises(ferry.InvalidArgumentError, match="no device 2"):
            rt.alloc(64, device=2)
        rt.free(a)
        rt.free(b)
        with pytest.raises(ferry.StaleHandleError):
            rt.free(a)


def test_links_join_devices_and_their_copies_take_the_link():
    """Runtime(links=) (ferry.h's ferry_runtime_options.links): a linked pair's copy_peer
    goes device to device, so an injected peer-copy no-op passes under "off" and is
    caught under "verify"; an unlinked pair's copy never sees that fault."""
    with ferry.Runtime(profile="tiny", devices=3, links=[(0, 1, "nvlink"), (2, 1, "pcie")]) as rt:
        assert [rt.device_link(0, 1), rt.device_link(1, 2), rt.device_link(0, 2)] == ["nvlink", "pcie", "none"]
        with pytest.raises(ferry.InvalidArgumentError):
            rt.device_link(0, 3)
    data = bytes(range(256)) * 32

    def copied(integrity, links):
        with ferry.Runtime(profile="h200", capacity=64 << 20, devices=2, links=links, inject="peer-noop",
                           integrity=integrity) as rt:
            a, b = rt.alloc(len(data)), rt.alloc(len(data), device=1)
            rt.upload(a, data)
            rt.upload(b, bytes(len(data)), stream=1)
            verified = rt.copy_peer(b, a, len(data))
            out = rt.download(b, len(data), stream=1)
            rt.free(a)
            rt.free(b)
            return out == data, verified

    assert copied("off", "0-1:nvlink") == (False, False)
    assert copied("verify", "0-1:nvlink") == (True, True)
    assert copied("off", None) == (True, False)
    for bad in ["0-1", "0-1:warp", "0-2:pcie", "1-1:pcie", [(0, 1)], 7]:
        with pytest.raises(ferry.InvalidArgumentError, match="link"):
            ferry.Runtime(profile="tiny", devices=2, links=bad)


def _overwrite_after_pull(wait):
    """A block of device 0 written on its stream 1, pulled over the link by device 1
    on its stream 0 (copy_peer orders the pull after the block's writes itself), then
    overwritten by a launch on device 0's stream 1: (races found, the pulled bytes are
    the first contents). Only a wait of device 0's stream 1 for device 1's stream 0
    orders the overwrite after the pull."""
    data = bytes(range(256)) * 16
    with ferry.Runtime(profile="tiny", devices=2, links="0-1:nvlink", race_check=True, integrity="off") as rt:
        src, dst = rt.alloc(len(data), stream=1), rt.alloc(len(data), device=1)
        rt.upload(src, data, stream=1)
        rt.copy_peer(dst, src, len(data))
        if wait:
            rt.stream_wait(1, 0, device=0, for_device=1)

        def overwrite(ctx):
            ctx.views[0][:] = bytes(len(data))

        rt.launch(1, [(src, "w")], overwrite, flops=1e9)
        out = rt.download(dst, len(data))
        rt.synchronize()
        return rt.races()["count"], out == data


def test_a_wait_across_devices_orders_the_pull_and_the_race_checker_sees_it():
    """stream_wait(device=, for_device=) (ferry_device_stream_wait): device 0's stream
    waits for device 1's point without the host; the race checker over both sims finds
    the overwrite of the pull's source unordered without it."""
    assert _overwrite_after_pull(True) == (0, True)
    races, _ = _overwrite_after_pull(False)
    assert races >= 1
    with ferry.Runtime(profile="tiny") as rt:
        with pytest.raises(ferry.InvalidArgumentError, match="no device 1"):
            rt.stream_wait(0, 0, for_device=1)


def test_stream_calls_and_figures_take_a_device():
    """launch, record_use, hold/release, synchronize, native_stream, pool_stats and
    integrity_stats act on the device they are given (device 0 by default)."""
    data = bytes(range(256)) * 16
    with ferry.Runtime(profile="tiny", devices=2, race_check=True) as rt:
        a = rt.alloc(len(data), device=1)

        def fill(ctx):
            ctx.views[0][:] = data

        rt.hold(0, device=1)
        rt.launch(0, [(a, "w")], fill, device=1)
        rt.record_use(0, [a], device=1)
        rt.release(0, device=1)
        rt.synchronize(device=1)
        assert rt.download(a, len(data)) == data
        assert rt.races()["count"] == 0
        assert rt.pool_stats(device=1)["allocs"] == 1 and rt.pool_stats()["allocs"] == 0
        moved0, moved1 = rt.integrity_stats()["bytes_moved"], rt.integrity_stats(device=1)["bytes_moved"]
        rt.upload(a, data)
        assert rt.integrity_stats(device=1)["bytes_moved"] >= moved1 + len(data)
        assert rt.integrity_stats()["bytes_moved"] == moved0
        assert isinstance(rt.native_stream(0, device=1), int)
        with pytest.raises(ferry.StaleHandleError, match="device 1"):
            rt.launch(0, [(a, "r")], lambda ctx: None)
        for call in (lambda: rt.pool_stats(device=2), lambda: rt.native_stream(0, device=2),
                     lambda: rt.synchronize(device=2), lambda: rt.launch(0, [], lambda ctx: None, device=2)):
            with pytest.raises(ferry.InvalidArgumentError, match="no device 2"):
                call()
        rt.synchronize()
