// The host bf16 GEMM (gemm.hpp) against references written here from the
// definition: an FP32 loop in ascending p (bit for bit) and a double loop (to
// within the FP32 and bf16 rounding the definition allows).
#include "ferry/gemm.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ferry/content.hpp"

namespace ferry {
namespace {

using Bits = std::vector<std::uint16_t>;

std::vector<std::byte> bytes_of(const Bits& v) {
  std::vector<std::byte> out(v.size() * 2);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

Bits bits_of(const std::vector<std::byte>& v) {
  Bits out(v.size() / 2);
  std::memcpy(out.data(), v.data(), out.size() * 2);
  return out;
}

// Decoding and rounding written independently of gemm.cpp.
double value(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

// The nearest bf16 to a finite double, ties to even, by comparing the two candidates.
std::uint16_t nearest_bf16(double x) {
  const auto f = static_cast<float>(x);  // exact for every value the tests round
  EXPECT_EQ(static_cast<double>(f), x) << "the test rounds only values exact in float";
  const auto truncated = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16);
  const auto away = static_cast<std::uint16_t>(truncated + 1);  // next bf16 away from zero
  const double lo = std::abs(x - value(truncated)), hi = std::abs(x - value(away));
  if (lo != hi) return lo < hi ? truncated : away;
  return (truncated & 1) == 0 ? truncated : away;
}

std::uint16_t op_a(const GemmShape& s, const Bits& a, std::size_t i, std::size_t p) {
  return s.trans_a ? a[p * s.m + i] : a[i * s.k + p];
}
std::uint16_t op_b(const GemmShape& s, const Bits& b, std::size_t p, std::size_t j) {
  return s.trans_b ? b[j * s.k + p] : b[p * s.n + j];
}

// The definition, literally: FP32 products and sums in ascending p, one rounding.
Bits naive_fp32(const GemmShape& s, const Bits& a, const Bits& b) {
  Bits c(std::size_t{s.m} * s.n);
  for (std::size_t i = 0; i < s.m; ++i) {
    for (std::size_t j = 0; j < s.n; ++j) {
      float acc = 0;
      for (std::size_t p = 0; p < s.k; ++p) {
        const auto x = static_cast<float>(value(op_a(s, a, i, p)));
        const auto y = static_cast<float>(value(op_b(s, b, p, j)));
        const float product = x * y;
        acc = acc + product;
      }
      c[i * s.n + j] = nearest_bf16(acc);
    }
  }
  return c;
}

// Exact (double) sums and the sum of |terms| per element.
void naive_double(const GemmShape& s, const Bits& a, const Bits& b, std::vector<double>& sum,
                  std::vector<double>& magnitude) {
  sum.assign(std::size_t{s.m} * s.n, 0);
  magnitude.assign(sum.size(), 0);
  for (std::size_t i = 0; i < s.m; ++i) {
    for (std::size_t j = 0; j < s.n; ++j) {
      for (std::size_t p = 0; p < s.k; ++p) {
        const double t = value(op_a(s, a, i, p)) * value(op_b(s, b, p, j));
        sum[i * s.n + j] += t;
        magnitude[i * s.n + j] += std::abs(t);
      }
    }
  }
}

// Random bf16 values in [-1, 1] (truncated from float, so no rounding is involved).
Bits random_bf16(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Bits v(count);
  for (auto& x : v) x = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(dist(rng)) >> 16);
  return v;
}

Bits small_bf16(std::size_t count, std::uint64_t seed) {
  std::vector<std::byte> v(count * 2);
  fill_small_bf16(seed, 0, v);
  return bits_of(v);
}

Bits run(const GemmShape& s, const Bits& a, const Bits& b) {
  std::vector<std::byte> c(s.c_bytes(), std::byte{0xee});
  const Result<void> r = gemm_bf16(s, bytes_of(a), bytes_of(b), c);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return bits_of(c);
}

const GemmShape kOddShapes[] = {
    {1, 1, 1}, {1, 3, 5}, {3, 1, 5}, {5, 3, 1}, {7, 9, 13}, {2, 17, 33}, {16, 8, 64}, {33, 31, 130},
    {17, 515, 6},  // more columns than one block of the host's loop, and a partial one
};

std::vector<GemmShape> with_every_transpose(const GemmShape& base) {
  std::vector<GemmShape> out;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      GemmShape s = base;
      s.trans_a = ta;
      s.trans_b = tb;
      out.push_back(s);
    }
  }
  return out;
}

