#include "ferry/content.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <random>
#include <span>
#include <vector>

#include "core/content_words.hpp"
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

// content_hash straight from its definition in content.hpp, word by word.
std::uint64_t defined_hash(std::span<const std::byte> b) {
  std::uint64_t sum = 0;
  for (std::uint64_t j = 0; 8 * j < b.size(); ++j) {
    std::uint64_t w = 0;
    for (std::uint64_t i = 0; i < 8 && 8 * j + i < b.size(); ++i) {
      w |= static_cast<std::uint64_t>(b[8 * j + i]) << (8 * i);
    }
    sum += hash_word(w, j);
  }
  return hash_finish(sum, b.size());
}

TEST(ContentHash, FollowsTheDefinitionForEveryLengthAndAlignment) {
  const auto v = pattern(3, 4096 + 64);
  for (std::uint64_t offset : {0u, 1u, 3u, 8u}) {
    for (std::uint64_t n = 0; n <= 300; ++n) {
      const auto b = std::span(v).subspan(offset, n);
      ASSERT_EQ(content_hash(b), defined_hash(b)) << offset << " " << n;
    }
    const auto b = std::span(v).subspan(offset, 4096 + 17);
    EXPECT_EQ(content_hash(b), defined_hash(b)) << offset;
  }
}

// The sum of hash_word over words [0, n) of b from its definition.
std::uint64_t defined_sum(const std::byte* p, std::uint64_t words, std::uint64_t first_word) {
  std::uint64_t sum = 0;
  for (std::uint64_t j = 0; j < words; ++j) {
    std::uint64_t w = 0;
    for (std::uint64_t i = 0; i < 8; ++i) w |= static_cast<std::uint64_t>(p[8 * j + i]) << (8 * i);
    sum += hash_word(w, first_word + j);
  }
  return sum;
}

// Both word loops the CPU may pick follow the definition, at every length the
// unrolled loop's tail can see and at first words near the key's wrap (the
// AVX-512 one where this CPU has it).
TEST(ContentHash, BothWordLoopsFollowTheDefinition) {
  const auto v = pattern(21, 8 * 200 + 8);
  for (const std::uint64_t first : {std::uint64_t{0}, std::uint64_t{5}, ~std::uint64_t{0} - 3}) {
    for (std::uint64_t words = 0; words <= 200; ++words) {
      const std::uint64_t want = defined_sum(v.data() + 8, words, first);
      ASSERT_EQ(detail::sum_words_portable(v.data() + 8, words, first), want) << words << " " << first;
      if (detail::SumWords fast = detail::sum_words_avx512()) {
        ASSERT_EQ(fast(v.data() + 8, words, first), want) << words << " " << first;
      }
    }
  }
}

// The hash of a pattern's range, taken without a buffer of its size, is the hash
// of its bytes, for both patterns, any offset and lengths across the piece size.
TEST(ContentHash, APatternsHashIsTheHashOfItsBytes) {
  for (const Pattern p : {Pattern::bytes, Pattern::small_bf16}) {
    for (const std::uint64_t offset : {0u, 3u, 8u, 4097u}) {
      for (const std::uint64_t n : {0u, 1u, 7u, 4096u, 4099u, 3u * 4096u + 5u}) {
        std::vector<std::byte> bytes(n);
        fill_with(p, 77, offset, bytes);
        EXPECT_EQ(pattern_hash(p, 77, offset, n), content_hash(bytes)) << offset << " " << n;
        ContentHasher h;
        h.update(std::span(bytes).first(n / 3));
        h.update_pattern(p, 77, offset + n / 3, n - n / 3);
        EXPECT_EQ(h.finish(), content_hash(bytes)) << "after bytes " << offset << " " << n;
      }
    }
  }
}

TEST(ContentHash, PinnedValuesOfTheDefinition) {
  // The definition's own numbers: a change to mix64, the keys or the padding shows
  // here (and everything stored with an old hash would stop matching).
  EXPECT_EQ(mix64(0), 0u);
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafull);  // SplitMix64's first output for state 0
  EXPECT_EQ(content_hash({}), mix64(mix64(kHashLengthKey)));
  const std::byte one[1] = {std::byte{1}};
  EXPECT_EQ(content_hash(one), mix64(mix64(1 ^ kHashPositionKey) ^ mix64(1 + kHashLengthKey)));
}

