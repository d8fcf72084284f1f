#include "ferry/content.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <vector>

namespace ferry {
namespace {

std::vector<std::byte> pattern(std::uint64_t seed, std::uint64_t n) {
  std::vector<std::byte> v(n);
  fill_pattern(seed, 0, v);
  return v;
}

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
