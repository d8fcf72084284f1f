// `ferry bench pool|fragmentation`: a quick measurement without Google Benchmark —
// the same workloads as bench/pool_bench.cpp (sizes and capacity search shared
// through replay/synthetic_traces.hpp, the replay layer's), timed with
// std::chrono::steady_clock. Figures for docs/performance.md still come from bench/.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "common_options.hpp"
#include "option_values.hpp"
#include "progress.hpp"
#include "subcommand.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/replay.hpp"
#include "replay/synthetic_traces.hpp"
#include "ferry/make_backend.hpp"

namespace ferry::cli {
namespace {

using nlohmann::ordered_json;

constexpr std::uint64_t kMinSize = 256;          // smallest request, as in BM_ChurnDevicePool
constexpr std::uint64_t kMaxLive = 1'000'000;
constexpr int kRepetitions = 5;
constexpr std::uint64_t kMaxIterations = 10'000'000;  // one 8-byte sample per pair

void print_json(const Io& io, const ordered_json& j) {
  io.out << j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << '\n';
}

// --- pool ------------------------------------------------------------------

struct PoolArgs {
  std::string profile = "h200";
  std::string streams = "1";
  std::string max_bytes = "1MiB";
  std::string iterations = "1000000";
  std::string live = "1000";
  bool json = false;
};

// The q-quantile of sorted samples (nearest rank).
std::uint64_t quantile(const std::vector<std::uint64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(q * double(sorted.size() - 1) + 0.5);
  return sorted[std::min(rank, sorted.size() - 1)];
}

int run_pool(const PoolArgs& args, const Io& io) {
  // The validators accepted every value; the ranges are checked here.
  const std::uint64_t streams = parse_u64(args.streams).value_or(0);
  const std::uint64_t max_bytes = parse_byte_size(args.max_bytes).value_or(0);
  const std::uint64_t iterations = parse_u64(args.iterations).value_or(0);
  const std::uint64_t live = parse_u64(args.live).value_or(0);
  const std::optional<DeviceProfile> profile = find_profile(args.profile);
  if (!profile) {
    io.err << "ferry bench pool: unknown profile \"" << args.profile << "\"\n";
    return kExitUsage;
  }
  if (streams < 1 || streams > kMaxStreams) {
    io.err << "ferry bench pool: --streams " << args.streams << ": must be 1.." << kMaxStreams << '\n';
    return kExitUsage;
  }
  if (live < 1 || live > kMaxLive) {
    io.err << "ferry bench pool: --live " << args.live << ": must be 1.." << kMaxLive << '\n';
    return kExitUsage;
  }
  if (max_bytes <= kMinSize || max_bytes > profile->capacity / (2 * live)) {
    io.err << "ferry bench pool: --max-bytes " << args.max_bytes << ": must be above " << kMinSize
           << " B and at most " << text::human_bytes(profile->capacity / (2 * live)) << " (the "
           << args.profile << "'s capacity / (2 x --live))\n";
    return kExitUsage;
  }
  if (iterations < kRepetitions || iterations > kMaxIterations) {
    io.err << "ferry bench pool: --iterations " << args.iterations << ": must be " << kRepetitions
           << ".." << kMaxIterations << '\n';
    return kExitUsage;
  }

  BackendSpec spec;
  spec.custom_profile = *profile;
  Result<std::unique_ptr<Backend>> sim = make_backend(spec);
  if (!sim.ok()) {
    io.err << "ferry bench pool: " << sim.error().message << '\n';
    return kExitFailed;
  }
  StreamOrder order(**sim);
  DevicePool pool(order);
  // The churn loop of bench/pool_bench.cpp (BM_ChurnDevicePool): `live` blocks
  // stay live; each pair frees one at random and allocates its replacement.
  synthetic::Churn churn(live, kMinSize, max_bytes, 42);
  std::vector<DeviceHandle> blocks(live);
  std::size_t made = 0;
  auto release_kept = [&] {
    for (std::size_t k = 0; k < made; ++k) (void)pool.free(blocks[k]);
  };
  for (; made < live; ++made) {
    auto h = pool.allocate(churn.initial(made), 0);
    if (!h.ok()) {
      io.err << "ferry bench pool: allocating live block " << made << " of " << churn.initial(made)
             << " B failed: " << h.error().message << '\n';
      release_kept();
      return kExitFailed;
    }
    blocks[made] = *h;
  }

  using Clock = std::chrono::steady_clock;
  const std::uint64_t per_rep = iterations / kRepetitions;
  std::vector<std::uint64_t> pair_ns;  // every timed pair, timer reads included
  pair_ns.reserve(per_rep * kRepetitions);
  std::vector<double> rep_mean_ns;
  std::uint64_t total_ns = 0;
  std::uint64_t i = 0;
  // Rep -1 is an untimed warm-up, so first-touch costs stay out of the figures.
  for (int rep = -1; rep < kRepetitions; ++rep) {
    const std::uint64_t pairs = rep < 0 ? std::min<std::uint64_t>(per_rep, 1000) : per_rep;
    const Clock::time_point rep_start = Clock::now();
    for (std::uint64_t n = 0; n < pairs; ++n, ++i) {
      const auto s = static_cast<StreamId>(i % streams);
      const synthetic::Churn::Step step = churn.next();
      const Clock::time_point t0 = Clock::now();
      const bool freed = pool.free(blocks[step.victim]).ok();
      Result<DeviceHandle> h = pool.allocate(step.bytes, s);
      const Clock::time_point t1 = Clock::now();
      if (!freed || !h.ok()) {
        io.err << "ferry bench pool: pair " << i << " (" << step.bytes << " B on stream " << s
               << ") failed: " << (h.ok() ? "free failed" : h.error().message) << '\n';
        if (h.ok()) (void)pool.free(*h);
        blocks[step.victim] = blocks[--made];  // the victim is gone either way
        release_kept();
        return kExitFailed;
      }
      blocks[step.victim] = *h;
      if (rep >= 0) {
        pair_ns.push_back(static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
      }
    }
    if (rep < 0) continue;
    const auto ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - rep_start).count());
    total_ns += ns;
    rep_mean_ns.push_back(double(ns) / double(pairs));
  }
  const std::uint64_t maps = pool.stats().maps;
  release_kept();

