// The C ABI's boundary helpers (ferry_c.cpp), for the ABI's other files: a status
// and this thread's message from an Error, the guard no exception crosses, and the
// Runtime behind a ferry_runtime.
#pragma once

#include <functional>

#include "ferry/ferry.h"
#include "ferry/runtime.hpp"

namespace ferry::capi {

ferry_status fail(const Error& error);
ferry_status ok();
ferry_status null_argument(const char* fn, const char* what);
// Runs `body` as every entry point does: refused inside a launch function, and an
// exception turned into a status.
ferry_status guarded(const char* fn, const std::function<ferry_status()>& body) noexcept;
// `rt` must not be NULL.
Runtime& runtime_of(ferry_runtime rt) noexcept;

template <class T>
ferry_status done(const Result<T>& r) {
  return r.ok() ? ok() : fail(r.error());
}

}  // namespace ferry::capi