TEST(ContentHash, IncrementalEqualsOneShotForAnySplit) {
  auto v = pattern(5, 3 * 65536 + 7);
  for (std::uint64_t piece : {1ull, 3ull, 7ull, 8ull, 9ull, 4096ull, 65535ull, 100000ull}) {
    ContentHasher hasher;
    for (std::uint64_t off = 0; off < v.size(); off += piece) {
      hasher.update(std::span<const std::byte>(v).subspan(off, std::min(piece, v.size() - off)));
    }
    EXPECT_EQ(hasher.finish(), content_hash(v)) << piece;
  }
  ContentHasher hasher;
  EXPECT_EQ(hasher.finish(), content_hash({}));
  hasher.update(std::span<const std::byte>(v).first(5));
  (void)hasher.finish();  // starts over
  hasher.update(v);
  EXPECT_EQ(hasher.finish(), content_hash(v));
}

TEST(ContentHash, PartialSumsOverAnySplitInAnyOrderGiveTheHash) {
  // The device's way: pieces at word boundaries hashed apart (each knowing its
  // first word), summed in whatever order they finish.
  const auto v = pattern(7, 1000003);
  const std::uint64_t words = (v.size() + 7) / 8;
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::uint64_t> cuts{0, words};
    const int pieces = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < pieces; ++k) cuts.push_back(rng() % words);
    std::sort(cuts.begin(), cuts.end());
    std::vector<std::uint64_t> sums;
    for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
      const std::uint64_t begin = 8 * cuts[k];
      const std::uint64_t end = std::min<std::uint64_t>(v.size(), 8 * cuts[k + 1]);
      sums.push_back(content_hash_sum(std::span(v).subspan(begin, end - begin), cuts[k]));
    }
    std::shuffle(sums.begin(), sums.end(), rng);
    std::uint64_t sum = 0;
    for (const std::uint64_t s : sums) sum += s;
    EXPECT_EQ(hash_finish(sum, v.size()), content_hash(v)) << trial;
  }
  // Strided, as a grid of threads takes words t, t + T, ...
  for (const std::uint64_t threads : {2ull, 5ull, 256ull}) {
    std::uint64_t sum = 0;
    for (std::uint64_t t = 0; t < threads; ++t) {
      for (std::uint64_t j = t; j < words; j += threads) {
        const std::uint64_t n = std::min<std::uint64_t>(8, v.size() - 8 * j);
        sum += content_hash_sum(std::span(v).subspan(8 * j, n), j);
      }
    }
    EXPECT_EQ(hash_finish(sum, v.size()), content_hash(v)) << threads;
  }
}

TEST(ContentHash, LargeInputsHashedInParallelMatchTheDefinition) {
  std::vector<std::byte> v(kParallelHashMin * 3 + 12345);
  fill_pattern(17, 0, v);
  EXPECT_EQ(content_hash(v), defined_hash(v));
  EXPECT_EQ(content_hash(std::span(v).subspan(3)), defined_hash(std::span(v).subspan(3)));
}

// What verify exists to catch, each as the destination it would leave behind.
constexpr std::uint64_t kPiece = 64 * 1024;
std::vector<std::byte> source() { return pattern(21, 8 * kPiece + 40); }

TEST(ContentHash, DetectsACopyThatDidNotHappen) {
  const auto src = source();
  const auto stale = pattern(20, src.size());  // the destination's previous bytes
  EXPECT_NE(content_hash(stale), content_hash(src));
  const std::vector<std::byte> fresh(src.size());  // never written: zeros
  EXPECT_NE(content_hash(fresh), content_hash(src));
}

