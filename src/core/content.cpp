#include "ferry/content.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <thread>
#include <vector>

#include "core/content_words.hpp"
#include "ferry/names.hpp"

namespace ferry {

static_assert(std::endian::native == std::endian::little,
              "content definitions assume a little-endian host");

namespace {

constexpr std::array<NamedValue<Pattern>, 2> kPatterns{{
    {Pattern::bytes, "bytes"},
    {Pattern::small_bf16, "small_bf16"},
}};

}  // namespace

std::string_view to_string(Pattern pattern) noexcept { return name_in<Pattern>(kPatterns, pattern); }
bool known_pattern(Pattern pattern) noexcept { return name_in<Pattern>(kPatterns, pattern) != "unknown"; }

namespace {

// Writes bytes [offset, offset + out.size()) of a stream of little-endian 8-byte
// words, word w being word(w): both patterns are defined that way.
template <class Word>
void fill_words(std::uint64_t offset, std::span<std::byte> out, Word&& word) noexcept {
  std::uint64_t i = 0;
  const std::uint64_t n = out.size();
  const auto byte_at = [&](std::uint64_t pos) {
    return static_cast<std::byte>(word(pos / 8) >> (8 * (pos % 8)));
  };
  for (; i < n && (offset + i) % 8 != 0; ++i) out[i] = byte_at(offset + i);  // leading partial word
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t w = word((offset + i) / 8);
    std::memcpy(out.data() + i, &w, 8);
  }
  for (; i < n; ++i) out[i] = byte_at(offset + i);
}

}  // namespace

namespace detail {

// Four sums over interleaved words and the position key stepped by addition:
// scalar multiplies from independent chains, which beat the compiler's vectorised
// form of the plain loop (without AVX-512 a 64-bit vector multiply is emulated).
std::uint64_t sum_words_portable(const std::byte* p, std::uint64_t words,
                                 std::uint64_t first_word) noexcept {
  std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  std::uint64_t key = (first_word + 1) * kHashPositionKey;  // word j's: key + j * kHashPositionKey
  std::uint64_t j = 0;
  for (; j + 4 <= words; j += 4) {
    std::uint64_t w[4];
    std::memcpy(w, p + 8 * j, sizeof w);
    s0 += mix64(w[0] ^ key);
    s1 += mix64(w[1] ^ (key + kHashPositionKey));
    s2 += mix64(w[2] ^ (key + 2 * kHashPositionKey));
    s3 += mix64(w[3] ^ (key + 3 * kHashPositionKey));
    key += 4 * kHashPositionKey;
  }
  for (; j < words; ++j, key += kHashPositionKey) {
    std::uint64_t w;
    std::memcpy(&w, p + 8 * j, 8);
    s0 += mix64(w ^ key);
  }
  return s0 + s1 + s2 + s3;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace {
// The definition's loop as written; the compiler vectorises it eight words a step
// with AVX-512's 64-bit multiply.
[[gnu::target("avx512f,avx512dq")]] std::uint64_t sum_words_avx512_loop(
    const std::byte* p, std::uint64_t words, std::uint64_t first_word) noexcept {
  std::uint64_t sum = 0;
  for (std::uint64_t j = 0; j < words; ++j) {
    std::uint64_t w;
    std::memcpy(&w, p + 8 * j, 8);
    sum += hash_word(w, first_word + j);
  }
  return sum;
}
}  // namespace

SumWords sum_words_avx512() noexcept {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }();
  return has ? &sum_words_avx512_loop : nullptr;
}
#else
SumWords sum_words_avx512() noexcept { return nullptr; }
#endif

}  // namespace detail

namespace {

// Chosen once, on first use (a static initializer elsewhere may hash too).
std::uint64_t sum_words(const std::byte* p, std::uint64_t words, std::uint64_t first_word) noexcept {
  static const detail::SumWords chosen = [] {
    const detail::SumWords fast = detail::sum_words_avx512();
    return fast != nullptr ? fast : &detail::sum_words_portable;
  }();
  return chosen(p, words, first_word);
}

std::uint64_t load_partial_word(const std::byte* p, std::uint64_t n) noexcept {
  std::uint64_t w = 0;  // zero-padded: the definition of the last word
  std::memcpy(&w, p, n);
  return w;
}

}  // namespace

