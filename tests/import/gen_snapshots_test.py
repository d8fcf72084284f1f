#!/usr/bin/env python3
"""tools/gen-torch-snapshots.py: the committed snapshots under tests/snapshots are
what the script writes, and each figure it records agrees with an independent
reading of its own file through Python's pickle (the generator's file is trusted
here: it is ours).

Usage: gen_snapshots_test.py REPO   (exit 0: pass)
"""
import json
import pathlib
import pickle
import subprocess
import sys
import tempfile


def main():
    repo = pathlib.Path(sys.argv[1]).resolve()
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "snaps"
        r = subprocess.run([sys.executable, str(repo / "tools" / "gen-torch-snapshots.py"), str(out)],
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"the generator failed: {r.stderr}")
        committed = sorted((repo / "tests" / "snapshots").iterdir())
        if not committed:
            failures.append("no committed snapshots")
        for c in committed:
            w = out / c.name
            if not w.exists() or w.read_bytes() != c.read_bytes():
                failures.append(f"{c.name}: the committed file is not what the generator writes")
        if (pathlib.Path(tmp) / "ferry-hostile-ran").exists():
            failures.append("writing the hostile files ran them")
        # Its usage: --help says what it writes and writes nothing; no argument is
        # a usage error, not a traceback.
        script = str(repo / "tools" / "gen-torch-snapshots.py")
        shown = subprocess.run([sys.executable, script, "--help"], cwd=tmp, capture_output=True, text=True)
        if shown.returncode != 0 or "OUT_DIR" not in shown.stdout or "expect.json" not in shown.stdout:
            failures.append(f"--help: exit {shown.returncode}, {shown.stdout!r}")
        if (pathlib.Path(tmp) / "--help").exists():
            failures.append("--help wrote a folder named --help")
        bare = subprocess.run([sys.executable, script], cwd=tmp, capture_output=True, text=True)
        if bare.returncode != 2 or "Traceback" in bare.stderr or "OUT_DIR" not in bare.stderr:
            failures.append(f"no arguments: exit {bare.returncode}, {bare.stderr!r}")
    for expect in sorted((repo / "tests" / "snapshots").glob("*.expect.json")):
        figures = json.loads(expect.read_text())
        name = expect.name[: -len(".expect.json")]
        with open(expect.parent / (name + ".pickle"), "rb") as f:
            snap = pickle.load(f)
        trace = snap["device_traces"][figures["device"]]
        for key, action in (("allocs", "alloc"), ("frees", "free_completed"), ("segment_allocs", "segment_alloc"),
                            ("ooms", "oom")):
            n = sum(1 for e in trace if e["action"] == action)
            if n != figures[key]:
                failures.append(f"{name}: {key} {figures[key]} but the file holds {n}")
        if len(trace) != figures["events"]:
            failures.append(f"{name}: events {figures['events']} but the file holds {len(trace)}")
    for f in failures:
        print("FAIL", f)
    print(f"gen_snapshots_test: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
