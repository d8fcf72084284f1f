#!/usr/bin/env bash
# run.sh — ferry's GPU run, from a bundle made by tools/gpu-bundle (this file is copied there
# as run.sh). Runs, under ONE deadline (FERRY_GPU_SECONDS, default 540 of the 600 s one
# device call may run; each phase keeps a share of it for the phases after, so a short
# budget still reaches every phase):
#   ferry doctor --backend cuda (text and JSON), the GPU tests (gpu-tests.txt: each binary
#   with its explicit gtest filter, never a name regex), the three workloads on cuda, the
#   CUDA benchmarks (one process and one JSON file per family, so a cap loses only the
#   family it stopped), the examples with --backend cuda, and tools/torch-check.py where
#   PyTorch is installed.
# Writes exactly two files into $OUT (default ./out): ferry-gpu-run.tar.gz (every log, XML
# and JSON) and summary.md, headed by the device, driver, toolkit and commit.
#
# usage: run.sh [--only-failed[=SUMMARY]] [--plan]
#   --only-failed  reruns only what failed in an earlier run's summary.md (default
#                  SUMMARY: first-summary.md in the bundle): the failed tests of each test
#                  binary by name, a binary that crashed, timed out or got no time whole,
#                  and each failed workload, benchmark family, example and torch check;
#                  ferry doctor always runs.
#   --plan         prints the steps it would run, one a line, and exits 0.
#
# Exit status: 0 nothing failed and nothing was cut (on a machine without a GPU: every GPU
# step skipped and said why); 1 a step failed, a workload did not match, or a GPU is present
# and a GPU test skipped saying the backend is unavailable (a skip for a second device or for
# race checks cuda lacks is counted apart and fails nothing); 2 nothing failed but the budget
# cut a step (neither passed nor failed: --only-failed reruns it); 64 bad usage or an
# unreadable SUMMARY.
# Environment: FERRY_GPU_SECONDS, OUT, FERRY_CUBLAS_PATH (cuBLAS's file or folder, else
# found: the PyTorch wheel's nvidia/cu13/lib, $CUDA_HOME/lib64, the loader's path),
# CUDA_MODULE_LOADING (default EAGER here, so timings compare across runs; LAZY to compare).
set -u -o pipefail

BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ONLY_FAILED=
PLAN_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --only-failed) ONLY_FAILED=$BUNDLE/first-summary.md ;;
    --only-failed=*) ONLY_FAILED=${arg#--only-failed=} ;;
    --plan) PLAN_ONLY=1 ;;
    *) echo "usage: run.sh [--only-failed[=SUMMARY]] [--plan]" >&2; exit 64 ;;
  esac
done
if [[ -n "$ONLY_FAILED" && ! -r "$ONLY_FAILED" ]]; then
  echo "run.sh: --only-failed: cannot read $ONLY_FAILED (copy the first run's summary.md there)" >&2
  exit 64
fi
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
DEADLINE=$((START + ${FERRY_GPU_SECONDS:-540}))
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/ferry-gpu-run.XXXXXX")
STEPS=()
STATUS=0
BIN=$BUNDLE/bin
if [[ -f "$BUNDLE/bin.tar.gz" ]]; then  # tools/gpu-bundle gzips the binaries
  UNPACKED=$(mktemp -d "${TMPDIR:-/tmp}/ferry-gpu-bin.XXXXXX")
  tar -C "$UNPACKED" -xzf "$BUNDLE/bin.tar.gz" || { echo "run.sh: cannot unpack bin.tar.gz" >&2; exit 1; }
  BIN=$UNPACKED/bin
  trap 'rm -rf "$UNPACKED"' EXIT
fi

