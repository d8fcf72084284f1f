"""docs/guide.md §10: ferry from Python, start to end, on the sim.

Run it against an installed ferry (guide §10 says where the package lands):
    python3 guide.py
Exit status 0 when every check passed; an exception names the failing call.
numpy is not needed: the blocks here are bytes.
"""
import ferry

N = 64 * 1024


def plus_one(ctx):
    """Your kernel: out = in + 1, byte by byte. On the sim it computes on the
    operands' bytes (ctx.views); on cuda you would launch your own kernel on
    ctx.native_stream over ctx.device_addresses."""
    src, dst = ctx.views
    dst[:] = bytes((x + 1) & 0xFF for x in src)


def main():
    with ferry.Runtime() as rt:                       # the sim modelling an H200, verified uploads
        a = rt.alloc(N)
        b = rt.alloc(N)
        host = bytes((i * 7) & 0xFF for i in range(N))
        rt.upload(a, host)                            # verified

        # Hold stream 0 so the launch is still pending when `a` is freed: the launch
        # leases its operands, so the free is legal and `a` stays intact until it ran.
        rt.hold(0)
        rt.launch(0, [(a, "r"), (b, "w")], plus_one)
        rt.free(a)
        rt.release(0)

        got = rt.download(b)
        for i in range(N):
            assert got[i] == (host[i] + 1) & 0xFF, f"byte {i} of b is {got[i]}"
        print(f"downloaded {N} bytes of b, each one more than a's")

        try:
            rt.download(a)
            raise AssertionError("a freed handle was not refused")
        except ferry.StaleHandleError as e:
            print(f"the freed handle is refused: {e}")

        stats = rt.pool_stats()
        print(f"allocs {stats['allocs']}, frees {stats['frees']} (ferry's own buffers: "
              f"internal_allocs {stats['internal_allocs']}, internal_frees {stats['internal_frees']})")
        assert (stats["allocs"], stats["frees"]) == (2, 1), stats
        print(rt.memory_summary(), end="")
        rt.free(b)
    print("guide: ok")


if __name__ == "__main__":
    main()
