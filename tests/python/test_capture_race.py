"""Graph capture across threads and at interpreter exit (issue 41 items 2, 3).

The threaded capture-versus-copy fuzzer: one thread makes the calls a capture
records over host memory (copy_to_host, upload, launch) on a stream another thread
keeps beginning and ending captures on. ctypes drops the GIL during each C call,
so without one gate over ferry's capture state and the Runtime's own, ferry can
record a call the bindings treated as a one-shot; its buffer is then freed while
every replay still writes it. After the race the heap is refilled with zeroed
buffers and every graph replayed: none may change. Bounded: a fixed seed and count
(ctest also runs this file with Python's allocator off under ASan:
python_threaded_asan).
"""
import os
import random
import subprocess
import sys
import textwrap
import threading

import ferry
from conftest import MiB

LEN = 4000
CALLS = 1500
MAX_CAPTURES = 4000
REFILLS = 1024


def test_calls_racing_a_capture_never_leave_a_graph_writing_freed_memory():
    with ferry.Runtime(profile="tiny", capacity=64 * MiB, integrity="off") as rt:
        a = rt.alloc(LEN)
        rt.fill(a, 7)
        rt.synchronize()
        done = threading.Event()
        failures = []

        def caller():
            mix = random.Random(41)
            try:
                for i in range(CALLS):
                    # Refusals (a capture spoiled meanwhile) are expected; only
                    # memory safety is under test.
                    try:
                        kind = mix.randrange(3)
                        if kind == 0:
                            rt.copy_to_host(a, bytearray(LEN), stream=1)
                        elif kind == 1:
                            rt.upload(a, bytes([i & 0xFF]) * LEN, stream=1)
                        else:
                            state = bytearray(b"\x01" * 64)
                            rt.launch(1, [(a, "r")], lambda ctx, state=state: None)
                    except ferry.InvalidArgumentError:
                        pass
            except BaseException as e:  # noqa: B902 — reported on the main thread
                failures.append(e)
            finally:
                done.set()

        thread = threading.Thread(target=caller)
        thread.start()
        graphs = []
        for _ in range(MAX_CAPTURES):
            if done.is_set():
                break
            try:
                rt.begin_capture(1)
                graphs.append(rt.end_capture(1))
            except ferry.InvalidArgumentError:
                pass
        thread.join()
        assert not failures, failures
        try:
            rt.synchronize()  # every one-shot buffer is released here
        except ferry.BackendError:
            pass  # a launch refused mid-capture by ferry is not under test
        refills = [bytearray(LEN) for _ in range(REFILLS)]
        for g in graphs:
            g.launch(1)
        try:
            rt.synchronize()
        except ferry.BackendError:
            pass
        dirty = sum(1 for r in refills if any(r))
        assert dirty == 0, "%d of %d fresh buffers were written by a replay (%d graphs)" % (dirty, REFILLS, len(graphs))
        for g in graphs:
            g.destroy()


def test_graphs_alive_at_interpreter_exit_go_before_their_runtime():
    # The collector clears a WeakSet's references before finalizers run, so the
    # runtime's close() could not see these graphs: it must destroy them all the same.
    script = textwrap.dedent("""
        import ferry
        rt = ferry.Runtime(profile="tiny", capacity=8 << 20)
        graphs = []
        for _ in range(1000):
            rt.begin_capture(1)
            graphs.append(rt.end_capture(1))
        cycle = [rt, graphs]
        cycle.append(cycle)
    """)
    done = subprocess.run([sys.executable, "-c", script], env=os.environ.copy(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]


def test_a_graph_destroyed_after_its_runtime_closed_does_nothing():
    rt = ferry.Runtime(profile="tiny", capacity=8 * MiB)
    rt.begin_capture(1)
    graph = rt.end_capture(1)
    rt.close()
    graph.destroy()  # the runtime destroyed it first
    assert graph.destroyed