# step NAME LOG WANT RESERVE CMD...: runs CMD under timeout into $LOGS/LOG for WANT seconds,
# or fewer so that RESERVE seconds stay for the steps after, and adds a row. A step the
# budget gave less than WANT that ran out, or no time at all, is cut (CUT=1): neither passed
# nor failed, and --only-failed reruns it. One that ran out of its whole WANT is TIMED OUT,
# a failure (a hang looks like that).
CUT=0
CUTS=0
step() {
  local name=$1 log=$2 want=$3 reserve=$4
  shift 4
  local limit=$((DEADLINE - $(date +%s) - reserve))
  ((limit > want)) && limit=$want
  CUT=0
  if ((limit <= 0)); then
    STEPS+=("| $name | cut: no time left | 0 | |")
    CUT=1 CUTS=$((CUTS + 1))
    return 124
  fi
  local t0 rc verdict
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$LOGS/$log" 2>&1
  rc=$?
  verdict=ok
  if ((rc == 124 || rc == 137)); then
    if ((limit < want)); then
      verdict="cut: out of time after ${limit}s"
      CUT=1 CUTS=$((CUTS + 1))
    else
      verdict="TIMED OUT after ${limit}s"
    fi
  fi
  ((rc != 0 && rc != 124 && rc != 137)) && verdict="exit $rc"
  STEPS+=("| $name | $verdict | $(($(date +%s) - t0)) | $log |")
  return $rc
}

# --- The machine ---------------------------------------------------------------------
gpu_present=0
if [[ -e /proc/driver/nvidia/version ]] || { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
  gpu_present=1
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)"
  echo "bundle: $BUNDLE"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1
  else
    echo "nvidia-smi: not found"
  fi
  [[ -e /proc/driver/nvidia/version ]] && head -1 /proc/driver/nvidia/version
  echo "GPU present: $([[ $gpu_present == 1 ]] && echo yes || echo no)"
} >"$LOGS/machine.txt" 2>&1
cp "$BUNDLE/BUILD_INFO" "$LOGS/" 2>/dev/null

# --- Libraries: the bundle's, libstdc++ only when the machine's is too old, and cuBLAS ----
export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
need=$(sed -n 's/^glibcxx needed: //p' "$BUNDLE/BUILD_INFO" 2>/dev/null)
have_lib=$( (ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}'); true)
[[ -z "$have_lib" ]] && for f in /usr/lib/x86_64-linux-gnu/libstdc++.so.6 /usr/lib64/libstdc++.so.6; do [[ -f $f ]] && have_lib=$f && break; done
have=$([[ -n "$have_lib" ]] && grep -a -o 'GLIBCXX_[0-9][0-9.]*' "$have_lib" | sort -uV | tail -1)
stdcxx_note="the machine's ($have_lib, up to ${have:-none}; the bundle needs ${need:-?})"
if [[ -n "$need" ]] && { [[ -z "$have" ]] || [[ "$(printf '%s\n%s\n' "$have" "$need" | sort -V | tail -1)" != "$have" ]]; }; then
  export LD_LIBRARY_PATH=$BUNDLE/lib/fallback:$LD_LIBRARY_PATH
  stdcxx_note="the bundle's fallback (the machine's ${have_lib:-none} stops at ${have:-none}; ${need} needed)"
fi

cublas_note=
if [[ -n "${FERRY_CUBLAS_PATH:-}" ]]; then
  cublas_note="FERRY_CUBLAS_PATH=$FERRY_CUBLAS_PATH (given)"
else
  wheel=$(python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))' 2>/dev/null)
  if [[ -n "$wheel" && -e "$wheel/libcublas.so.13" ]]; then
    export FERRY_CUBLAS_PATH=$wheel
    cublas_note="the PyTorch wheel: $wheel"
  else
    for d in /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib /usr/local/lib/python3*/site-packages/nvidia/cu13/lib \
             /usr/lib/python3*/dist-packages/nvidia/cu13/lib "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64; do
      if [[ -e "$d/libcublas.so.13" ]]; then
        export FERRY_CUBLAS_PATH=$d
        cublas_note="found at $d"
        break
      fi
    done
  fi
  [[ -z "$cublas_note" ]] && cublas_note="not found by run.sh (ferry searches the loader's path itself)"
