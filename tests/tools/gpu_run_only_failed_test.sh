#!/usr/bin/env bash
# tools/gpu-run.sh (the bundle's run.sh) against a bundle of fake binaries that record how
# they were called: a full run whose fakes fail some tests, a workload, a benchmark family
# and an example; then `run.sh --only-failed` on that run's summary must rerun exactly
# those (the failed tests by name, a crashed binary whole) and nothing else. Then a
# hand-planted summary (a test binary that ran out of time or got none, a timed-out
# family) through --plan, and the budget's reserves for a full run and a rerun.
# No GPU needed. usage: gpu_run_only_failed_test.sh PATH/TO/gpu-run.sh
set -u -o pipefail
RUN_SH=$1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
B=$WORK/bundle
mkdir -p "$B/bin"
cp "$RUN_SH" "$B/run.sh"
export FAKE_LOG=$WORK/calls.log
fails=0
check() {  # check WHAT EXPECTED ACTUAL
  if [[ "$2" != "$3" ]]; then
    printf 'FAIL: %s\n--- expected\n%s\n--- got\n%s\n' "$1" "$2" "$3" >&2
    fails=$((fails + 1))
  fi
}

printf '%s\n' "a_test Suite/A.*/cuda" "b_test B.*" "c_test C.*:D.*" >"$B/gpu-tests.txt"
printf 'commit: 0123abc\nuncommitted files: 0\nnvcc: Build cuda_13.0 (fake)\n' >"$B/BUILD_INFO"

