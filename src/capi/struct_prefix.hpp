// The C ABI's structs that grow (ferry.h, "Structs that grow carry their size"):
// a caller's struct_size says how much of the struct it has; ferry reads and
// writes only that prefix. Shared by libferry.so and libferry_torch.so.
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <string>

#include "ferry/result.hpp"

namespace ferry::detail {

// Larger than any struct ferry will grow to: a size beyond it is garbage.
inline constexpr std::size_t kMaxStructSize = 4096;

// A caller's struct_size and where it came from, for the refusal's message: the
// struct itself (never set if the struct was not initialised) or an argument (the
// ..._sized functions, which ferry.h's macros call with the caller's sizeof).
struct CallerSize {
  std::size_t bytes;
  std::string field;  // "out->struct_size" or "struct_size"
  bool in_struct;
};

inline CallerSize size_in_struct(std::size_t bytes, const char* what) {
  return {bytes, std::string(what) + "->struct_size", true};
}
inline CallerSize size_argument(std::size_t bytes) { return {bytes, "struct_size", false}; }

// The size a stats getter writes: its struct_size argument when the caller passed
// one, else out->struct_size.
template <class T>
CallerSize caller_size(const T* out, std::optional<std::size_t> argument) {
  return argument ? size_argument(*argument) : size_in_struct(out->struct_size, "out");
}

// `size` as the struct_size of a T whose first release was `first` bytes long.
template <class T>
Result<void> check_struct_size(const CallerSize& size, std::size_t first, const char* fn, const char* type) {
  const std::string where = std::string(fn) + ": " + size.field + " ";
  if (size.bytes == 0 && size.in_struct) {
    return make_error(ErrorCode::invalid_argument,
                      where + "is 0: the struct was not initialised (set struct_size to sizeof(" + type + "))");
  }
  if (size.bytes < first || size.bytes > kMaxStructSize || size.bytes % alignof(T) != 0) {
    return make_error(ErrorCode::invalid_argument,
                      where + "is " + std::to_string(size.bytes) + ", not a size of " + type + " (at least " +
                          std::to_string(first) + ", at most " + std::to_string(kMaxStructSize) +
                          ", a multiple of " + std::to_string(alignof(T)) + "; this library's is " +
                          std::to_string(sizeof(T)) + ")");
  }
  return {};
}

// *in as this library's T: the caller's prefix over `defaults`. A newer caller's
// fields beyond this library's struct must hold zero (their default), else the
// caller asked for something this library cannot do.
template <class T>
Result<T> read_prefix(const T& in, T defaults, std::size_t first, const char* fn, const char* what,
                      const char* type) {
  FERRY_TRY(check_struct_size<T>(size_in_struct(in.struct_size, what), first, fn, type));
  const std::size_t n = in.struct_size < sizeof(T) ? in.struct_size : sizeof(T);
  std::memcpy(&defaults, &in, n);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&in);
  for (std::size_t i = sizeof(T); i < in.struct_size; ++i) {
    if (bytes[i] != 0) {
      return make_error(ErrorCode::unsupported, std::string(fn) + ": " + what + " sets byte " + std::to_string(i) +
                                                    " of " + type + ", a field this library (" +
                                                    std::to_string(sizeof(T)) + " bytes) does not know");
    }
  }
  defaults.struct_size = n;
  return defaults;
}

// `value` into the caller's *out, only the `size` bytes the caller has;
// out->struct_size becomes the bytes written.
template <class T>
Result<void> write_prefix(T value, T* out, const CallerSize& size, std::size_t first, const char* fn,
                          const char* type) {
  FERRY_TRY(check_struct_size<T>(size, first, fn, type));
  const std::size_t n = size.bytes < sizeof(T) ? size.bytes : sizeof(T);
  value.struct_size = n;
  std::memcpy(static_cast<void*>(out), &value, n);
  return {};
}

}  // namespace ferry::detail
