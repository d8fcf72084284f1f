#include "ferry/content.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <span>
#include <vector>

#include "expected_bytes.hpp"

namespace ferry {
namespace {

using namespace ferry::testing;  // NOLINT: the test helpers

TEST(Content, FillPatternIsDefinedByteByByte) {
  auto v = pattern(42, 37);
  for (std::uint64_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], static_cast<std::byte>(splitmix64(42 + i / 8) >> (8 * (i % 8)))) << i;
  }
}

TEST(Content, FillPatternAtAnOffsetMatchesTheWhole) {
  auto whole = pattern(9, 1000);
  std::vector<std::byte> part(333);
  fill_pattern(9, 101, part);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + 101));
}

TEST(Content, HashFollowsTheChunkedDefinition) {
  auto v = pattern(3, kHashChunk * 2 + 123);
  std::vector<std::uint64_t> h;
  for (std::uint64_t off = 0; off < v.size(); off += kHashChunk) {
    h.push_back(XXH64(v.data() + off, std::min<std::uint64_t>(kHashChunk, v.size() - off), h.size()));
  }
  EXPECT_EQ(content_hash(v), XXH64(h.data(), h.size() * 8, v.size()));
}

TEST(Content, IncrementalHashEqualsOneShotForAnySplit) {
  auto v = pattern(5, kHashChunk * 3 + 7);
  for (std::uint64_t piece : {1ull, 4096ull, 65535ull, 100000ull}) {
    ContentHasher hasher;
    for (std::uint64_t off = 0; off < v.size(); off += piece) {
      hasher.update(std::span<const std::byte>(v).subspan(off, std::min(piece, v.size() - off)));
    }
    EXPECT_EQ(hasher.finish(), content_hash(v)) << piece;
  }
  ContentHasher empty;
  EXPECT_EQ(empty.finish(), content_hash({}));
}

TEST(Content, HashSeesEveryByte) {
  auto v = pattern(11, 5000);
  const std::uint64_t h = content_hash(v);
  for (std::uint64_t i : {0ull, 1ull, 2499ull, 4999ull}) {
    auto w = v;
    w[i] ^= std::byte{1};
    EXPECT_NE(content_hash(w), h) << i;
  }
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST(Content, LargeInputsHashedInParallelMatchTheDefinition) {
  std::vector<std::byte> v(kParallelHashMin * 3 + 12345);
  fill_pattern(17, 0, v);
  std::vector<std::uint64_t> h;
  for (std::uint64_t off = 0; off < v.size(); off += kHashChunk) {
    h.push_back(XXH64(v.data() + off, std::min<std::uint64_t>(kHashChunk, v.size() - off), h.size()));
  }
  EXPECT_EQ(content_hash(v), XXH64(h.data(), h.size() * 8, v.size()));
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// small_bf16 written out from its definition, independently of content.cpp.
std::uint16_t small_bf16_element(std::uint64_t seed, std::uint64_t j) {
  const int v = static_cast<int>(((splitmix64(seed + j / 4) >> (16 * (j % 4))) & 0xffff) % 5) - 2;
  switch (v) {
    case -2: return 0xC000;
    case -1: return 0xBF80;
    case 0: return 0x0000;
    case 1: return 0x3F80;
    default: return 0x4000;
  }
}

TEST(Content, SmallBf16IsDefinedElementByElement) {
  const std::uint64_t n = 2 * 41;
  const auto v = small_bf16(42, n);
  for (std::uint64_t j = 0; j < n / 2; ++j) {
    const std::uint16_t want = small_bf16_element(42, j);
    EXPECT_EQ(v[2 * j], static_cast<std::byte>(want & 0xff)) << j;
    EXPECT_EQ(v[2 * j + 1], static_cast<std::byte>(want >> 8)) << j;
  }
  // Golden bytes, computed from the definition outside ferry (integers -2 0 -2 1 -2 2 -1 -2).
  const auto golden = small_bf16(0, 16);
  const unsigned char want[16] = {0x00, 0xc0, 0x00, 0x00, 0x00, 0xc0, 0x80, 0x3f,
                                  0x00, 0xc0, 0x00, 0x40, 0x80, 0xbf, 0x00, 0xc0};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(golden[i], std::byte{want[i]}) << i;
}

TEST(Content, SmallBf16ValuesLieInMinusTwoToTwoAndAllOccur) {
  const auto v = small_bf16(7, 2 * 4000);
  int seen[5] = {};
  for (std::size_t e = 0; e < v.size(); e += 2) {
    const auto bits = static_cast<std::uint16_t>(std::to_integer<unsigned>(v[e]) |
                                                 std::to_integer<unsigned>(v[e + 1]) << 8);
    switch (bits) {
      case 0xC000: ++seen[0]; break;
      case 0xBF80: ++seen[1]; break;
      case 0x0000: ++seen[2]; break;
      case 0x3F80: ++seen[3]; break;
      case 0x4000: ++seen[4]; break;
      default: ADD_FAILURE() << "element " << e / 2 << " is 0x" << std::hex << bits;
    }
  }
  for (int c : seen) EXPECT_GT(c, 600);  // ~800 each
}

TEST(Content, SmallBf16AtOddOffsetsAndLengthsJoinsUp) {
  const auto whole = small_bf16(9, 1001);
  for (std::uint64_t offset : {0ull, 1ull, 3ull, 7ull, 8ull, 9ull, 15ull, 100ull, 333ull}) {
    for (std::uint64_t len : {0ull, 1ull, 2ull, 5ull, 8ull, 9ull, 17ull, 500ull}) {
      if (offset + len > whole.size()) continue;
      std::vector<std::byte> part(len);
      fill_small_bf16(9, offset, part);
      EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + static_cast<std::ptrdiff_t>(offset)))
          << offset << " +" << len;
    }
  }
  // Pieces of odd sizes laid end to end give the whole.
  std::vector<std::byte> pieced(whole.size());
  for (std::uint64_t off = 0, piece = 1; off < pieced.size(); off += piece, piece += 2) {
    const std::uint64_t len = std::min(piece, pieced.size() - off);
    fill_small_bf16(9, off, std::span<std::byte>(pieced).subspan(off, len));
  }
  EXPECT_EQ(pieced, whole);
}

TEST(Content, FillWithPicksThePattern) {
  std::vector<std::byte> a(77), b(77);
  fill_with(Pattern::bytes, 5, 3, a);
  fill_pattern(5, 3, b);
  EXPECT_EQ(a, b);
  fill_with(Pattern::small_bf16, 5, 3, a);
  fill_small_bf16(5, 3, b);
  EXPECT_EQ(a, b);
  fill_pattern(5, 3, b);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace ferry
