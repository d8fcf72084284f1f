"""examples/python/*.py run as a user runs them: exit 0."""
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("name", ["report000.py", "report003.py"])
def test_example_exits_0(name):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "python"), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, os.path.join(REPO, "examples", "python", name)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok" in r.stdout or "right bytes" in r.stdout


def test_a_missing_library_is_a_clear_error():
    env = dict(os.environ, FERRY_LIBRARY="/nonexistent/libferry.so")
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    code = "import ferry\ntry:\n    ferry.Runtime()\nexcept OSError as e:\n    print(e)\n"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "FERRY_LIBRARY=/nonexistent/libferry.so" in r.stdout


def test_the_library_is_searched_next_to_an_install_and_in_the_build_tree():
    from ferry import _lib
    paths = _lib.candidates("libferry.so", "FERRY_LIBRARY_UNSET_FOR_TEST", ("src", "src/capi"))
    assert any(p.endswith(os.path.join("build", "dev", "src", "capi", "libferry.so")) for p in paths) or \
        not os.path.isdir(os.path.join(REPO, "build", "dev"))
    assert paths[0].endswith(os.path.join("libferry.so"))


def test_import_ferry_and_a_round_trip_need_no_numpy():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "python"), env.get("PYTHONPATH")) if p)
    code = ("import sys\nsys.modules['numpy'] = None\nimport ferry, ferry.torch\n"
            "with ferry.Runtime(profile='tiny') as rt:\n"
            "    h = rt.alloc(4096)\n    rt.upload(h, bytearray(b'\\x05' * 4096))\n"
            "    assert rt.download(h) == b'\\x05' * 4096\n"
            "print('without numpy: ok')\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "without numpy: ok" in r.stdout
