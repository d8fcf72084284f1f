// The word loop of content_hash_sum (content.cpp), in the two forms the CPU picks
// from once: portable scalar code, and AVX-512 where the CPU has it. Both return
// the sum over j < words of hash_word(word j of p, first_word + j) mod 2^64.
// Here, not in content.cpp's anonymous namespace, so that a test compares the
// two on a CPU that has both, and a benchmark measures the one a CPU without
// AVX-512 gets.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::detail {

std::uint64_t sum_words_portable(const std::byte* p, std::uint64_t words, std::uint64_t first_word) noexcept;

// Null where this build or this CPU has no AVX-512 (avx512f and avx512dq).
using SumWords = std::uint64_t (*)(const std::byte*, std::uint64_t, std::uint64_t) noexcept;
SumWords sum_words_avx512() noexcept;

}  // namespace ferry::detail
