"""pytest fixtures for `import ferry` (python/ferry) on the sim.

ctest runs these with FERRY_LIBRARY (this build's libferry.so) and PYTHONPATH set
(tests/python/CMakeLists.txt); run by hand:
    FERRY_LIBRARY=build/dev/src/libferry.so PYTHONPATH=python python3 -m pytest -q tests/python
(a sanitized dev build also needs LD_PRELOAD=$(g++ -print-file-name=libasan.so)
ASAN_OPTIONS=detect_leaks=0).
"""
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if os.path.join(REPO, "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "python"))

import ferry  # noqa: E402

MiB = 1 << 20


@pytest.fixture
def rt():
    """A sim H200 with the defaults (integrity verify)."""
    with ferry.Runtime() as runtime:
        yield runtime


@pytest.fixture
def tiny():
    """The sim's tiny profile with an 8 MiB pool, as examples/lazy_queue."""
    with ferry.Runtime(profile="tiny", capacity=8 * MiB) as runtime:
        yield runtime
