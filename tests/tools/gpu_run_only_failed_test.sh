#!/usr/bin/env bash
# tools/gpu-run.sh (the bundle's run.sh) against a bundle of fake binaries that record how
# they were called: a full run whose fakes fail some tests, a workload, a benchmark family
# and an example; then `run.sh --only-failed` on that run's summary must rerun exactly
# those (the failed tests by name, a crashed binary whole) and nothing else. Then a
# hand-planted summary (a test binary that ran out of time or got none, a timed-out
# family) through --plan, and the budget's reserves for a full run and a rerun. Then a
# machine with one GPU (a fake nvidia-smi): skips that need a second device or race checks
# fail nothing, a skip for an unavailable backend fails the run; a budget that cuts every
# step records them as cut (exit 2), not failed, and the rerun plans them all again; a step
# stopped inside a short budget is cut, one stopped at its own limit TIMED OUT (failed).
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
  "# budget 200s: reserves after doctor 191s, tests 57s, workloads 57s, benchmarks 0s, examples 0s")" "$plan"
check "--plan runs nothing" "" "$(cat "$FAKE_LOG")"
# A full plan at 200 s keeps the shares of the phases after the tests.
check "full plan's reserves" "# budget 200s: reserves after doctor 193s, tests 95s, workloads 48s, benchmarks 6s, examples 0s" \
  "$(FERRY_GPU_SECONDS=200 bash "$B/run.sh" --plan | tail -1)"
# An unreadable summary is a usage error, not a full run.
FERRY_GPU_SECONDS=200 bash "$B/run.sh" --only-failed="$WORK/none.md" --plan >/dev/null 2>&1
check "missing summary" 64 "$?"

# 4. One GPU: the skips it always has are counted apart and fail nothing.
G=$WORK/gpu-bundle
mkdir -p "$G/bin" "$WORK/path"
cp "$RUN_SH" "$G/run.sh"
cp "$B/BUILD_INFO" "$G/"
echo "skip_test S.*" >"$G/gpu-tests.txt"
cat >"$WORK/path/nvidia-smi" <<'SH'
#!/usr/bin/env bash
case "$*" in
  -L) echo "GPU 0: Fake GPU (UUID: GPU-0)" ;;
  *query-gpu*) echo "Fake GPU, 81559 MiB, 999.0" ;;
  *) echo "CUDA Version: 13.0" ;;