TEST(ContentHash, DetectsZeroedAndPartialCopies) {
  const auto src = source();
  const std::uint64_t h = content_hash(src);
  for (const std::uint64_t done : std::initializer_list<std::uint64_t>{0, 1, 8, kPiece, 5 * kPiece + 3, src.size() - 1}) {
    auto zero_rest = src;
    std::fill(zero_rest.begin() + static_cast<std::ptrdiff_t>(done), zero_rest.end(), std::byte{0});
    EXPECT_NE(content_hash(zero_rest), h) << "zeroed after " << done;
    auto stale_rest = pattern(20, src.size());
    std::copy(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(done), stale_rest.begin());
    EXPECT_NE(content_hash(stale_rest), h) << "stale after " << done;
  }
  // A zeroed 64 KiB piece in the middle, and a short copy (fewer bytes).
  auto hole = src;
  std::fill(hole.begin() + 3 * kPiece, hole.begin() + 4 * kPiece, std::byte{0});
  EXPECT_NE(content_hash(hole), h);
  EXPECT_NE(content_hash(std::span(src).first(src.size() - 1)), h);
  auto padded = src;
  padded.push_back(std::byte{0});  // a trailing zero is a different input
  EXPECT_NE(content_hash(padded), h);
}

TEST(ContentHash, DetectsSwappedAndShiftedPieces) {
  const auto src = source();
  const std::uint64_t h = content_hash(src);
  auto swapped = src;  // two 64 KiB pieces exchanged (a DMA of the wrong chunk)
  std::swap_ranges(swapped.begin() + kPiece, swapped.begin() + 2 * kPiece, swapped.begin() + 5 * kPiece);
  EXPECT_NE(content_hash(swapped), h);
  auto words = src;  // two words exchanged
  std::swap_ranges(words.begin(), words.begin() + 8, words.begin() + 8);
  EXPECT_NE(content_hash(words), h);
  for (const std::uint64_t by : std::initializer_list<std::uint64_t>{1, 8, 16, kPiece}) {  // copied to the wrong offset
    auto shifted = src;
    std::copy(src.begin(), src.end() - static_cast<std::ptrdiff_t>(by),
              shifted.begin() + static_cast<std::ptrdiff_t>(by));
    EXPECT_NE(content_hash(shifted), h) << by;
    auto rotated = src;
    std::rotate(rotated.begin(), rotated.begin() + static_cast<std::ptrdiff_t>(by), rotated.end());
    EXPECT_NE(content_hash(rotated), h) << by;
  }
}

TEST(ContentHash, DetectsEverySingleFlippedBit) {
  // Guaranteed, not likely: hash_word is a bijection of the word and hash_finish
  // of the sum. Every bit of the first, a middle and the partial last word.
  auto v = pattern(23, 8 * 100 + 5);
  const std::uint64_t h = content_hash(v);
  for (const std::uint64_t word : {0ull, 50ull, 100ull}) {
    for (std::uint64_t bit = 0; bit < 64; ++bit) {
      const std::uint64_t byte = 8 * word + bit / 8;
      if (byte >= v.size()) continue;
      v[byte] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
      EXPECT_NE(content_hash(v), h) << word << ":" << bit;
      v[byte] ^= std::byte{static_cast<unsigned char>(1u << (bit % 8))};
    }
  }
  const std::vector<std::byte> zeros(4096);  // and on zeros, where a sum of terms could cancel
  const std::uint64_t z = content_hash(zeros);
  for (std::uint64_t i = 0; i < zeros.size(); i += 97) {
    auto w = zeros;
    w[i] = std::byte{0x80};
    EXPECT_NE(content_hash(w), z) << i;
  }
}

TEST(ContentHash, TwoFlippedTopBitsDoNotCancel) {
  // The weakness of a sum of weak terms: the same change in two words (here the top
  // bit, whose change is +-2^63 in any linear term) must not cancel.
  auto v = pattern(29, 8 * 64);
  const std::uint64_t h = content_hash(v);
  for (std::uint64_t a = 0; a < 64; ++a) {
    for (std::uint64_t b = a + 1; b < 64; ++b) {
      v[8 * a + 7] ^= std::byte{0x80};
      v[8 * b + 7] ^= std::byte{0x80};
      EXPECT_NE(content_hash(v), h) << a << " " << b;
      v[8 * a + 7] ^= std::byte{0x80};
      v[8 * b + 7] ^= std::byte{0x80};
    }
  }
}

}  // namespace
}  // namespace ferry
