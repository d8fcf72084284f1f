// ferry — errors as values.
//
// Every fallible public call returns Result<T>: either a T or an Error carrying a
// code and a message that names the request and the state. Nothing in the public
// API throws; a Result is never "empty".
#pragma once

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

[[nodiscard]] inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}

namespace detail {
// Reading the value of an error (or the error of a value) is the caller's bug:
// prints what the Result held, the error's own code and message, and aborts.
[[noreturn]] void result_misuse(const char* call, const Error* error) noexcept;
}  // namespace detail

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::in_place_index<1>, std::move(error)) {}  // NOLINT

  [[nodiscard]] bool ok() const noexcept { return v_.index() == 0; }
  [[nodiscard]] explicit operator bool() const noexcept { return ok(); }

  // Precondition: ok(). On an error: terminates in every build type, printing the
  // error's code and message (detail::result_misuse), never std::bad_variant_access.
  [[nodiscard]] T& value() & { return *checked_value(); }
  [[nodiscard]] const T& value() const& { return *checked_value(); }
  [[nodiscard]] T&& value() && { return std::move(*checked_value()); }
  [[nodiscard]] T& operator*() & { return value(); }
  [[nodiscard]] const T& operator*() const& { return value(); }
  [[nodiscard]] T* operator->() { return &value(); }
  [[nodiscard]] const T* operator->() const { return &value(); }

  // Precondition: !ok(). On a value: terminates, saying so.
  [[nodiscard]] const Error& error() const& { return *checked_error(); }
  [[nodiscard]] Error&& error() && { return std::move(*checked_error()); }

  [[nodiscard]] T value_or(T fallback) const& { return ok() ? std::get<0>(v_) : std::move(fallback); }

 private:
  T* checked_value() const {
    if (!ok()) detail::result_misuse("value()", std::get_if<1>(&v_));
    return const_cast<T*>(std::get_if<0>(&v_));
  }
  Error* checked_error() const {
    if (ok()) detail::result_misuse("error()", nullptr);
    return const_cast<Error*>(std::get_if<1>(&v_));
  }

  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] explicit operator bool() const noexcept { return ok_; }
  // Precondition: !ok(). On success: terminates, saying so.
  [[nodiscard]] const Error& error() const& {
    if (ok_) detail::result_misuse("error()", nullptr);
    return error_;
  }
  [[nodiscard]] Error&& error() && {
    if (ok_) detail::result_misuse("error()", nullptr);
    return std::move(error_);
  }

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