# A gtest binary: `fake_test FAILING...` fails those tests; `crash` in the list exits 2 first.
make_test() {
  local name=$1
  shift
  cat >"$B/bin/$name" <<SH
#!/usr/bin/env bash
echo "$name \$*" >>"\$FAKE_LOG"
for a; do case \$a in --gtest_filter=*) filter=\${a#*=} ;; --gtest_output=xml:*) xml=\${a#*xml:} ;; esac; done
for f in $*; do [[ \$f == crash ]] && exit 2; done
{
  echo '<testsuites>'
  for t in One Two Three; do
    echo "  <testcase name=\"\$t/cuda\" status=\"run\" classname=\"Suite/$name\">"
    for f in $*; do [[ \$f == \$t ]] && echo '    <failure message="planted" />'; done
    echo '  </testcase>'
  done
  echo '</testsuites>'
} >"\$xml"
for f in $*; do [[ ,\$filter, == *\$f* ]] && exit 1; done
[[ \$filter == *'*'* && -n "$*" ]] && exit 1
exit 0
SH
  chmod +x "$B/bin/$name"
}
make_test a_test Two
make_test b_test
make_test c_test crash
cat >"$B/bin/ferry" <<'SH'
#!/usr/bin/env bash
echo "ferry $*" >>"$FAKE_LOG"
[[ "$1 $2" == "run dequant-train" ]] && exit 1
exit 0
SH
cat >"$B/bin/cuda_bench" <<'SH'
#!/usr/bin/env bash
if [[ "$*" == *--benchmark_list_tests* ]]; then printf '%s\n' BM_A/1 BM_A/2 BM_B BM_C/x:1; exit 0; fi
echo "cuda_bench $*" >>"$FAKE_LOG"
for a; do case $a in --benchmark_out=*) out=${a#*=} ;; --benchmark_filter=*) filter=${a#*=} ;; esac; done
[[ $filter == *BM_B* ]] && exit 1
fam=${filter#^}; fam=${fam%%(*}
echo "{\"benchmarks\": [{\"name\": \"$fam/1\", \"real_time\": 1.5, \"time_unit\": \"us\"}]}" >"$out"
SH
for e in own_kernel foreign_stream lazy_queue; do
  printf '#!/usr/bin/env bash\necho "%s $*" >>"$FAKE_LOG"\n[[ %s == lazy_queue ]] && exit 1\nexit 0\n' "$e" "$e" >"$B/bin/$e"
done
chmod +x "$B"/bin/*

# 1. The full run: fails, and its summary lists what failed.
OUT=$WORK/first FERRY_GPU_SECONDS=420 bash "$B/run.sh" >"$WORK/first.out" 2>&1
check "the first run's exit status" 1 "$?"
summary=$WORK/first/summary.md
check "summary head" "- commit: 0123abc (0 uncommitted files)" "$(grep -m1 '^- commit:' "$summary")"
for k in device driver toolkit; do
  grep -q "^- $k: " "$summary" || { echo "FAIL: no '$k' line at the top of summary.md" >&2; fails=$((fails + 1)); }
done
grep -q '^| BM_A/1 | 1.5 | us |' "$summary" || { echo "FAIL: BM_A's figures lost beside the failed BM_B" >&2; fails=$((fails + 1)); }
check "first run: every planned step ran (three doctors, three test binaries, three workloads, three families, three examples)" 15 "$(wc -l <"$FAKE_LOG")"

# 2. --only-failed on it: exactly the failed things, the failed tests by name.
cp "$summary" "$B/first-summary.md"
: >"$FAKE_LOG"
OUT=$WORK/second FERRY_GPU_SECONDS=420 bash "$B/run.sh" --only-failed >"$WORK/second.out" 2>&1
expected=$(printf '%s\n' \
  "ferry doctor --backend cuda" \
  "a_test --gtest_filter=Suite/a_test.Two/cuda" \
  "c_test --gtest_filter=C.*:D.*" \
  "ferry run dequant-train --backend cuda" \
  "cuda_bench --benchmark_filter=^BM_B(/|\$)" \
  "lazy_queue --backend cuda")
got=$(sed -E 's/ --(gtest_output|gtest_color|quiet|report|benchmark_out|benchmark_out_format)(=[^ ]*)?( [^-][^ ]*)?//g' "$FAKE_LOG")
check "--only-failed reran exactly what failed" "$expected" "$got"
grep -q -- '--only-failed, from' "$WORK/second/summary.md" || { echo "FAIL: the rerun's summary does not say it was one" >&2; fails=$((fails + 1)); }

# 3. A planted summary: out of time, no time left, a timed-out family, a passing binary.
cat >"$WORK/planted.md" <<'MD'
# ferry GPU run

## Steps

| step | status | seconds | log |
|---|---|---|---|
| ferry doctor --backend cuda | ok | 1 | doctor.txt |
| tests a_test | TIMED OUT after 40s | 40 | test-a_test.log |
| tests b_test | skipped: no time left | 0 | |
| tests c_test | ok | 3 | test-c_test.log |
| ferry run moe-offload --backend cuda | ok | 9 | run-moe-offload.log |
| cuda_bench BM_C | TIMED OUT after 20s | 20 | bench-BM_C.log |
| example own_kernel --backend cuda | ok | 1 | example-own_kernel.log |
| tools/torch-check.py | skipped: no PyTorch | 0 | |

## GPU tests (1 failed, 0 skipped)

Skipped, with the reason each gave:

- c_test: Suite/c_test.One/cuda: no GPU
MD
: >"$FAKE_LOG"
plan=$(FERRY_GPU_SECONDS=200 bash "$B/run.sh" --only-failed="$WORK/planted.md" --plan)
check "planted summary: the plan" "$(printf '%s\n' "doctor --backend cuda" "tests a_test --gtest_filter=Suite/A.*/cuda" \
  "tests b_test --gtest_filter=B.*" "cuda_bench BM_C" \
  "# budget 200s: reserves after doctor 188s, tests 70s, workloads 70s, benchmarks 0s, examples 0s")" "$plan"
check "--plan runs nothing" "" "$(cat "$FAKE_LOG")"
# A full plan at 200 s keeps the shares of the phases after the tests.
check "full plan's reserves" "# budget 200s: reserves after doctor 191s, tests 110s, workloads 56s, benchmarks 8s, examples 0s" \
  "$(FERRY_GPU_SECONDS=200 bash "$B/run.sh" --plan | tail -1)"
# An unreadable summary is a usage error, not a full run.
FERRY_GPU_SECONDS=200 bash "$B/run.sh" --only-failed="$WORK/none.md" --plan >/dev/null 2>&1
check "missing summary" 64 "$?"

if ((fails > 0)); then
  echo "--- first run's summary:" >&2; cat "$summary" >&2
  echo "gpu_run_only_failed_test: $fails checks failed" >&2
  exit 1
fi
echo "gpu_run_only_failed_test: all checks passed"