TEST(GemmShape, SizesAndText) {
  const GemmShape s{64, 32, 128, false, true};
  EXPECT_EQ(s.a_bytes(), 64u * 128 * 2);
  EXPECT_EQ(s.b_bytes(), 128u * 32 * 2);
  EXPECT_EQ(s.c_bytes(), 64u * 32 * 2);
  EXPECT_EQ(s.flops(), 2.0 * 64 * 32 * 128);
  EXPECT_EQ(s.text(), "64 x 32 x 128 (A, B^T)");
  EXPECT_EQ((GemmShape{1, 2, 3, true, false}).text(), "1 x 2 x 3 (A^T, B)");
}

TEST(Bf16, ConversionRoundTripsEveryBitPattern) {
  for (std::uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const auto b = static_cast<std::uint16_t>(bits);
    const float f = bf16_to_float(b);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(f), bits << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << bits;
    } else {
      EXPECT_EQ(float_to_bf16(f), b) << bits;
    }
  }
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  const auto round = [](std::uint32_t float_bits) { return float_to_bf16(std::bit_cast<float>(float_bits)); };
  EXPECT_EQ(round(0x3F808000), 0x3F80);  // 1 + 2^-8: a tie, 0x3F80 is even
  EXPECT_EQ(round(0x3F818000), 0x3F82);  // a tie, 0x3F81 is odd: up
  EXPECT_EQ(round(0x3F808001), 0x3F81);  // just above the tie
  EXPECT_EQ(round(0x3F807FFF), 0x3F80);  // just below
  EXPECT_EQ(round(0xBF818000), 0xBF82);  // negative tie: away from zero to the even one
  EXPECT_EQ(round(0xBF808000), 0xBF80);
  EXPECT_EQ(round(0x3FFF8000), 0x4000);  // a carry into the exponent
  EXPECT_EQ(round(0x00008000), 0x0000);  // subnormal tie to even zero
  EXPECT_EQ(round(0x00018000), 0x0002);
  EXPECT_EQ(round(0x80008000), 0x8000);  // -0 stays -0
  EXPECT_EQ(round(0x7F7F7FFF), 0x7F7F);  // the largest bf16
  EXPECT_EQ(round(0x7F7F8000), 0x7F80);  // a tie above it rounds to infinity (0x7F7F is odd)
  EXPECT_EQ(round(0x7F800000), 0x7F80);
  EXPECT_EQ(round(0xFF800000), 0xFF80);
}

TEST(Bf16, NanStaysNan) {
  for (std::uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0xFF800001u, 0xFFC12345u}) {
    const std::uint16_t b = float_to_bf16(std::bit_cast<float>(nan));
    EXPECT_TRUE(std::isnan(bf16_to_float(b))) << std::hex << nan << " -> " << b;
    EXPECT_EQ(b & 0x8000, (nan >> 16) & 0x8000) << std::hex << nan;  // sign kept
  }
}

TEST(Gemm, MatchesTheFp32DefinitionBitForBit) {
  std::uint64_t seed = 1;
  for (const GemmShape& base : kOddShapes) {
    for (const GemmShape& s : with_every_transpose(base)) {
      const Bits a = random_bf16(s.a_bytes() / 2, seed++);
      const Bits b = random_bf16(s.b_bytes() / 2, seed++);
      EXPECT_EQ(run(s, a, b), naive_fp32(s, a, b)) << s.text();
    }
  }
}

// Stores logical op(A) (m x k) and op(B) (k x n) the way the shape's transposes say.
void store(const GemmShape& s, const std::vector<Bits>& op_a_rows, const std::vector<Bits>& op_b_rows,
           Bits& a, Bits& b) {
  a.assign(std::size_t{s.m} * s.k, 0);
  b.assign(std::size_t{s.k} * s.n, 0);
  for (std::size_t i = 0; i < s.m; ++i) {
    for (std::size_t p = 0; p < s.k; ++p) (s.trans_a ? a[p * s.m + i] : a[i * s.k + p]) = op_a_rows[i][p];
  }
  for (std::size_t p = 0; p < s.k; ++p) {
    for (std::size_t j = 0; j < s.n; ++j) (s.trans_b ? b[j * s.k + p] : b[p * s.n + j]) = op_b_rows[p][j];
  }
}

