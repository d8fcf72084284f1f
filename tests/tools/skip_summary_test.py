"""tools/skip-summary on a ctest log written the way ctest writes LastTest.log:
GoogleTest skips (which ctest counts as passed) grouped by their reason, pytest's
skips, a test that skipped by its exit code, passes and failures left out, and a
missing log refused."""
import pathlib
import subprocess
import sys
import tempfile

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "skip-summary"


def block(i, name, output, status):
    return (f"{i}/9 Testing: {name}\n{i}/9 Test: {name}\nCommand: \"/bin/{name}\"\nDirectory: /tmp\n"
            f"\"{name}\" start time: Dec 02 12:49 UTC\nOutput:\n" + "-" * 58 + "\n" + output +
            "<end of output>\nTest time =   0.01 sec\n" + "-" * 58 + f"\n{status}\n"
            f"\"{name}\" end time: Dec 02 12:49 UTC\n\"{name}\" time elapsed: 00:00:00\n" + "-" * 58 + "\n\n")


def gtest_skip(test, reason):
    return (f"[ RUN      ] {test}\n/src/x_test.cpp:12: Skipped\n{reason}\n\n"
            f"[  SKIPPED ] {test} (0 ms)\n[==========] 1 test ran.\n[  SKIPPED ] 1 test, listed below:\n"
            f"[  SKIPPED ] {test}\n")


LOG = ("Start testing: Dec 02 12:49 UTC\n" + "-" * 58 + "\n" +
       block(1, "A.OnCuda", gtest_skip("A.OnCuda", "backend cuda unavailable: no device"), "Test Passed.") +
       block(2, "B.OnCuda", gtest_skip("B.OnCuda", "backend cuda unavailable: no device"), "Test Passed.") +
       block(3, "C.Long", gtest_skip("C.Long", "set FERRY_LONG_TESTS=1"), "Test Passed.") +
       block(4, "D.Runs", "[ RUN      ] D.Runs\n[       OK ] D.Runs (1 ms)\n", "Test Passed.") +
       block(5, "E.Fails", "[ RUN      ] E.Fails\n[  FAILED  ] E.Fails (1 ms)\n", "Test Failed.") +
       block(6, "python_tests", "SKIP: no python3 with pytest and numpy\n", "Test Passed.") +
       block(7, "pytests", "..s.\nSKIPPED [2] tests/python/test_torch.py:20: no PyTorch\n3 passed, 2 skipped\n",
             "Test Passed.") +
       "End testing: Dec 02 12:50 UTC\n")


def run(*builds):
    return subprocess.run([sys.executable, str(TOOL), *builds], capture_output=True, text=True, timeout=60)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        build = pathlib.Path(tmp) / "build"
        (build / "Testing" / "Temporary").mkdir(parents=True)
        (build / "Testing" / "Temporary" / "LastTest.log").write_text(LOG)
        r = run(str(build))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert "6 tests skipped" in lines[0], r.stdout
        assert lines[1].split(None, 1) == ["2", "backend cuda unavailable: no device"], r.stdout
        assert lines[2].strip() == "A.OnCuda, B.OnCuda", r.stdout
        assert "set FERRY_LONG_TESTS=1" in r.stdout and "C.Long" in r.stdout, r.stdout
        assert "  no python3 with pytest and numpy" in r.stdout and "python_tests" in r.stdout, r.stdout
        assert "2  no PyTorch" in r.stdout and "pytests: tests/python/test_torch.py #1" in r.stdout, r.stdout
        assert "no reason given" not in r.stdout, r.stdout
        assert "D.Runs" not in r.stdout and "E.Fails" not in r.stdout, r.stdout
        missing = run(str(pathlib.Path(tmp) / "nowhere"))
        assert missing.returncode == 2 and "LastTest.log not found" in missing.stderr, missing.stderr
    print("skip-summary: ok")


if __name__ == "__main__":
    main()
