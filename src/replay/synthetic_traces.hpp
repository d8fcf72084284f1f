// The size distributions and allocation traces shared by the sim and the cuda
// benchmarks (pool_bench, cuda_bench), so that both measure the same workloads, and
// the capacity search that turns a trace into a fragmentation ratio.
//
// Every generator is deterministic in its seed: changing one changes the figures in
// docs/performance.md for both backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// Random mixed-size traffic, 256 B - 24 MiB, on three streams.
inline std::string mixed_trace(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto sizes = log_uniform_sizes(256, 24 << 20, 1200, seed);
  std::ostringstream t;
  std::vector<std::pair<int, int>> live;  // id, stream
  std::uint64_t live_bytes = 0;
  std::vector<std::uint64_t> bytes_of;
  int id = 0;
  for (std::uint64_t size : sizes) {
    while (live_bytes > (96u << 20) || (!live.empty() && rng() % 3 == 0)) {
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

// The outcome of min_capacity(): fragmentation ratio = min_capacity / peak_live.
struct MinCapacity {
  std::uint64_t peak_live = 0;     // peak requested live bytes, replayed at full capacity
  std::uint64_t min_capacity = 0;  // smallest capacity found with no OOM (to 1 % of peak_live)
  int replays = 0;                 // replays the search ran, the full-capacity one included
  std::string error;               // non-empty: the full-capacity replay failed; nothing else ran

  double ratio() const { return peak_live ? double(min_capacity) / double(peak_live) : 0; }
};

// Smallest pool capacity (to 1 %) at which `trace` replays with no OOM and a passing
// verdict, by binary search over [peak live, 3 x peak live]. `options` picks the
// backend (and profile, integrity policy); its capacity is ignored.
inline MinCapacity min_capacity(const std::string& trace, ReplayOptions options) {
  MinCapacity out;
  options.capacity = 0;
  auto full = replay_trace_text(trace, "bench", options);
  ++out.replays;
  if (!full.ok() || !full->passed()) {
    out.error = full.ok() ? "replay failed at full capacity" : full.error().message;
    return out;
  }
  out.peak_live = full->peak_live_bytes;
  std::uint64_t lo = out.peak_live, hi = out.peak_live * 3;
  while (hi - lo > out.peak_live / 100) {
    options.capacity = lo + (hi - lo) / 2;
    auto r = replay_trace_text(trace, "bench", options);
    ++out.replays;
    const bool fits = r.ok() && r->ooms == 0 && r->passed();
    (fits ? hi : lo) = options.capacity;
  }
  out.min_capacity = hi;
  return out;
}

}  // namespace ferry::synthetic