TEST(Gemm, SumsInFp32InAscendingP) {
  // Products 2^24, 1, -2^24: in FP32 and ascending p, 2^24 + 1 rounds back to
  // 2^24 and the sum is 0; descending, or in double, it is 1.
  constexpr std::uint16_t one = 0x3F80, big = 0x4B80, minus_big = 0xCB80;
  for (const GemmShape& s : with_every_transpose({2, 2, 3})) {
    Bits a, b;
    store(s, {{one, one, one}, {one, 0, 0}}, {{big, one}, {one, one}, {minus_big, one}}, a, b);
    const Bits c = run(s, a, b);
    EXPECT_EQ(c[0], 0x0000) << s.text();  // not 1 (0x3F80)
    EXPECT_EQ(c[1], 0x4040) << s.text();  // 3
    EXPECT_EQ(c[2], big) << s.text();
    EXPECT_EQ(c[3], one) << s.text();
  }
}

TEST(Gemm, AgreesWithDoublePrecisionWithinTheRoundingAllowed) {
  std::uint64_t seed = 100;
  for (const GemmShape& base : kOddShapes) {
    for (const GemmShape& s : with_every_transpose(base)) {
      const Bits a = random_bf16(s.a_bytes() / 2, seed++);
      const Bits b = random_bf16(s.b_bytes() / 2, seed++);
      const Bits c = run(s, a, b);
      std::vector<double> exact, magnitude;
      naive_double(s, a, b, exact, magnitude);
      for (std::size_t e = 0; e < c.size(); ++e) {
        // FP32 summation error, then one bf16 rounding (half an ulp, 2^-9 relative).
        const double fp32 = s.k * std::ldexp(magnitude[e], -24);
        const double allowed = std::ldexp(std::abs(exact[e]) + fp32, -8) + fp32;
        EXPECT_LE(std::abs(value(c[e]) - exact[e]), allowed) << s.text() << " element " << e;
      }
    }
  }
}

TEST(Gemm, SmallBf16OperandsGiveTheExactSumRounded) {
  std::uint64_t seed = 7;
  for (const GemmShape& base : {GemmShape{1, 3, 5}, GemmShape{9, 7, 300}, GemmShape{4, 5, 4099}}) {
    for (const GemmShape& s : with_every_transpose(base)) {
      const Bits a = small_bf16(s.a_bytes() / 2, seed++);
      const Bits b = small_bf16(s.b_bytes() / 2, seed++);
      const Bits c = run(s, a, b);
      for (std::size_t i = 0; i < s.m; ++i) {
        for (std::size_t j = 0; j < s.n; ++j) {
          std::int64_t sum = 0;
          for (std::size_t p = 0; p < s.k; ++p) {
            sum += static_cast<std::int64_t>(value(op_a(s, a, i, p))) *
                   static_cast<std::int64_t>(value(op_b(s, b, p, j)));
          }
          ASSERT_EQ(c[i * s.n + j], nearest_bf16(static_cast<double>(sum)))
              << s.text() << " at " << i << "," << j << ": sum " << sum;
        }
      }
    }
  }
}

TEST(Gemm, ThreadedProductEqualsRowByRowProduct) {
  // 250 * 300 * 512 > 2^25 multiply-adds: above the threshold where rows are
  // split over threads. Each single-row product is far below it.
  const GemmShape s{250, 300, 512, false, true};
  const Bits a = random_bf16(s.a_bytes() / 2, 11);
  const Bits b = random_bf16(s.b_bytes() / 2, 12);
  const Bits c = run(s, a, b);
  const GemmShape row{1, s.n, s.k, false, true};
  for (std::size_t i = 0; i < s.m; ++i) {
    const Bits a_row(a.begin() + static_cast<std::ptrdiff_t>(i * s.k),
                     a.begin() + static_cast<std::ptrdiff_t>((i + 1) * s.k));
    const Bits c_row = run(row, a_row, b);
    ASSERT_TRUE(std::equal(c_row.begin(), c_row.end(), c.begin() + static_cast<std::ptrdiff_t>(i * s.n)))
        << "row " << i;
  }
  // And a slice of it against the definition itself.
  const GemmShape top{8, s.n, s.k, false, true};
  const Bits a_top(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(8 * s.k));
  const Bits want = naive_fp32(top, a_top, b);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), c.begin()));
}

TEST(Gemm, NanPropagates) {
  const GemmShape s{2, 2, 3};
  Bits a(6, 0x3F80), b(6, 0x3F80);
  a[1] = 0x7FC0;  // row 0 of A holds a NaN
  const Bits c = run(s, a, b);
  EXPECT_TRUE(std::isnan(value(c[0])));
  EXPECT_TRUE(std::isnan(value(c[1])));
  EXPECT_EQ(c[2], 0x4040);  // 3.0
  EXPECT_EQ(c[3], 0x4040);
}

