// Small helpers shared by the pool tests: read a block back, expected bytes.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "expected_bytes.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"

namespace ferry::testing {

inline std::vector<std::byte> mix_bytes(const std::vector<std::vector<std::byte>>& inputs,
                                        std::uint64_t n) {
  std::uint64_t acc = kMixStart;
  for (std::size_t k = 0; k < inputs.size(); ++k) acc = mix_step(acc, k, content_hash(inputs[k]));
  return pattern(acc, n);
}

// Copies a block back to the host on `stream` and waits for it.
inline Result<std::vector<std::byte>> read_back(DevicePool& pool, DeviceHandle h, StreamId stream) {
  auto span = pool.resolve(h);
  if (!span.ok()) return std::move(span).error();
  std::vector<std::byte> out(span->bytes);
  auto t = enqueue_copy_to_host(pool, stream, h, out);
  if (!t.ok()) return std::move(t).error();
  if (auto w = pool.order().wait({stream, *t}); !w.ok()) return std::move(w).error();
  return out;
}

}  // namespace ferry::testing