void fill_pattern(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept {
  fill_words(offset, out, [seed](std::uint64_t w) { return splitmix64(seed + w); });
}

void fill_small_bf16(std::uint64_t seed, std::uint64_t offset, std::span<std::byte> out) noexcept {
  fill_words(offset, out, [seed](std::uint64_t w) { return small_bf16_word(splitmix64(seed + w)); });
}

void fill_with(Pattern pattern, std::uint64_t seed, std::uint64_t offset,
               std::span<std::byte> out) noexcept {
  switch (pattern) {
    case Pattern::bytes:
      return fill_pattern(seed, offset, out);
    case Pattern::small_bf16:
      return fill_small_bf16(seed, offset, out);
  }
  fill_pattern(seed, offset, out);  // not a Pattern (a cast from a bad integer): bytes
}

std::uint64_t content_hash_sum(std::span<const std::byte> bytes, std::uint64_t first_word) noexcept {
  const std::uint64_t words = bytes.size() / 8;
  std::uint64_t sum = sum_words(bytes.data(), words, first_word);
  if (const std::uint64_t tail = bytes.size() % 8; tail != 0) {
    sum += hash_word(load_partial_word(bytes.data() + 8 * words, tail), first_word + words);
  }
  return sum;
}

std::uint64_t content_hash(std::span<const std::byte> bytes) noexcept {
  const std::uint64_t n = bytes.size();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::uint64_t workers = std::min<std::uint64_t>({cores, 8, n / kParallelHashMin});
  if (workers <= 1) return hash_finish(content_hash_sum(bytes, 0), n);
  // Pieces split at word boundaries and hash independently: the sum does not
  // depend on how many there are or which thread took which.
  const std::uint64_t words = (n + 7) / 8;
  const std::uint64_t per = (words + workers - 1) / workers;
  std::vector<std::uint64_t> sums(workers, 0);
  auto hash_piece = [&](std::uint64_t w) {
    const std::uint64_t first = std::min(words, w * per);
    const std::uint64_t begin = first * 8;
    const std::uint64_t end = std::min(n, (first + per) * 8);
    if (begin < end) sums[w] = content_hash_sum(bytes.subspan(begin, end - begin), first);
  };
  std::vector<std::thread> threads;
  try {
    for (std::uint64_t w = 1; w < workers; ++w) threads.emplace_back(hash_piece, w);
  } catch (...) {
    // No thread to be had: hash the rest here, as the serial path would.
    for (std::uint64_t w = threads.size() + 1; w < workers; ++w) hash_piece(w);
  }
  hash_piece(0);
  for (std::thread& t : threads) t.join();
  std::uint64_t sum = 0;
  for (const std::uint64_t s : sums) sum += s;
  return hash_finish(sum, n);
}

void ContentHasher::update(std::span<const std::byte> bytes) noexcept {
  if (bytes.empty()) return;  // (data() may be null)
  std::uint64_t have = total_ % 8;
  if (have != 0) {  // complete the unfinished word first
    const std::uint64_t take = std::min<std::uint64_t>(8 - have, bytes.size());
    std::memcpy(partial_ + have, bytes.data(), take);
    total_ += take;
    bytes = bytes.subspan(take);
    if (have + take < 8) return;
    sum_ += hash_word(load_partial_word(partial_, 8), total_ / 8 - 1);
  }
  const std::uint64_t whole = bytes.size() - bytes.size() % 8;
  sum_ += sum_words(bytes.data(), whole / 8, total_ / 8);
  total_ += whole;
  have = bytes.size() - whole;
  if (have != 0) std::memcpy(partial_, bytes.data() + whole, have);
  total_ += have;
}

void ContentHasher::update_pattern(Pattern pattern, std::uint64_t seed, std::uint64_t offset,
                                   std::uint64_t bytes) noexcept {
  std::array<std::byte, 4096> piece;
  for (std::uint64_t done = 0; done < bytes;) {
    const std::span<std::byte> part(piece.data(), std::min<std::uint64_t>(piece.size(), bytes - done));
    fill_with(pattern, seed, offset + done, part);
    update(part);
    done += part.size();
  }
}

std::uint64_t pattern_hash(Pattern pattern, std::uint64_t seed, std::uint64_t offset, std::uint64_t bytes) noexcept {
  ContentHasher hasher;
  hasher.update_pattern(pattern, seed, offset, bytes);
  return hasher.finish();
}

std::uint64_t ContentHasher::finish() noexcept {
  if (const std::uint64_t have = total_ % 8; have != 0) {
    sum_ += hash_word(load_partial_word(partial_, have), total_ / 8);
  }
  const std::uint64_t h = hash_finish(sum_, total_);
  sum_ = 0;
  total_ = 0;
  return h;
}

}  // namespace ferry
