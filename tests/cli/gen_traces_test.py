#!/usr/bin/env python3
"""tools/gen-traces.py: --help prints and writes nothing, the committed traces are
what the script writes, and its options (--only, --seed, --ops, --max-bytes) shape
the trace it writes.

Usage: gen_traces_test.py REPO   (exit 0: pass)
"""
import json
import pathlib
import subprocess
import sys
import tempfile


def run(script, cwd, *args):
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True)


def main():
    repo = pathlib.Path(sys.argv[1]).resolve()
    script = repo / "tools" / "gen-traces.py"
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        h = run(script, tmp, "--help")
        if h.returncode != 0 or "--seed" not in h.stdout or "--ops" not in h.stdout:
            failures.append(f"--help: exit {h.returncode}, printed {h.stdout!r}")
        if any(tmp.iterdir()):
            failures.append(f"--help wrote {sorted(p.name for p in tmp.iterdir())}")
        if run(script, tmp, "--ops", "zero").returncode != 2:
            failures.append("--ops zero was accepted")

        out = tmp / "all"
        r = run(script, tmp, "--out", str(out))
        if r.returncode != 0:
            failures.append(f"default run failed: {r.stderr}")
        for committed in sorted((repo / "tests" / "traces").glob("*.jsonl")):
            written = out / committed.name
            if not written.exists() or written.read_bytes() != committed.read_bytes():
                failures.append(f"{committed.name}: the committed trace is not what the script writes")

        small = tmp / "small"
        r = run(script, tmp, "--out", str(small), "--only", "mixed-random", "--seed", "7", "--ops", "40",
                "--max-bytes", "64KiB")
        if r.returncode != 0:
            failures.append(f"--only mixed-random --seed 7 --ops 40 --max-bytes 64KiB failed: {r.stderr}")
        small.mkdir(exist_ok=True)
        path = small / "mixed-random.jsonl"
        lines = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
        if sorted(p.name for p in small.iterdir()) != ["mixed-random.jsonl"]:
            failures.append(f"--only wrote {sorted(p.name for p in small.iterdir())}")
        if not lines or lines[0] != {"op": "meta", "capacity": 128 << 20}:
            failures.append(f"the first line is not the meta line: {lines[:1]}")
        if any(l.get("bytes", 0) > 64 << 10 for l in lines if l["op"] == "alloc"):
            failures.append("--max-bytes 64KiB: a larger alloc was written")
        if len(lines) > 40 + 200:
            failures.append(f"--ops 40 wrote {len(lines)} lines")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