fi
export FERRY_TRACES_DIR=$BUNDLE/traces FERRY_LONG_TESTS=1 FERRY_CUDA_VERBOSE=1
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-EAGER}
export FERRY_LIBRARY=$BUNDLE/lib/libferry.so FERRY_TORCH_LIBRARY=$BUNDLE/lib/libferry_torch.so
export PYTHONPATH=$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
{
  echo "libstdc++: $stdcxx_note"
  echo "cuBLAS: $cublas_note"
  echo "CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} >>"$LOGS/machine.txt"

# --- The plan: what this run runs --------------------------------------------------------
# A full run plans everything; --only-failed plans what the SUMMARY says failed. Then the
# steps below run the plan, and --plan prints it.
declare -A TEST_FILTER=()   # every GPU test binary's filter, from gpu-tests.txt
TEST_ORDER=()
while read -r bin filter; do
  [[ -z "$bin" ]] && continue
  TEST_FILTER[$bin]=$filter
  TEST_ORDER+=("$bin")
done <"$BUNDLE/gpu-tests.txt"
ALL_WORKLOADS=(dense-stream moe-offload dequant-train)
ALL_EXAMPLES=(own_kernel foreign_stream lazy_queue)
# The benchmark families, in the order cuda_bench registers them.
mapfile -t ALL_FAMILIES < <("$BIN/cuda_bench" --benchmark_list_tests=true 2>/dev/null | sed 's|/.*||' | awk 'NF && !seen[$0]++')

PLAN_TESTS=()      # "BINARY FILTER"
PLAN_WORKLOADS=()
PLAN_FAMILIES=()
PLAN_EXAMPLES=()
PLAN_TORCH=0
PLAN_DOCTOR_ALL=1  # the JSON and default-backend doctors too (a rerun: the text one only)
if [[ -z "$ONLY_FAILED" ]]; then
  for bin in "${TEST_ORDER[@]}"; do PLAN_TESTS+=("$bin ${TEST_FILTER[$bin]}"); done
  PLAN_WORKLOADS=("${ALL_WORKLOADS[@]}")
  PLAN_FAMILIES=("${ALL_FAMILIES[@]}")
  [[ ${#ALL_FAMILIES[@]} -eq 0 ]] && PLAN_FAMILIES=(all)  # cuda_bench would not list: run it whole
  PLAN_EXAMPLES=("${ALL_EXAMPLES[@]}")
  [[ -f "$BUNDLE/tools/torch-check.py" ]] && PLAN_TORCH=1
else
  PLAN_DOCTOR_ALL=0
  # The steps table's rows whose status is neither ok nor a skip for a missing PyTorch.
  mapfile -t failed_steps < <(awk -F' [|] ' '/^## Steps/ {on = 1; next} /^## / {on = 0}
    on && /^\| / {name = substr($1, 3); if (name != "step" && $2 != "ok" && $2 !~ /^skipped: no PyTorch/) print name}' "$ONLY_FAILED")
  # The failed tests by name ("- BINARY: Suite.Test" under "Failed:").
  declare -A failed_tests=()
  while read -r bin name; do
    failed_tests[$bin]+="${failed_tests[$bin]:+:}$name"
  done < <(awk '/^Failed:$/ {on = 1; next} on && /^- / {sub(/^- /, ""); sub(/: /, " "); print; next} on {on = 0}' "$ONLY_FAILED")
  for step_name in "${failed_steps[@]}"; do
    case "$step_name" in
      "tests "*)
        bin=${step_name#tests }
        [[ -n "${TEST_FILTER[$bin]:-}" ]] || continue
        # By name where the binary said which failed; whole where it crashed, timed out or got no time.
        PLAN_TESTS+=("$bin ${failed_tests[$bin]:-${TEST_FILTER[$bin]}}") ;;
      "ferry run "*" --backend cuda") w=${step_name#ferry run }; PLAN_WORKLOADS+=("${w% --backend cuda}") ;;
      "cuda_bench") PLAN_FAMILIES=("${ALL_FAMILIES[@]:-all}") ;;
      "cuda_bench "*) PLAN_FAMILIES+=("${step_name#cuda_bench }") ;;
      "example "*" --backend cuda") e=${step_name#example }; PLAN_EXAMPLES+=("${e% --backend cuda}") ;;
      "tools/torch-check.py") [[ -f "$BUNDLE/tools/torch-check.py" ]] && PLAN_TORCH=1 ;;
    esac
  done
fi

# Shares of the budget, in seconds of a 540 s run: doctor 15, tests 230 (19 binaries, each
# paying CUDA's start), workloads 110, benchmarks 100, examples 15, torch 70 (four
# `import torch` processes take about 50). A phase with nothing planned gives its share to
# the others; each phase keeps, for the planned phases after it, their shares of the
# whole budget (reserve_after), so a short budget or a long test still reaches them.
TOTAL=${FERRY_GPU_SECONDS:-540}
declare -A WEIGHT=([doctor]=15 [tests]=230 [workloads]=110 [bench]=100 [examples]=15 [torch]=70)
PHASES=(doctor tests workloads bench examples torch)
declare -A PLANNED=([doctor]=1 [tests]=${#PLAN_TESTS[@]} [workloads]=${#PLAN_WORKLOADS[@]}
  [bench]=${#PLAN_FAMILIES[@]} [examples]=${#PLAN_EXAMPLES[@]} [torch]=$PLAN_TORCH)
weight_sum=0
for ph in "${PHASES[@]}"; do ((PLANNED[$ph] > 0)) && weight_sum=$((weight_sum + WEIGHT[$ph])); done
# share PHASE: its seconds of the budget.
share() { echo $((TOTAL * WEIGHT[$1] / weight_sum)); }
# reserve_after PHASE: the seconds the planned phases after it keep.
reserve_after() {
  local ph after=0 seen=0
  for ph in "${PHASES[@]}"; do
    ((seen && PLANNED[$ph] > 0)) && after=$((after + WEIGHT[$ph]))
    [[ $ph == "$1" ]] && seen=1
  done
  echo $((TOTAL * after / weight_sum))
}

if ((PLAN_ONLY)); then
  echo "doctor --backend cuda"
  ((PLAN_DOCTOR_ALL)) && echo "doctor --backend cuda --json" && echo "doctor"
  for t in "${PLAN_TESTS[@]}"; do echo "tests ${t% *} --gtest_filter=${t#* }"; done
  for w in "${PLAN_WORKLOADS[@]}"; do echo "run $w --backend cuda"; done
  for f in "${PLAN_FAMILIES[@]}"; do echo "cuda_bench $f"; done
  for e in "${PLAN_EXAMPLES[@]}"; do echo "example $e --backend cuda"; done
  ((PLAN_TORCH)) && echo "tools/torch-check.py"
  echo "# budget ${TOTAL}s: reserves after doctor $(reserve_after doctor)s, tests $(reserve_after tests)s, workloads $(reserve_after workloads)s, benchmarks $(reserve_after bench)s, examples $(reserve_after examples)s"
  rm -rf "$LOGS"
  exit 0
fi

# --- ferry doctor ------------------------------------------------------------------------
# The first doctor runs under any deadline (seconds when healthy): a short rerun still
# says what the device and driver are.
step "ferry doctor --backend cuda" doctor.txt 45 0 "$BIN/ferry" doctor --backend cuda
doctor_rc=$?
doctor_cut=$CUT
if ((PLAN_DOCTOR_ALL)); then
  step "ferry doctor --backend cuda --json" doctor.json 30 "$(reserve_after doctor)" "$BIN/ferry" doctor --backend cuda --json
  step "ferry doctor (default backend)" doctor-default.txt 30 "$(reserve_after doctor)" "$BIN/ferry" doctor
fi
((gpu_present == 1 && doctor_rc != 0 && !doctor_cut)) && STATUS=1

# --- GPU tests: one binary at a time (some take the whole device) -----------------------
tests_rows=()
unavailable_lines=()  # skips whose reason says the backend is unavailable
expected_lines=()     # skips a one-GPU machine without race checks always has
other_lines=()        # the device lacks a capability, cuBLAS is missing, ...
failed_lines=()
total_skipped=0
total_failed=0
# skip_kind REASON: unavailable, expected or other. On a GPU machine only an unavailable
# backend fails the run: the rest are answers about this machine, not start-up failures.
skip_kind() {
  case "$1" in
    *unavailable*|*"no CUDA device"*) echo unavailable ;;
    *"needs "*" CUDA devices"*|*"checks no races"*) echo expected ;;
    *) echo other ;;
  esac
}
# One binary may take three quarters of the tests' share: a hang leaves time for the rest.
test_cap=$(($(share tests) * 3 / 4))
for planned in "${PLAN_TESTS[@]}"; do
  bin=${planned%% *}
  filter=${planned#* }
  xml=$LOGS/test-$bin.xml
  step "tests $bin" "test-$bin.log" "$test_cap" "$(reserve_after tests)" "$BIN/$bin" --gtest_filter="$filter" \
    --gtest_output="xml:$xml" --gtest_color=no
  rc=$?
  if [[ -s "$xml" ]]; then
    n=$(grep -c '<testcase ' "$xml")
    skipped=$(grep -c '<skipped' "$xml")
    failed=$(awk '/<testcase /{name=$0} /<failure/{print name}' "$xml" | sort -u | wc -l)
  else
    n=0 skipped=0 failed=0
  fi
  ((rc != 0 && !CUT && failed == 0)) && failed=1   # a crash or a timeout before the XML
  ((rc != 0 && !CUT)) && STATUS=1
  total_skipped=$((total_skipped + skipped))
  total_failed=$((total_failed + failed))
  tests_rows+=("| $bin | \`$filter\` | $n | $((n - skipped - failed < 0 ? 0 : n - skipped - failed)) | $failed | $skipped | $( ((CUT)) && echo cut || echo "$rc") |")
  # Each skipped test with its reason (the first line of gtest's message).
  while IFS= read -r line; do
    case $(skip_kind "${line#- *: *: }") in
      unavailable) unavailable_lines+=("$line") ;;
      expected) expected_lines+=("$line") ;;
      *) other_lines+=("$line") ;;
    esac
  done < <(awk -v b="$bin" '
    /<testcase /{match($0, /name="[^"]*"/); n=substr($0, RSTART+6, RLENGTH-7); match($0, /classname="[^"]*"/); c=substr($0, RSTART+11, RLENGTH-12)}
    /<skipped/{m=$0; if (match(m, /message="[^"]*"/)) m=substr(m, RSTART+9, RLENGTH-10); else m=""; sub(/^[^&]*:[0-9]+&#x0A;/, "", m); gsub(/&#x0A;.*/, "", m); gsub(/&quot;/, "\"", m); print "- " b ": " c "." n ": " m}' "$xml" 2>/dev/null)
  while IFS= read -r line; do failed_lines+=("$line"); done < <(awk -v b="$bin" '
    /<testcase /{match($0, /name="[^"]*"/); n=substr($0, RSTART+6, RLENGTH-7); match($0, /classname="[^"]*"/); c=substr($0, RSTART+11, RLENGTH-12)}
    /<failure/{print "- " b ": " c "." n}' "$xml" 2>/dev/null | sort -u)
done
((gpu_present == 1 && ${#unavailable_lines[@]} > 0)) && STATUS=1

# --- Workloads on cuda (cuBLAS GEMMs, checked bit for bit against the host) -------------
run_rows=()
# One workload may take 70 % of the share: dequant-train computes its host reference (bit-exact
# GEMMs) before it touches the device.
run_cap=$(($(share workloads) * 7 / 10))
for w in "${PLAN_WORKLOADS[@]}"; do
  step "ferry run $w --backend cuda" "run-$w.log" "$run_cap" "$(reserve_after workloads)" "$BIN/ferry" run "$w" --backend cuda \
    --quiet --report "$LOGS/run-$w.json"
  rc=$?
  ((gpu_present == 1 && rc != 0 && !CUT)) && STATUS=1
  row=$([[ -s "$LOGS/run-$w.json" ]] && python3 - "$LOGS/run-$w.json" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
t, m = r["time"], r["memory"]
print("| %s | %s | %s | %.3f | %.0f | %.3f ms | %.2f MiB | %.3f |" % (
    r["workload"], r["matched"], r.get("matmul", "?"), t["overlap_efficiency"],
    r["throughput"]["tokens_per_s"], t["wall_ns"] / 1e6, m["peak_live_bytes"] / 2**20,
    m["fragmentation_ratio"]))
PY
)
  run_rows+=("${row:-| $w | no report (exit $rc): $(tail -1 "$LOGS/run-$w.log" 2>/dev/null | tr '|' '/') | | | | | | |}")
done

# --- CUDA benchmarks: one process and one JSON file per family ---------------------------
# A family stopped by its cap loses its own figures only; the others' files are complete.
bench_cap=$(($(share bench) / 2))
bench_failed=()
for fam in "${PLAN_FAMILIES[@]}"; do
  if [[ $fam == all ]]; then
    step "cuda_bench" bench-cuda.log "$(share bench)" "$(reserve_after bench)" "$BIN/cuda_bench" \
      --benchmark_out="$LOGS/bench-all.json" --benchmark_out_format=json
  else
    step "cuda_bench $fam" "bench-$fam.log" "$bench_cap" "$(reserve_after bench)" "$BIN/cuda_bench" \
      --benchmark_filter="^$fam(/|\$)" --benchmark_out="$LOGS/bench-$fam.json" --benchmark_out_format=json
  fi
  rc=$?
  ((rc != 0)) && bench_failed+=("$fam")
  ((gpu_present == 1 && rc != 0 && !CUT)) && STATUS=1
done
bench_table=$(python3 - "$LOGS"/bench-*.json <<'PY' 2>/dev/null
import json, sys
rows = ["| benchmark | time | unit | rate / counters |", "|---|---|---|---|"]
skip = {"real_time", "cpu_time", "iterations", "bytes_per_second", "items_per_second", "repetitions",
        "repetition_index", "threads", "family_index", "per_family_instance_index"}
for path in sys.argv[1:]:
    try:
        data = json.load(open(path))
    except (OSError, ValueError):
        continue  # a family stopped before it wrote its file
    for b in data.get("benchmarks", []):
        if b.get("error_occurred"):
            rows.append("| %s | skipped | | %s |" % (b.get("name", "?"), b.get("error_message", "")))
            continue
        rate = "%.2f GB/s" % (b["bytes_per_second"] / 1e9) if "bytes_per_second" in b else ""
        extra = [k + "=" + ("%.4g" % v) for k, v in b.items() if isinstance(v, (int, float)) and k not in skip]
        rows.append("| %s | %.4g | %s | %s |" % (b.get("name", "?"), b.get("real_time", 0), b.get("time_unit", ""),
                                                " ".join([rate] + extra).strip()))
if len(rows) > 2:
    print("\n".join(rows))
PY
)

# --- Examples with --backend cuda -----------------------------------------------------------
for e in "${PLAN_EXAMPLES[@]}"; do
  step "example $e --backend cuda" "example-$e.log" 20 "$(reserve_after examples)" "$BIN/$e" --backend cuda
  rc=$?
  ((gpu_present == 1 && rc != 0 && !CUT)) && STATUS=1
done

# --- PyTorch ------------------------------------------------------------------------------
torch_note="not run"
if ((PLAN_TORCH)); then
  if python3 -c 'import torch' >/dev/null 2>&1; then
    step "tools/torch-check.py" torch-check.log 120 5 python3 "$BUNDLE/tools/torch-check.py"
    rc=$?
    ((rc != 0 && !CUT)) && STATUS=1
    torch_note=$(tail -15 "$LOGS/torch-check.log")
  else
    torch_note="PyTorch is not installed here: skipped"
    STEPS+=("| tools/torch-check.py | skipped: no PyTorch | 0 | |")
  fi
fi

# --- Summary and archive ------------------------------------------------------------------
verdict="every step passed"
((gpu_present == 0)) && verdict="no GPU on this machine: the GPU steps ran and skipped (reasons below)"
((STATUS != 0)) && verdict="FAILED: see the rows marked exit/TIMED OUT, and the failed tests"
((gpu_present == 1 && ${#unavailable_lines[@]} > 0)) &&
  verdict="FAILED: a GPU is present but ${#unavailable_lines[@]} GPU tests skipped saying the backend is unavailable"
EXIT=$STATUS
if ((CUTS > 0)); then
  if ((STATUS == 0)); then
    verdict="INCOMPLETE: nothing failed, but" EXIT=2
  else
    verdict="$verdict; and"
  fi
  verdict="$verdict $CUTS steps were cut by the budget (neither passed nor failed; --only-failed reruns them)"
fi
# skip_list TITLE LINE...: one group of skipped tests, when it has any.
skip_list() {
  local title=$1
  shift
  (($# == 0)) && return
  printf '\n%s: %s\n\n' "$#" "$title"
  printf '%s\n' "$@" | head -200
}
# The head: device, driver, toolkit, commit.
smi_line=$( (nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1) || true)
device=${smi_line%%,*}
driver=$(echo "$smi_line" | awk -F', *' '{print $3}')
[[ -z "$driver" && -e /proc/driver/nvidia/version ]] && driver=$(head -1 /proc/driver/nvidia/version)
driver_cuda=$( (nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1) || true)
built_with=$(sed -n 's/^nvcc: //p' "$BUNDLE/BUILD_INFO" 2>/dev/null)
commit=$(sed -n 's/^commit: //p' "$BUNDLE/BUILD_INFO" 2>/dev/null)
uncommitted=$(sed -n 's/^uncommitted files: //p' "$BUNDLE/BUILD_INFO" 2>/dev/null)
{
  echo "# ferry GPU run"
  echo
  echo "- device: ${device:-none found ($(grep -m1 'nvidia-smi' "$LOGS/machine.txt" 2>/dev/null || echo 'no GPU'))}${smi_line:+ (${smi_line#*, })}"
  echo "- driver: ${driver:-none}${driver_cuda:+ ($driver_cuda)}"
  echo "- toolkit: bundle built with ${built_with:-unknown}; nvcc here: $( (nvcc --version 2>/dev/null | tail -1) || true)"
  echo "- commit: ${commit:-unknown}${uncommitted:+ ($uncommitted uncommitted files)}"
  echo "- run: $([[ -n "$ONLY_FAILED" ]] && echo "--only-failed, from $ONLY_FAILED" || echo full), budget ${TOTAL} s"
  echo
  echo "Verdict: **$verdict**. Exit status $EXIT. Total $(($(date +%s) - START)) s of ${TOTAL}."
  echo
  echo '```'
  cat "$LOGS/machine.txt"
  cat "$BUNDLE/BUILD_INFO" 2>/dev/null
  echo '```'
  echo
  echo "## Steps"
  echo
  echo "| step | status | seconds | log |"
  echo "|---|---|---|---|"
  printf '%s\n' "${STEPS[@]}"
  echo
  echo "## GPU tests ($total_failed failed, $total_skipped skipped: ${#unavailable_lines[@]} backend unavailable, ${#expected_lines[@]} expected here, ${#other_lines[@]} other)"
  echo
  echo "| binary | filter | tests | passed | failed | skipped | exit |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${tests_rows[@]}"
  if ((${#failed_lines[@]} > 0)); then
    echo
    echo "Failed:"
    printf '%s\n' "${failed_lines[@]}"
  fi
  if ((total_skipped > 0)); then
    echo
    echo "Skipped, with the reason each gave:"
    skip_list "the backend is unavailable (on a GPU machine each fails the run)" "${unavailable_lines[@]}"
    skip_list "expected on this machine (needs two devices; checks no races)" "${expected_lines[@]}"
    skip_list "other reasons (the device or the machine lacks what the test needs)" "${other_lines[@]}"
  fi
  echo
  echo "## ferry doctor --backend cuda"
  echo
  echo '```'
  tail -25 "$LOGS/doctor.txt" 2>/dev/null
  echo '```'
  echo
  echo "## ferry run on cuda"
  echo
  echo "| workload | matched | matmul | overlap | tokens/s | wall | peak live | peak reserved / live |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${run_rows[@]}"
  echo
  echo "## cuda_bench"
  echo
  if [[ -n "$bench_table" ]]; then echo "$bench_table"; else echo "no figures."; fi
  if ((${#bench_failed[@]} > 0)); then
    echo
    echo "Families without figures (their steps above failed or ran out of time): ${bench_failed[*]}"
  fi
  echo
  echo "## tools/torch-check.py"
  echo
  echo '```'
  echo "$torch_note"
  echo '```'
} >"$OUT/summary.md"
cp "$OUT/summary.md" "$LOGS/"
tar -czf "$OUT/ferry-gpu-run.tar.gz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"
rm -rf "$LOGS"
echo "run.sh: $verdict (exit $EXIT); $OUT/summary.md and $OUT/ferry-gpu-run.tar.gz"
exit $EXIT
