#include "ferry/content.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <thread>
#include <vector>

namespace ferry {

static_assert(std::endian::native == std::endian::little,
              "content definitions assume a little-endian host");

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

// The word loop of content_hash_sum, over `words` full words from p. Compiled
// twice: for the baseline ISA and, where the CPU has it, AVX-512 (eight words a
// step, with a 64-bit vector multiply); the sum is the same either way.
[[gnu::always_inline]] inline std::uint64_t sum_full_words(const std::byte* p, std::uint64_t words,
                                                          std::uint64_t first_word) noexcept {
  std::uint64_t sum = 0;
  for (std::uint64_t j = 0; j < words; ++j) {
    std::uint64_t w;
    std::memcpy(&w, p + 8 * j, 8);
    sum += hash_word(w, first_word + j);
  }
  return sum;
}

std::uint64_t sum_full_words_baseline(const std::byte* p, std::uint64_t words,
                                      std::uint64_t first_word) noexcept {
  return sum_full_words(p, words, first_word);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
[[gnu::target("avx512f,avx512dq")]] std::uint64_t sum_full_words_avx512(
    const std::byte* p, std::uint64_t words, std::uint64_t first_word) noexcept {
  return sum_full_words(p, words, first_word);
}

std::uint64_t sum_words(const std::byte* p, std::uint64_t words, std::uint64_t first_word) noexcept {
  using SumWords = std::uint64_t (*)(const std::byte*, std::uint64_t, std::uint64_t) noexcept;
  // Chosen once, on first use (a static initializer elsewhere may hash too).
  static const SumWords chosen = [] {
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
    return avx512 ? &sum_full_words_avx512 : &sum_full_words_baseline;
  }();
  return chosen(p, words, first_word);
}
#else
std::uint64_t sum_words(const std::byte* p, std::uint64_t words, std::uint64_t first_word) noexcept {
  return sum_full_words_baseline(p, words, first_word);
}
#endif

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
