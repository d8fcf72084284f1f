// The C ABI's structs that grow (ferry.h, "Structs that grow carry their size"):
// a caller's struct_size says how much of the struct it has; ferry reads and
// writes only that prefix. Shared by libferry.so and libferry_torch.so.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "ferry/result.hpp"

namespace ferry::detail {

// Larger than any struct ferry will grow to: a size beyond it is garbage.
inline constexpr std::size_t kMaxStructSize = 4096;

// `size` as the struct_size of a T whose first release was `first` bytes long.
template <class T>
Result<void> check_struct_size(std::size_t size, std::size_t first, const char* fn, const char* what,
                               const char* type) {
  const std::string where = std::string(fn) + ": " + what + "->struct_size ";
  if (size == 0) {
    return make_error(ErrorCode::invalid_argument,
                      where + "is 0: the struct was not initialised (set struct_size to sizeof(" + type + "))");
  }
  if (size < first || size > kMaxStructSize || size % alignof(T) != 0) {
    return make_error(ErrorCode::invalid_argument,
                      where + "is " + std::to_string(size) + ", not a size of " + type + " (at least " +
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
  FERRY_TRY(check_struct_size<T>(in.struct_size, first, fn, what, type));
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

// `value` into the caller's *out, only its prefix; out->struct_size becomes the
// bytes written.
template <class T>
Result<void> write_prefix(T value, T* out, std::size_t first, const char* fn, const char* what, const char* type) {
  FERRY_TRY(check_struct_size<T>(out->struct_size, first, fn, what, type));
  const std::size_t n = out->struct_size < sizeof(T) ? out->struct_size : sizeof(T);
  value.struct_size = n;
  std::memcpy(static_cast<void*>(out), &value, n);
  return {};
}

}  // namespace ferry::detail
