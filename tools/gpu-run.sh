#!/usr/bin/env bash
# run.sh — ferry's GPU run, from a bundle made by tools/gpu-bundle (this file is copied there
# as run.sh). Runs, under ONE deadline (FERRY_GPU_SECONDS, default 420; each step gets what
# is left, through `timeout`):
#   ferry doctor --backend cuda (text and JSON), the GPU tests (gpu-tests.txt: each binary
#   with its explicit gtest filter, never a name regex), the three workloads on cuda, the
#   CUDA benchmarks (JSON), the examples with --backend cuda, and tools/torch-check.py where
#   PyTorch is installed.
# Writes exactly two files into $OUT (default ./out): ferry-gpu-run.tar.gz (every log, XML
# and JSON) and summary.md.
#
# Exit status: 0 nothing failed (on a machine without a GPU: every GPU step skipped and said
# why); 1 a step failed, a workload did not match, or a GPU is present and GPU tests skipped.
# Environment: FERRY_GPU_SECONDS, OUT, FERRY_CUBLAS_PATH (cuBLAS's file or folder, else
# found: the PyTorch wheel's nvidia/cu13/lib, $CUDA_HOME/lib64, the loader's path).
set -u -o pipefail

BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
START=$(date +%s)
DEADLINE=$((START + ${FERRY_GPU_SECONDS:-420}))
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

