// The size distributions and allocation traces shared by the sim and the cuda
// benchmarks (pool_bench, cuda_bench), so that both measure the same workloads, and
// the capacity search that turns a trace into a min capacity ratio.
//
// Every generator is deterministic in its seed: changing one changes the figures in
// docs/performance.md for both backends.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ferry/device_profile.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/replay.hpp"

namespace ferry::synthetic {

// n sizes, log-uniform in [lo, hi).
inline std::vector<std::uint64_t> log_uniform_sizes(std::uint64_t lo, std::uint64_t hi,
                                                    std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(std::log2(double(lo)), std::log2(double(hi)));
  std::vector<std::uint64_t> out(n);
  for (auto& s : out) s = static_cast<std::uint64_t>(std::exp2(d(rng)));
  return out;
}

// The churn loop of issue 14: `live` blocks stay live; each step frees one of them
// at random and allocates its replacement, sizes log-uniform in [lo, hi). The bench
// binaries and `ferry bench pool` run it against DevicePool and the bare offset
// allocator alike, so the two figures come from one sequence. Draws cost a few
// instructions (a 4096-entry size table and splitmix64), so they stay small
// beside what is measured.
class Churn {
 public:
  struct Step {
    std::size_t victim = 0;   // index of the live block to free
    std::uint64_t bytes = 0;  // size of its replacement
  };
  Churn(std::size_t live, std::uint64_t lo, std::uint64_t hi, std::uint64_t seed)
      : sizes_(log_uniform_sizes(lo, hi, kSizes, seed)), live_(live), state_(seed) {}

  std::size_t live() const noexcept { return live_; }
  // The size of the i-th block of the initial live set.
  std::uint64_t initial(std::size_t i) const { return sizes_[i % kSizes]; }
  Step next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    // The high half picks the victim (multiply-shift, no division); the low bits the size.
    return {static_cast<std::size_t>(((z >> 32) * live_) >> 32), sizes_[z & (kSizes - 1)]};
  }

 private:
  static constexpr std::size_t kSizes = 4096;
  std::vector<std::uint64_t> sizes_;
  std::size_t live_;
  std::uint64_t state_;
};

// Report 003's dequantize pattern: a resident set, then frozen quantized
// weights uploaded, dequantized into a transient, used by one matmul and dropped,
// forward and backward.
inline std::string dequant_trace(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::ostringstream t;
  int id = 0;
  auto alloc = [&](std::uint64_t bytes, int stream) {
    t << R"({"op":"alloc","id":"b)" << id << R"(","bytes":)" << bytes << R"(,"stream":)" << stream
      << "}\n";
    return id++;
  };
  auto name = [](int i) { return "\"b" + std::to_string(i) + "\""; };
  std::vector<int> resident;
  for (int i = 0; i < 24; ++i) {
    resident.push_back(alloc((2 + rng() % 6) << 20, 0));
    t << R"({"op":"fill","id":)" << name(resident.back()) << R"(,"stream":0,"seed":)" << i << "}\n";
  }
  const int act = alloc(4 << 20, 0);
  t << R"({"op":"fill","id":)" << name(act) << R"(,"stream":0,"seed":7})" << "\n";
  for (int pass = 0; pass < 2; ++pass) {
    for (int w = 0; w < 130; ++w) {
      const std::uint64_t q_bytes = (1 + rng() % 8) << 19;  // 0.5 - 4 MiB int8
      const int q = alloc(q_bytes, 1);
      t << R"({"op":"upload","id":)" << name(q) << R"(,"stream":1,"seed":)" << w << "}\n";
      const int d = alloc(q_bytes * 2, 0);  // bf16 dequantized transient
      t << R"({"op":"compute","inputs":[)" << name(q) << R"(],"output":)" << name(d)
        << R"(,"stream":0})" << "\n";
      t << R"({"op":"free","id":)" << name(q) << "}\n";
      t << R"({"op":"compute","inputs":[)" << name(act) << "," << name(d) << R"(],"output":)"
        << name(act) << R"(,"stream":0})" << "\n";
      t << R"({"op":"free","id":)" << name(d) << "}\n";
    }
  }
  t << R"({"op":"sync"})" << "\n" << R"({"op":"check","id":)" << name(act) << "}\n";
  return t.str();
}

// Random mixed-size traffic, 256 B - `max_bytes`, on three streams: `allocs`
// allocations, frees at random keeping live bytes near `live_cap`.
inline std::string mixed_trace(std::uint64_t seed, std::size_t allocs = 1200,
                               std::uint64_t live_cap = std::uint64_t{96} << 20,
                               std::uint64_t max_bytes = std::uint64_t{24} << 20) {
  std::mt19937_64 rng(seed);
  const auto sizes = log_uniform_sizes(256, max_bytes, allocs, seed);
  std::ostringstream t;
  std::vector<std::pair<int, int>> live;  // id, stream
  std::uint64_t live_bytes = 0;
  std::vector<std::uint64_t> bytes_of;
  int id = 0;
  for (std::uint64_t size : sizes) {
    while (live_bytes > live_cap || (!live.empty() && rng() % 3 == 0)) {
      const std::size_t k = rng() % live.size();
      t << R"({"op":"free","id":"b)" << live[k].first << "\"}\n";
      live_bytes -= bytes_of[static_cast<std::size_t>(live[k].first)];
      live.erase(live.begin() + static_cast<long>(k));
    }
    const int s = static_cast<int>(rng() % 3);
    t << R"({"op":"alloc","id":"b)" << id << R"(","bytes":)" << size << R"(,"stream":)" << s << "}\n";
    if (rng() % 4 == 0)
      t << R"({"op":"fill","id":"b)" << id << R"(","stream":)" << s << R"(,"seed":)" << id << "}\n";
    bytes_of.push_back(size);
    live.emplace_back(id++, s);
    live_bytes += size;
  }
  return t.str();
}

