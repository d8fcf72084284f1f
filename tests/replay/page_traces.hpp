// Traces of any length for the snapshot page's tests: allocs (now and then one
// that cannot fit, marked "expect":"oom"), frees, a few fills, holds and syncs on
// two streams, at most 64 ids live, sizes log-uniform in [256 B, 256 KiB); the
// first unfittable alloc is op 500, then every 5000 ops.
// Exactly `ops` lines; deterministic in `seed`.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace ferry::testing {

inline std::string page_trace(std::size_t ops, std::uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::string t;
  std::vector<std::string> live;
  std::size_t next_id = 0;
  bool held = false;
  const auto size = [&] {
    return static_cast<std::uint64_t>(std::exp2(8.0 + 10.0 * static_cast<double>(rng() % 1000) / 1000.0));
  };
  for (std::size_t i = 0; i < ops; ++i) {
    const unsigned r = static_cast<unsigned>(rng() % 100);
    const std::string stream = std::to_string(rng() % 2);
    if (i % 5000 == 499) {
      t += R"({"op":"alloc","id":"huge)" + std::to_string(i) + R"(","bytes":1099511627776,"stream":0,"expect":"oom"})";
    } else if ((r < 45 && live.size() < 64) || live.empty()) {
      live.push_back("b" + std::to_string(next_id++));
      t += R"({"op":"alloc","id":")" + live.back() + R"(","bytes":)" + std::to_string(size()) + R"(,"stream":)" +
           stream + "}";
    } else if (r < 85) {
      const std::size_t k = rng() % live.size();
      t += R"({"op":"free","id":")" + live[k] + R"("})";
      live[k] = live.back();
      live.pop_back();
    } else if (r < 93) {
      t += R"({"op":"fill","id":")" + live[rng() % live.size()] + R"(","stream":)" + stream + R"(,"seed":)" +
           std::to_string(i) + "}";
    } else if (r < 97) {
      t += std::string(R"({"op":")") + (held ? "release" : "hold") + R"(","stream":1})";
      held = !held;
    } else {
      t += R"({"op":"sync"})";
    }
    t += '\n';
  }
  return t;
}

}  // namespace ferry::testing
