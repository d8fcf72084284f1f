#!/usr/bin/env python3
"""tools/check-layers fails on a planted violation of each of its rules, and passes the tree as it is.

Usage: check_layers_test.py REPO   (exit 0: every plant found; 1: one was missed, named)
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile

PLANTS = [  # (file, text, a word of the message): one violation each
    ("src/core/plant.cpp", '#include "ferry/device_pool.hpp"\n', "upward"),                # core below pool
    ("src/pool/plant.cpp", '#include "ferry/host_arena.hpp"\n', "upward"),                 # pool below transfer
    ("src/cache/plant.cpp", '#include "ferry/weight_bank.hpp"\n', "sideways"),             # siblings
    ("src/transfer/plant.cpp", '#include "ferry/sim_backend.hpp"\n', "upward"),            # a backend, from below it
    ("src/runtime/plant.cpp", '#include "sim/device_memory.hpp"\n', "only sim"),           # a backend's own header
    ("src/cache/weight_bank.cpp", '#include "ferry/weight_bank.hpp"\n', "outside src/weights"),  # implementation's home
    ("src/pool/plant.cpp", '#include "ferry/offload_cache.hpp"\n#include "ferry/device_pool.hpp"\n', "own header"),
    ("src/newlayer/plant.cpp", "\n", "no layer"),                                          # a folder that is no layer
    ("src/transfer/plant.cpp", '#include "pool/device_pool_impl.hpp"\n', "pool internal"),  # the pool's own
    ("tests/pool/plant_test.cpp", '#include "ferry/offload_cache.hpp"\n', "upward"),       # tests are checked
    ("tests/core/plant_test.cpp", '#include "ferry/runtime.hpp"\n', "upward"),
    ("examples/plant/plant.cpp", '#include "ferry/sim_backend.hpp"\n', "only sim"),         # examples are checked
    ("bench/plant.cpp", '#include "workloads/exec.hpp"\n#include "ferry/nothing.hpp"\n', "in no layer"),
    ("cli/plant.cpp", 'auto k = "cuda";\n', "backend name"),
    # A branch on the kind above src/backends (a capability is asked instead); choosing one is not a branch.
    ("src/weights/plant.cpp", 'bool lazy(const DeviceInfo& i) { return i.backend != BackendKind::sim; }\n',
     "branch on BackendKind"),
    ("cli/plant.cpp", 'void f(BackendKind k) { switch (k) { case BackendKind::cuda: break; } }\n',
     "branch on BackendKind"),
    ("src/workloads/plant.cpp", 'bool g(BackendKind k) { return BackendKind::sim == k; }\n', "branch on BackendKind"),
]


def check(tree):
    run = subprocess.run([sys.executable, str(tree / "tools/check-layers"), str(tree)], capture_output=True, text=True)
    return run.returncode, run.stdout


def main():
    repo = pathlib.Path(sys.argv[1])
    failures = []
    with tempfile.TemporaryDirectory() as scratch:
        tree = pathlib.Path(scratch) / "tree"
        for folder in ("include", "src", "tests", "examples", "bench", "cli", "fuzz", "tools"):
            shutil.copytree(repo / folder, tree / folder, ignore=shutil.ignore_patterns("*.pickle", "*.jsonl"))
        rc, out = check(tree)
        if rc != 0:
            failures.append(f"the tree as it is fails the check:\n{out}")
        for rel, text, word in PLANTS:
            path = tree / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            path.write_text(text)
            rc, out = check(tree)
            if rc != 1 or not any(rel in line and word in line for line in out.splitlines()):
                failures.append(f"planted {rel} ({word}) was not reported:\n{out}")
            if not existed:
                path.unlink()
                if not any(path.parent.iterdir()):
                    path.parent.rmdir()
    for f in failures:
        print(f)
    print(f"check_layers_test: {len(PLANTS)} plants, {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