  std::sort(pair_ns.begin(), pair_ns.end());
  const std::uint64_t median = quantile(pair_ns, 0.5), p99 = quantile(pair_ns, 0.99);
  const double pairs_per_s =
      total_ns ? double(pair_ns.size()) * 1e9 / double(total_ns) : 0.0;

  if (args.json) {
    ordered_json j;
    j["bench"] = "pool";
    j["backend"] = to_string(BackendKind::sim);
    j["device"] = args.profile;
    j["streams"] = streams;
    j["min_bytes"] = kMinSize;
    j["max_bytes"] = max_bytes;
    j["live_blocks"] = live;
    j["loop"] = "churn";
    j["iterations"] = pair_ns.size();
    j["repetitions"] = kRepetitions;
    j["median_ns"] = median;
    j["p99_ns"] = p99;
    j["pairs_per_s"] = pairs_per_s;
    j["repetition_mean_ns"] = rep_mean_ns;
    j["maps"] = maps;
    print_json(io, j);
    return kExitOk;
  }
  char line[160];
  io.out << "pool churn on sim " << args.profile << ": " << pair_ns.size() << " free+allocate pairs ("
         << kRepetitions << " x " << per_rep << "), each frees one of " << live
         << " live blocks at random and allocates its replacement, sizes log-uniform "
         << text::human_bytes(kMinSize) << " - " << text::human_bytes(max_bytes) << ", " << streams
         << " stream(s)\n";
  std::snprintf(line, sizeof line, "  median   %llu ns/pair\n  p99      %llu ns/pair\n",
                static_cast<unsigned long long>(median), static_cast<unsigned long long>(p99));
  io.out << line;
  std::snprintf(line, sizeof line, "  rate     %.0f pairs/s\n", pairs_per_s);
  io.out << line;
  io.out << "  per repetition (mean ns/pair):";
  for (double m : rep_mean_ns) {
    std::snprintf(line, sizeof line, " %.0f", m);
    io.out << line;
  }
  io.out << "\n  maps     " << maps << '\n';
  return kExitOk;
}

// --- fragmentation -----------------------------------------------------------

struct FragmentationArgs {
  std::string file;
  std::string profile = "h200";
  bool json = false;
  bool quiet = false;
};

int run_fragmentation(const FragmentationArgs& args, const Io& io) {
  Result<std::string> text = read_trace_file(args.file);
  if (!text.ok()) {
    io.err << "ferry bench fragmentation: " << text.error().message << '\n';
    return text.error().code == ErrorCode::invalid_argument ? kExitUsage : kExitFailed;
  }
  // A PyTorch snapshot is imported once here, not once per replay of the search.
  std::optional<TorchSnapshotSource> source;
  if (is_torch_snapshot(*text)) {
    Result<TorchSnapshotImport> imported = import_torch_snapshot(*text, args.file);
    if (!imported.ok()) {
      io.err << "ferry bench fragmentation: " << imported.error().message << '\n';
      return imported.error().code == ErrorCode::invalid_argument ? kExitUsage : kExitFailed;
    }
    source = imported->source;
    *text = std::move(imported->trace);
  }
  ReplayOptions options;
  options.backend.profile = args.profile;
  options.trace_capacity = false;  // the search starts from the device's capacity, not the trace's
  Progress progress(io.err, is_terminal(io.err), "fragmentation", Progress::Lines::none);
  int replay = 0;
  if (!args.quiet) {
    options.on_step = [&](const ReplayStep& step) {
      if (step.index == 0) ++replay;
      progress.update("replay " + std::to_string(replay), step.index, step.total + 1);
    };
  }
  const synthetic::MinCapacity found = synthetic::min_capacity(*text, options);
  progress.finish();
  options.on_step = nullptr;
  if (!found.error.empty()) {
    // Replay once more under the file's name, to tell a malformed trace (usage)
    // from one that fails (a failed run) and to name the lines.
    options.capacity = 0;
    Result<ReplayReport> full = replay_trace_text(*text, args.file, options);
    if (!full.ok()) {
      const Error& e = full.error();
      const bool usage = e.code == ErrorCode::invalid_argument || e.code == ErrorCode::unsupported;
      io.err << (usage ? "" : "ferry bench fragmentation: ") << e.message << '\n';
      return usage ? kExitUsage : kExitFailed;
    }
    io.err << "ferry bench fragmentation: " << args.file
           << " does not pass even at the device's full capacity:\n"
           << report_summary(*full);
    return kExitFailed;
  }

  if (args.json) {
    ordered_json j;
    j["bench"] = "fragmentation";
    j["trace"] = args.file;
    j["backend"] = to_string(BackendKind::sim);
    j["device"] = args.profile;
    j["peak_live_bytes"] = found.peak_live;
    j["min_capacity_bytes"] = found.min_capacity;
    j["min_capacity_ratio"] = found.ratio();
    j["step_bytes"] = found.step;
    j["monotone"] = found.monotone;
    j["monotone_probes"] = found.monotone_probes;
    if (!found.monotone) j["first_failure_above_bytes"] = found.first_failure_above;
    j["replays"] = found.replays;
    if (source) {
      j["source"] = ordered_json::parse(source_json(*source));
    }
    print_json(io, j);
    return kExitOk;
  }
  char ratio[32];
  std::snprintf(ratio, sizeof ratio, "%.3f", found.ratio());
  io.out << "fragmentation of " << args.file << " on sim " << args.profile << '\n'
         << "  peak live          " << text::human_bytes(found.peak_live) << " (" << found.peak_live
         << " B)\n"
         << "  smallest capacity  " << text::human_bytes(found.min_capacity) << " (" << found.min_capacity
         << " B, to one step of " << text::human_bytes(found.step) << ")\n"
         << "  min capacity ratio " << ratio << " (smallest capacity / peak live)\n"
         << "  monotone           ";
  if (found.monotone) {
    io.out << "yes (smallest + 1.." << found.monotone_probes << " steps all pass)\n";
  } else {
    io.out << "NO: fails again at " << text::human_bytes(found.first_failure_above) << " ("
           << found.first_failure_above << " B)\n";
  }
  io.out << "  replays            " << found.replays << '\n';
  if (source) {
    io.out << "  PyTorch reserved " << text::human_bytes(source->peak_reserved_bytes) << ", ferry needs "
           << text::human_bytes(found.min_capacity) << " (" << source->peak_reserved_bytes << " B vs "
           << found.min_capacity << " B; device " << source->device << "'s history)\n";
  }
  return kExitOk;
}

CLI::Option* add_count_option(CLI::App& app, const std::string& name, std::string& value,
                              const std::string& description) {
  return app.add_option(name, value, description)
      ->check(checked([](const std::string& v) { return parse_u64(v); }, "UINT"))
      ->capture_default_str();
}

}  // namespace