# cap N [RESERVE]: N seconds, or less so that RESERVE seconds stay for the steps after.
cap() {
  local n=$1 room=$((DEADLINE - $(date +%s) - ${2:-0}))
  ((room < n)) && n=$room
  echo "$n"
}
# step NAME LOG LIMIT CMD...: runs CMD under timeout into $LOGS/LOG, adds a row.
step() {
  local name=$1 log=$2 limit=$3
  shift 3
  if ((limit <= 0)); then
    STEPS+=("| $name | skipped: no time left | 0 | |")
    return 124
  fi
  local t0 rc verdict
  t0=$(date +%s)
  timeout --kill-after=5 "$limit" "$@" >"$LOGS/$log" 2>&1
  rc=$?
  verdict=ok
  ((rc == 124 || rc == 137)) && verdict="TIMED OUT after ${limit}s"
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
export FERRY_LIBRARY=$BUNDLE/lib/libferry.so FERRY_TORCH_LIBRARY=$BUNDLE/lib/libferry_torch.so
export PYTHONPATH=$BUNDLE/python${PYTHONPATH:+:$PYTHONPATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
{
  echo "libstdc++: $stdcxx_note"
  echo "cuBLAS: $cublas_note"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} >>"$LOGS/machine.txt"

# --- ferry doctor ------------------------------------------------------------------------
# Later steps' minimum shares: tests 150, workloads 45, bench 60, examples 15, torch 60.
# The first doctor runs under any deadline (seconds when healthy): a short rerun
# (FERRY_GPU_SECONDS=200) still says what the device and driver are.
step "ferry doctor --backend cuda" doctor.txt "$(cap 45)" "$BIN/ferry" doctor --backend cuda
doctor_rc=$?
step "ferry doctor --backend cuda --json" doctor.json "$(cap 30 180)" "$BIN/ferry" doctor --backend cuda --json
step "ferry doctor (default backend)" doctor-default.txt "$(cap 30 180)" "$BIN/ferry" doctor
((gpu_present == 1 && doctor_rc != 0)) && STATUS=1

# --- GPU tests: one binary at a time (some take the whole device) -----------------------
tests_rows=()
skipped_lines=()
failed_lines=()
total_skipped=0
total_failed=0
while read -r bin filter; do
  [[ -z "$bin" ]] && continue
  xml=$LOGS/test-$bin.xml
  step "tests $bin" "test-$bin.log" "$(cap 150 180)" "$BIN/$bin" --gtest_filter="$filter" \
    --gtest_output="xml:$xml" --gtest_color=no
  rc=$?
  if [[ -s "$xml" ]]; then
    n=$(grep -c '<testcase ' "$xml")
    skipped=$(grep -c '<skipped' "$xml")
    failed=$(awk '/<testcase /{name=$0} /<failure/{print name}' "$xml" | sort -u | wc -l)
  else
    n=0 skipped=0 failed=0
  fi
  ((rc != 0 && failed == 0)) && failed=1   # a crash or a timeout before the XML
  ((rc != 0)) && STATUS=1
  total_skipped=$((total_skipped + skipped))
  total_failed=$((total_failed + failed))
  tests_rows+=("| $bin | \`$filter\` | $n | $((n - skipped - failed < 0 ? 0 : n - skipped - failed)) | $failed | $skipped | $rc |")
  # Each skipped test with its reason (the first line of gtest's message).
  while IFS= read -r line; do skipped_lines+=("$line"); done < <(awk -v b="$bin" '
    /<testcase /{match($0, /name="[^"]*"/); n=substr($0, RSTART+6, RLENGTH-7); match($0, /classname="[^"]*"/); c=substr($0, RSTART+11, RLENGTH-12)}
    /<skipped/{m=$0; if (match(m, /message="[^"]*"/)) m=substr(m, RSTART+9, RLENGTH-10); else m=""; sub(/^[^&]*:[0-9]+&#x0A;/, "", m); gsub(/&#x0A;.*/, "", m); gsub(/&quot;/, "\"", m); print "- " b ": " c "." n ": " m}' "$xml" 2>/dev/null)
  while IFS= read -r line; do failed_lines+=("$line"); done < <(awk -v b="$bin" '
    /<testcase /{match($0, /name="[^"]*"/); n=substr($0, RSTART+6, RLENGTH-7); match($0, /classname="[^"]*"/); c=substr($0, RSTART+11, RLENGTH-12)}
    /<failure/{print "- " b ": " c "." n}' "$xml" 2>/dev/null | sort -u)
done <"$BUNDLE/gpu-tests.txt"
if ((gpu_present == 1 && total_skipped > 0)); then
  STATUS=1
fi

# --- Workloads on cuda (cuBLAS GEMMs, checked bit for bit against the host) -------------
run_rows=()
for w in dense-stream moe-offload dequant-train; do
  step "ferry run $w --backend cuda" "run-$w.log" "$(cap 60 135)" "$BIN/ferry" run "$w" --backend cuda \
    --quiet --report "$LOGS/run-$w.json"
  rc=$?
  ((gpu_present == 1 && rc != 0)) && STATUS=1
  row=$(python3 - "$LOGS/run-$w.json" <<'PY' 2>/dev/null
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

# --- CUDA benchmarks --------------------------------------------------------------------
step "cuda_bench" bench-cuda.log "$(cap 150 75)" "$BIN/cuda_bench" --benchmark_out="$LOGS/bench-cuda.json" \
  --benchmark_out_format=json
bench_rc=$?
((gpu_present == 1 && bench_rc != 0)) && STATUS=1
bench_table=$(python3 - "$LOGS/bench-cuda.json" <<'PY' 2>/dev/null
import json, sys
data = json.load(open(sys.argv[1]))
rows = ["| benchmark | time | unit | rate / counters |", "|---|---|---|---|"]
skip = {"real_time", "cpu_time", "iterations", "bytes_per_second", "items_per_second", "repetitions",
        "repetition_index", "threads", "family_index", "per_family_instance_index"}
for b in data.get("benchmarks", []):
    if b.get("error_occurred"):
        rows.append("| %s | skipped | | %s |" % (b.get("name", "?"), b.get("error_message", "")))
        continue
    rate = "%.2f GB/s" % (b["bytes_per_second"] / 1e9) if "bytes_per_second" in b else ""
    extra = [k + "=" + ("%.4g" % v) for k, v in b.items() if isinstance(v, (int, float)) and k not in skip]
    rows.append("| %s | %.4g | %s | %s |" % (b.get("name", "?"), b.get("real_time", 0), b.get("time_unit", ""),
                                            " ".join([rate] + extra).strip()))
print("\n".join(rows))
PY
)

# --- Examples with --backend cuda -----------------------------------------------------------
for e in own_kernel foreign_stream lazy_queue; do
  step "example $e --backend cuda" "example-$e.log" "$(cap 20 60)" "$BIN/$e" --backend cuda
  rc=$?
  ((gpu_present == 1 && rc != 0)) && STATUS=1
done

# --- PyTorch ------------------------------------------------------------------------------
torch_note="not run"
if [[ -f "$BUNDLE/tools/torch-check.py" ]]; then
  if python3 -c 'import torch' >/dev/null 2>&1; then
    step "tools/torch-check.py" torch-check.log "$(cap 120 5)" python3 "$BUNDLE/tools/torch-check.py"
    rc=$?
    ((rc != 0)) && STATUS=1
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
((gpu_present == 1 && total_skipped > 0)) && verdict="FAILED: a GPU is present but $total_skipped GPU tests skipped"
{
  echo "# ferry GPU run"
  echo
  echo "Verdict: **$verdict**. Exit status $STATUS. Total $(($(date +%s) - START)) s of ${FERRY_GPU_SECONDS:-420}."
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
  echo "## GPU tests ($total_failed failed, $total_skipped skipped)"
  echo
  echo "| binary | filter | tests | passed | failed | skipped | exit |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${tests_rows[@]}"
  if ((${#failed_lines[@]} > 0)); then
    echo
    echo "Failed:"
    printf '%s\n' "${failed_lines[@]}"
  fi
  if ((${#skipped_lines[@]} > 0)); then
    echo
    echo "Skipped, with the reason each gave:"
    echo
    printf '%s\n' "${skipped_lines[@]}" | head -200
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
  if [[ -n "$bench_table" ]]; then echo "$bench_table"; else echo "no JSON; the log ends:"; echo '```'; tail -5 "$LOGS/bench-cuda.log" 2>/dev/null; echo '```'; fi
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
echo "run.sh: $verdict (exit $STATUS); $OUT/summary.md and $OUT/ferry-gpu-run.tar.gz"
exit $STATUS