TEST(Gemm, BadShapesAndSizesAreRefusedNamingTheOperand) {
  const auto message = [](const Result<void>& r) {
    EXPECT_FALSE(r.ok());
    if (r.ok()) return std::string();
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    return r.error().message;
  };
  EXPECT_TRUE(check_gemm({2, 3, 4}, 16, 24, 12).ok());
  EXPECT_NE(message(check_gemm({0, 3, 4}, 0, 24, 0)).find("> 0"), std::string::npos);
  EXPECT_FALSE(check_gemm({2, 0, 4}, 16, 0, 0).ok());
  EXPECT_FALSE(check_gemm({2, 3, 0}, 0, 0, 12).ok());
  const GemmShape huge_k{1, 1, 1u << 31};
  EXPECT_NE(message(check_gemm(huge_k, huge_k.a_bytes(), huge_k.b_bytes(), 2)).find("2^31"),
            std::string::npos);
  EXPECT_TRUE(check_gemm({1, 1, (1u << 31) - 1}, (std::uint64_t{1} << 32) - 2,
                         (std::uint64_t{1} << 32) - 2, 2)
                  .ok());

  const std::string a = message(check_gemm({2, 3, 4, true, false}, 15, 24, 12));
  EXPECT_NE(a.find("2 x 3 x 4 (A^T, B)"), std::string::npos) << a;
  EXPECT_NE(a.find("a holds 15 B"), std::string::npos) << a;
  EXPECT_NE(a.find("needs 16 B"), std::string::npos) << a;
  const std::string b = message(check_gemm({2, 3, 4}, 16, 25, 12));
  EXPECT_NE(b.find("b holds 25 B"), std::string::npos) << b;
  EXPECT_NE(b.find("needs 24 B"), std::string::npos) << b;
  const std::string c = message(check_gemm({2, 3, 4}, 16, 24, 0));
  EXPECT_NE(c.find("c holds 0 B"), std::string::npos) << c;
  EXPECT_NE(c.find("needs 12 B"), std::string::npos) << c;

  // gemm_bf16 refuses the same way and leaves c alone.
  std::vector<std::byte> in(16), out(10, std::byte{0x5a});
  const std::string g = message(gemm_bf16({2, 3, 4}, in, std::span<const std::byte>(in).first(16), out));
  EXPECT_NE(g.find("b holds 16 B"), std::string::npos) << g;
  EXPECT_EQ(out, std::vector<std::byte>(10, std::byte{0x5a}));
}

TEST(Gemm, MaxErrorIsRelativeAboveOneAbsoluteBelow) {
  const auto err = [](const Bits& x, const Bits& y) { return gemm_bf16_max_error(bytes_of(x), bytes_of(y)); };
  const Bits y = {0x3F80, 0x0000, 0x42C8, 0xBF80};  // 1, 0, 100, -1
  EXPECT_EQ(err(y, y), 0.0);
  EXPECT_EQ(err({0x3FC0, 0x0000, 0x42C8, 0xBF80}, y), 0.5);         // 1.5 vs 1
  EXPECT_EQ(err({0x3F80, 0x3C24, 0x42C8, 0xBF80}, y), value(0x3C24));  // ~0.01 vs 0: absolute
  EXPECT_EQ(err({0x3F80, 0x0000, 0x4348, 0xBF80}, y), 1.0);         // 200 vs 100: relative
  EXPECT_EQ(err({0x3F80, 0x0000, 0x42C8, 0x3F80}, y), 2.0);         // 1 vs -1
  EXPECT_EQ(err({0x3F80, 0x8000, 0x42C8, 0xBF80}, y), 0.0);         // -0 == 0
  constexpr double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(err({0x3F80, 0x7FC0, 0x42C8, 0xBF80}, y), inf);  // NaN in x
  EXPECT_EQ(err(y, {0x3F80, 0x7FC0, 0x42C8, 0xBF80}), inf);  // NaN in y
  EXPECT_EQ(err({0x7F80}, {0x7F80}), 0.0);                   // equal infinities
  EXPECT_EQ(err({0x7F80}, {0x3F80}), inf);
  EXPECT_EQ(err({0x3F80}, y), inf);  // size mismatch
  const std::vector<std::byte> odd(3);
  EXPECT_EQ(gemm_bf16_max_error(odd, odd), inf);
  EXPECT_EQ(gemm_bf16_max_error({}, {}), 0.0);
}

}  // namespace
}  // namespace ferry
