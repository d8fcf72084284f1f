// The fuzzers' one way of reading a libFuzzer input as a stream of decisions,
// and of reporting what they found. Past the end every read is 0, so a short
// input is a valid, shorter program.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ferry_fuzz {

// Prints `what` under the target's name and aborts: libFuzzer keeps the input.
[[noreturn]] inline void finding(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", target, what.c_str());
  std::abort();
}

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  std::uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  // `bytes` bytes, big-endian.
  std::uint64_t u64(int bytes) {
    std::uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | byte();
    return v;
  }
  // Up to `max` bytes, the length read first.
  std::string text(std::size_t max) {
    std::string s;
    const std::size_t n = byte() % (max + 1);
    for (std::size_t i = 0; i < n && !empty(); ++i) s += static_cast<char>(byte());
    return s;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_, pos_ = 0;
};

}  // namespace ferry_fuzz
