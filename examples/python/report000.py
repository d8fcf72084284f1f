#!/usr/bin/env python3
"""Report 000 from Python: uploads out of pinned buffers that silently go stale
(the sim's `inject="pinned-noop"`, the CLI's `--inject pinned-noop`).

Under integrity "verify" every upload's device hash is checked, so the silent
no-op copies are caught and redone: the bytes arrive, and integrity_stats()
counts the mismatches and retries. Under "off" the same uploads leave stale
bytes on the device and nobody notices (shown for contrast).

Exit 0 when verify delivered every upload intact (and caught the fault) and
off let it through; 1 otherwise.
"""
import sys

import ferry

UPLOADS = 8
BLOCK = 1 << 20


def payload(i):
    return bytes((i * 7 + j) % 251 for j in range(256)) * (BLOCK // 256)


def run(integrity):
    """(uploads whose download differed, integrity_stats) under `integrity`."""
    with ferry.Runtime(integrity=integrity, inject="pinned-noop") as rt:
        h = rt.alloc(BLOCK)
        wrong = 0
        for i in range(UPLOADS):
            data = payload(i)
            rt.upload(h, data)
            if rt.download(h) != data:
                wrong += 1
        return wrong, rt.integrity_stats()


def main():
    wrong, stats = run("verify")
    print("verify: %d of %d uploads arrived wrong; %d mismatch(es) caught, %d retry(ies), %d fallback(s)"
          % (wrong, UPLOADS, stats["mismatches"], stats["retries"], stats["fallbacks"]))
    off_wrong, _ = run("off")
    print("off:    %d of %d uploads arrived wrong, unnoticed" % (off_wrong, UPLOADS))
    ok = wrong == 0 and stats["mismatches"] > 0 and stats["retries"] > 0 and off_wrong > 0
    print("report000:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