Subcommand add_bench(CLI::App& parent) {
  auto pool = std::make_shared<PoolArgs>();
  auto frag = std::make_shared<FragmentationArgs>();
  CLI::App* app = parent.add_subcommand(
      "bench", "Quick measurements on the sim: pool alloc+free cost, a trace's fragmentation");
  app->require_subcommand(1);

  CLI::App* pool_app = app->add_subcommand(
      "pool", "Time the churn loop on the sim pool: free one of --live blocks at random, allocate its replacement");
  add_profile_option(*pool_app, pool->profile);
  add_count_option(*pool_app, "--streams", pool->streams,
                   "Streams the pairs rotate over, 1.." + std::to_string(kMaxStreams));
  pool_app->add_option("--max-bytes", pool->max_bytes,
                       std::string("Largest request: ") + kByteUnitsHelp)
      ->check(checked([](const std::string& v) { return parse_byte_size(v); }, "BYTES"))
      ->capture_default_str();
  add_count_option(*pool_app, "--iterations", pool->iterations,
                   "Pairs timed, split over " + std::to_string(kRepetitions) + " repetitions");
  add_count_option(*pool_app, "--live", pool->live,
                   "Blocks kept live, 1.." + std::to_string(kMaxLive));
  pool_app->add_flag("--json", pool->json, "Print one JSON object instead of the summary");
  pool_app->footer(
      "Each pair is timed with steady_clock (the two timer reads included); median and p99\n"
      "are over every pair of every repetition, pairs/s over the repetitions' wall time.\n"
      "A measurement, not a check: the figures depend on the machine and the build.\n"
      "Exit status: 0 ran; 1 an allocation failed; 2 bad option.");

  CLI::App* frag_app = app->add_subcommand(
      "fragmentation",
      "Smallest pool capacity at which a trace replays with no OOM, over its peak live bytes");
  add_trace_argument(*frag_app, "TRACE", frag->file);
  add_profile_option(*frag_app, frag->profile);
  frag_app->add_flag("--json", frag->json, "Print one JSON object instead of the summary");
  frag_app->add_flag("--quiet", frag->quiet, "No progress bar on a terminal's stderr");
  frag_app->footer(
      "Replays TRACE once at the device's capacity for its peak live bytes, then binary-searches\n"
      "the capacity over [peak, 3 x peak] in steps of one granule (the method of\n"
      "bench/pool_bench.cpp), then replays at the smallest + 1..16 granules: \"monotone\" says\n"
      "whether every one of them passed (more capacity must never make a trace fail).\n"
      "Exit status: 0 ran; 1 the trace fails even at full capacity; 2 malformed trace, one\n"
      "with no ops, or bad option.");

  return {app, [app, pool_app, frag_app, pool, frag](const Io& io) {
            if (pool_app->parsed()) return run_pool(*pool, io);
            if (frag_app->parsed()) return run_fragmentation(*frag, io);
            io.err << app->help();
            return kExitUsage;
          }};
}

}  // namespace ferry::cli