esac
SH
# skip_test: one test skips with each reason in FAKE_SKIPS ('|' apart), one passes.
cat >"$G/bin/skip_test" <<'SH'
#!/usr/bin/env bash
for a; do case $a in --gtest_output=xml:*) xml=${a#*xml:} ;; esac; done
IFS='|' read -ra reasons <<<"$FAKE_SKIPS"
{
  echo '<testsuites>'
  echo '  <testcase name="Passes" status="run" result="completed" classname="S" />'
  i=0
  for r in "${reasons[@]}"; do
    i=$((i + 1))
    echo "  <testcase name=\"Skips$i\" status=\"run\" result=\"skipped\" classname=\"S\">"
    echo "    <skipped message=\"tests/s_test.cpp:$i&#x0A;$r\"><![CDATA[]]></skipped>"
    echo '  </testcase>'
  done
  echo '</testsuites>'
} >"$xml"
SH
printf '#!/usr/bin/env bash\nexit 0\n' >"$G/bin/ferry"
printf '#!/usr/bin/env bash\n[[ "$*" == *--benchmark_list_tests* ]] && echo BM_A\nexit 0\n' >"$G/bin/cuda_bench"
for e in foreign_stream lazy_queue; do printf '#!/usr/bin/env bash\nexit 0\n' >"$G/bin/$e"; done
printf '#!/usr/bin/env bash\nexit ${FAKE_EXAMPLE_RC:-0}\n' >"$G/bin/own_kernel"  # 124: as if timeout stopped it
chmod +x "$G"/bin/* "$WORK/path/nvidia-smi"
one_gpu=("needs two CUDA devices; this machine has 1" "needs 2 CUDA devices; this machine has 1" "this backend checks no races"
  "this device makes no native graphs")
FAKE_SKIPS=$(IFS='|'; echo "${one_gpu[*]}") PATH=$WORK/path:$PATH OUT=$WORK/gpu1 FERRY_GPU_SECONDS=420 \
  bash "$G/run.sh" >"$WORK/gpu1.out" 2>&1
check "one GPU, expected skips: exit status" 0 "$?"
check "one GPU, expected skips: the tests' head" "## GPU tests (0 failed, 4 skipped: 0 backend unavailable, 3 expected here, 1 other)" \
  "$(grep '^## GPU tests' "$WORK/gpu1/summary.md")"
grep -q '^Verdict: \*\*every step passed\*\*' "$WORK/gpu1/summary.md" || { echo "FAIL: one GPU's expected skips did not pass" >&2; fails=$((fails + 1)); }
FAKE_SKIPS="${one_gpu[0]}|backend cuda unavailable: no CUDA device or driver found" PATH=$WORK/path:$PATH OUT=$WORK/gpu2 \
  FERRY_GPU_SECONDS=420 bash "$G/run.sh" >"$WORK/gpu2.out" 2>&1
check "a GPU and an unavailable backend: exit status" 1 "$?"
grep -q 'FAILED: a GPU is present but 1 GPU tests skipped saying the backend is unavailable' "$WORK/gpu2/summary.md" ||
  { echo "FAIL: the unavailable backend's skip is not the verdict" >&2; fails=$((fails + 1)); }
grep -q '^- skip_test: S.Skips2: backend cuda unavailable' "$WORK/gpu2/summary.md" ||
  { echo "FAIL: the unavailable skip is not listed with its reason" >&2; fails=$((fails + 1)); }

# 5. A budget that cuts every step: cut, not failed, and all of it planned again.
: >"$FAKE_LOG"
OUT=$WORK/cut FERRY_GPU_SECONDS=0 bash "$B/run.sh" >"$WORK/cut.out" 2>&1
check "every step cut: exit status" 2 "$?"
check "every step cut: nothing ran" "" "$(cat "$FAKE_LOG")"
check "every step cut: rows" 15 "$(grep -c '| cut: no time left |' "$WORK/cut/summary.md")"
grep -q '^Verdict: \*\*INCOMPLETE: nothing failed, but 15 steps were cut' "$WORK/cut/summary.md" ||
  { echo "FAIL: the cut run's verdict" >&2; fails=$((fails + 1)); }
check "every step cut: the rerun plans them all" 13 \
  "$(FERRY_GPU_SECONDS=200 bash "$B/run.sh" --only-failed="$WORK/cut/summary.md" --plan | grep -vc '^#')"

# 6. A step stopped by time: cut when the budget gave it less than its own limit (20 s for
# an example, here at most 10), TIMED OUT (failed) when it had all of it.
FAKE_EXAMPLE_RC=124 PATH=$WORK/path:$PATH OUT=$WORK/short FERRY_GPU_SECONDS=10 bash "$G/run.sh" >"$WORK/short.out" 2>&1
check "an example stopped inside a short budget: exit status" 2 "$?"
check "an example stopped inside a short budget: its row" "| example own_kernel --backend cuda | cut:" \
  "$(grep -o '^| example own_kernel --backend cuda | cut:' "$WORK/short/summary.md")"
FAKE_EXAMPLE_RC=124 PATH=$WORK/path:$PATH OUT=$WORK/hang FERRY_GPU_SECONDS=420 bash "$G/run.sh" >"$WORK/hang.out" 2>&1
check "an example stopped at its own limit: exit status" 1 "$?"
check "an example stopped at its own limit: its row" "| example own_kernel --backend cuda | TIMED OUT after 20s |" \
  "$(grep -o '^| example own_kernel --backend cuda | TIMED OUT after 20s |' "$WORK/hang/summary.md")"

if ((fails > 0)); then
  echo "--- first run's summary:" >&2; cat "$summary" >&2
  echo "gpu_run_only_failed_test: $fails checks failed" >&2
  exit 1
fi
echo "gpu_run_only_failed_test: all checks passed"
