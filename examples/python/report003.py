#!/usr/bin/env python3
"""Report 003 from Python: a kernel bound to a transient buffer is queued and held
on the host, the buffer's handle is dropped, another stream allocates something
that only fits by reclaiming, then the queue is dispatched. ferry reclaims around
the held kernel's operand (its lease was taken at launch), so the kernel reads the
right bytes and nothing aborts. examples/lazy_queue/lazy_queue.cpp is the same in C++.

Exit 0 when the held kernel copied the right bytes and the big allocation was a
reclaim's recovery; 1 otherwise.
"""
import sys

import ferry

MiB = 1 << 20


def main():
    with ferry.Runtime(profile="tiny", capacity=8 * MiB) as rt:
        resident = rt.alloc(6 * MiB, 0)
        transient = rt.alloc(1 * MiB, 0)
        out = rt.alloc(64 << 10, 0)
        data = bytes((i ^ (i >> 8)) & 0xFF for i in range(1 * MiB))
        rt.upload(transient, data)

        def copy(ctx):  # out := the transient's first len(out) bytes
            src, dst = ctx.views
            dst[:] = src[:len(dst)]

        rt.hold(0)  # 1. the kernel, bound to the transient, queued and held
        rt.launch(0, [(transient, "r", 0, 64 << 10), (out, "w")], copy)
        rt.free(transient)  # 2. the handle dropped
        before = rt.pool_stats()
        big = rt.alloc(1536 << 10, 1)  # 3. fits only by reclaiming
        rt.upload(big, b"\x07" * (1536 << 10), stream=1)
        rt.release(0)  # 4. dispatch

        got = rt.download(out)
        stats = rt.pool_stats()
        right = got == data[:len(got)]
        reclaimed = stats["reclaims"] > before["reclaims"]
        print("report003: %d reclaim(s); the held kernel read %s"
              % (stats["reclaims"], "the right bytes" if right else "WRONG BYTES"))
        rt.synchronize()
        for h in (resident, out, big):
            rt.free(h)
        return 0 if right and reclaimed else 1


if __name__ == "__main__":
    sys.exit(main())
