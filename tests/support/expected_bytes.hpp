// Host-side expected bytes for tests that check what a device wrote: the
// patterns of content.hpp and the products of gemm.hpp, as vectors, and what a
// failed comparison of bf16 matrices should print.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/gemm.hpp"

namespace ferry::testing {

inline std::vector<std::byte> pattern(std::uint64_t seed, std::uint64_t bytes) {
  std::vector<std::byte> v(bytes);
  fill_pattern(seed, 0, v);
  return v;
}

inline std::vector<std::byte> small_bf16(std::uint64_t seed, std::uint64_t bytes) {
  std::vector<std::byte> v(bytes);
  fill_small_bf16(seed, 0, v);
  return v;
}

// Uniform bf16 values in [-1, 1]: finite and moderate, so a device summing in
// another order stays within FP32 rounding of the host.
inline std::vector<std::byte> random_bf16(std::uint64_t seed, std::uint64_t bytes) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<std::byte> v(bytes);
  for (std::uint64_t e = 0; e + 1 < bytes; e += 2) {
    const std::uint16_t bits = float_to_bf16(value(rng));
    v[e] = static_cast<std::byte>(bits & 0xff);
    v[e + 1] = static_cast<std::byte>(bits >> 8);
  }
  return v;
}

// C of the host definition; empty (with a test failure) when it refuses the shape.
inline std::vector<std::byte> host_gemm(const GemmShape& g, const std::vector<std::byte>& a,
                                        const std::vector<std::byte>& b) {
  std::vector<std::byte> c(g.c_bytes());
  const Result<void> r = gemm_bf16(g, a, b, c);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? c : std::vector<std::byte>{};
}

// A zero result is +0 on the host (it sums from +0); cuBLAS may give -0 where
// every product is -0. Both are the same value: compare them as equal.
inline std::vector<std::byte> plus_zeros(std::vector<std::byte> v) {
  for (std::size_t i = 0; i + 1 < v.size(); i += 2) {
    if (v[i] == std::byte{0} && v[i + 1] == std::byte{0x80}) v[i + 1] = std::byte{0};
  }
  return v;
}

// Where two bf16 matrices first differ, for a failure message.
inline std::string first_difference(const GemmShape& g, const std::vector<std::byte>& got,
                                    const std::vector<std::byte>& expected) {
  if (got.size() != expected.size()) return "sizes differ";
  const auto bits = [](const std::vector<std::byte>& v, std::size_t at) {
    return static_cast<std::uint16_t>(std::to_integer<unsigned>(v[at]) |
                                      (std::to_integer<unsigned>(v[at + 1]) << 8));
  };
  for (std::size_t e = 0; e + 1 < got.size(); e += 2) {
    if (got[e] != expected[e] || got[e + 1] != expected[e + 1]) {
      std::ostringstream out;
      out << g.text() << ": C[" << e / 2 / g.n << "][" << e / 2 % g.n << "] is "
          << bf16_to_float(bits(got, e)) << ", the host has " << bf16_to_float(bits(expected, e))
          << "; max error " << gemm_bf16_max_error(got, expected);
      return out.str();
    }
  }
  return "equal";
}

}  // namespace ferry::testing
