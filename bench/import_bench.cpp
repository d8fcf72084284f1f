// Importing a PyTorch memory snapshot (issue 23): the time of
// import_torch_snapshot on a file of about 10^6 history entries, and the
// process's peak memory (file included) over the file's size at the first import.
//
//   tools/gen-torch-snapshots.py /tmp/snaps --entries 1000000
//   FERRY_BENCH_SNAPSHOT=/tmp/snaps/big.pickle build/release/bench/import_bench --benchmark_format=json
//
// Without FERRY_BENCH_SNAPSHOT the benchmark reports an error and measures nothing.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "ferry/torch_snapshot.hpp"

namespace {

void BM_ImportTorchSnapshot(benchmark::State& state) {
  const char* path = std::getenv("FERRY_BENCH_SNAPSHOT");
  if (path == nullptr) {
    state.SkipWithError("set FERRY_BENCH_SNAPSHOT to a snapshot (tools/gen-torch-snapshots.py DIR --entries N)");
    return;
  }
  std::string bytes;
  {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    bytes.resize(static_cast<std::size_t>(f.tellg()));
    f.seekg(0);
    f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::uint64_t events = 0, trace_bytes = 0;
  double peak = 0;
  for (auto _ : state) {
    ferry::Result<ferry::TorchSnapshotImport> imported = ferry::import_torch_snapshot(bytes, path);
    if (!imported.ok()) {
      state.SkipWithError(imported.error().message.c_str());
      return;
    }
    events = imported->source.events;
    trace_bytes = imported->trace.size();
    benchmark::DoNotOptimize(imported->trace.data());
    if (peak == 0) {
      // The first import's peak: later ones in the same process meet a heap the
      // C library kept from the first, which a one-shot `ferry import` never does.
      rusage usage{};
      getrusage(RUSAGE_SELF, &usage);
      peak = static_cast<double>(usage.ru_maxrss) * 1024.0;  // ru_maxrss is in KiB on Linux
    }
  }
  state.counters["file_bytes"] = static_cast<double>(bytes.size());
  state.counters["events"] = static_cast<double>(events);
  state.counters["trace_bytes"] = static_cast<double>(trace_bytes);
  state.counters["peak_rss_bytes"] = peak;
  state.counters["peak_rss_over_file"] = peak / static_cast<double>(bytes.size());
  state.counters["events_per_s"] =
      benchmark::Counter(static_cast<double>(events) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ImportTorchSnapshot)->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
