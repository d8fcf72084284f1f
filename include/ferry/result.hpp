// ferry — errors as values.
//
// Every fallible public call returns Result<T>: either a T or an Error carrying a
// code and a message that names the request and the state. Nothing in the public
// API throws; a Result is never "empty".
#pragma once

#include <cassert>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "ferry/api.hpp"

namespace ferry FERRY_API {

enum class ErrorCode : std::uint8_t {
  out_of_memory,     // the request does not fit even after the I4 reclaim sequence
  stale_handle,      // a freed, reused, foreign or forged handle
  invalid_argument,  // the caller's input is wrong (size 0, overflow, unknown name...)
  transfer_corrupt,  // a transfer kept mismatching after every fallback path (I5)
  backend_error,     // the backend failed (driver error, injected fault, broken stream)
  unsupported,       // the backend or build lacks the feature
  timeout,           // a bounded wait ran out
};

// Stable, snake_case name used in reports ("out_of_memory", ...).
std::string_view to_string(ErrorCode code) noexcept;

struct Error {
  ErrorCode code;
  std::string message;
};

inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  // Precondition: ok(). Violations are our bugs, hence assert.
  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  // Precondition: !ok().
  const Error& error() const& { assert(!ok()); return std::get<1>(v_); }
  Error&& error() && { assert(!ok()); return std::get<1>(std::move(v_)); }

  T value_or(T fallback) const& { return ok() ? std::get<0>(v_) : std::move(fallback); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  bool ok() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  const Error& error() const& { assert(!ok_); return error_; }
  Error&& error() && { assert(!ok_); return std::move(error_); }

 private:
  Error error_{ErrorCode::backend_error, {}};
  bool ok_ = true;
};

}  // namespace ferry

// Propagates an error from an expression yielding Result<...>.
#define FERRY_TRY(expr)                                   \
  do {                                                    \
    auto ferry_try_r_ = (expr);                           \
    if (!ferry_try_r_.ok()) return std::move(ferry_try_r_).error(); \
  } while (0)