// The soak (issue 15 item 17): exactly `ops` random operations — alloc, free,
// fill, upload, compute, check, sync, trim — on three streams, over at most 48
// ids live at once (an id is allocated again after its free), 256 B - 64 KiB
// each, so the replay's own state stays bounded however long the trace.
inline std::string soak_trace(std::size_t ops, std::uint64_t seed) {
  constexpr int kIds = 48;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_size(8.0, 16.0);
  std::ostringstream t;
  bool live[kIds] = {};
  const auto id = [](int k) { return "\"b" + std::to_string(k) + "\""; };
  const auto stream = [&] { return std::to_string(rng() % 3); };
  for (std::size_t line = 0; line < ops; ++line) {
    const int k = static_cast<int>(rng() % kIds);
    const unsigned r = static_cast<unsigned>(rng() % 100);
    if (!live[k]) {
      const auto bytes = static_cast<std::uint64_t>(std::exp2(log_size(rng)));
      t << R"({"op":"alloc","id":)" << id(k) << R"(,"bytes":)" << bytes << R"(,"stream":)" << stream() << "}\n";
      live[k] = true;
    } else if (r < 20) {
      t << R"({"op":"free","id":)" << id(k) << "}\n";
      live[k] = false;
    } else if (r < 45) {
      t << R"({"op":"fill","id":)" << id(k) << R"(,"stream":)" << stream() << R"(,"seed":)" << line << "}\n";
    } else if (r < 55) {
      t << R"({"op":"upload","id":)" << id(k) << R"(,"stream":)" << stream() << R"(,"seed":)" << line << "}\n";
    } else if (r < 72) {
      const int in = static_cast<int>(rng() % kIds);
      if (!live[in] || in == k) {
        t << R"({"op":"fill","id":)" << id(k) << R"(,"stream":)" << stream() << R"(,"seed":)" << line << "}\n";
      } else {
        t << R"({"op":"compute","inputs":[)" << id(in) << R"(],"output":)" << id(k) << R"(,"stream":)"
          << stream() << "}\n";
      }
    } else if (r < 88) {
      t << R"({"op":"check","id":)" << id(k) << "}\n";
    } else if (r < 96) {
      if (rng() % 2 == 0) {
        t << R"({"op":"sync"})" << "\n";
      } else {
        t << R"({"op":"sync","stream":)" << stream() << "}\n";
      }
    } else {
      t << R"({"op":"trim"})" << "\n";
    }
  }
  return t.str();
}

// The outcome of min_capacity(): min capacity ratio = min_capacity / peak_live.
struct MinCapacity {
  std::uint64_t peak_live = 0;     // peak requested live bytes, replayed at full capacity
  std::uint64_t min_capacity = 0;  // smallest capacity found with no OOM (to one step)
  std::uint64_t step = 0;          // resolution of the search: the device's granule
  int replays = 0;                 // replays the search ran, the full-capacity one included
  // Every capacity probed above min_capacity passed, min_capacity + k steps for
  // k = 1..monotone_probes included (the pool is monotone in capacity).
  bool monotone = true;
  int monotone_probes = 0;
  std::uint64_t first_failure_above = 0;  // when !monotone: the smallest failing capacity above
  std::string error;               // non-empty: the full-capacity replay failed; nothing else ran

  double ratio() const { return peak_live ? double(min_capacity) / double(peak_live) : 0; }
};

// The unit the pool rounds its capacity to (the sim profile's granule), or 0 when
// the spec does not say (cuda: known only once a device is open).
inline std::uint64_t capacity_step(const BackendSpec& spec) {
  if (!capabilities_of(spec.kind).profiled) return 0;
  Result<DeviceProfile> p = spec_profile(spec);
  return p.ok() ? p->granularity : 0;
}

// Smallest pool capacity at which `trace` replays with no OOM and a passing
// verdict, by binary search over [peak live, 3 x peak live] in steps of one
// granule (1 % of peak live where the granule is not known); then the capacities
// min + k steps, k = 1..probes, are replayed too, and `monotone` says whether all
// of them passed. `options` picks the backend (and profile, integrity policy);
// its capacity is ignored.
inline MinCapacity min_capacity(const std::string& trace, ReplayOptions options, int probes = 16) {
  MinCapacity out;
  options.capacity = 0;
  auto full = replay_trace_text(trace, "bench", options);
  ++out.replays;
  if (!full.ok() || !full->passed()) {
    out.error = full.ok() ? "replay failed at full capacity" : full.error().message;
    return out;
  }
  out.peak_live = full->peak_live_bytes;
  out.step = capacity_step(options.backend);
  if (out.step == 0) out.step = std::max<std::uint64_t>(out.peak_live / 100, 1);
  auto fits = [&](std::uint64_t capacity) {
    options.capacity = capacity;
    auto r = replay_trace_text(trace, "bench", options);
    ++out.replays;
    return r.ok() && r->ooms == 0 && r->passed();
  };
  // In whole steps: lo is below peak live (cannot pass), hi is taken to pass.
  std::uint64_t lo = (out.peak_live + out.step - 1) / out.step - 1;
  std::uint64_t hi = (out.peak_live * 3 + out.step - 1) / out.step;
  while (hi - lo > 1) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    (fits(mid * out.step) ? hi : lo) = mid;
  }
  out.min_capacity = hi * out.step;
  for (int k = 1; k <= probes; ++k) {
    ++out.monotone_probes;
    const std::uint64_t c = out.min_capacity + std::uint64_t(k) * out.step;
    if (!fits(c)) {
      out.monotone = false;
      out.first_failure_above = c;
      break;
    }
  }
  return out;
}

}  // namespace ferry::synthetic
