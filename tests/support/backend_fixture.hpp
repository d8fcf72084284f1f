// One test suite, every backend: fixtures take the backend name as their
// parameter, and suites are instantiated with FERRY_BACKENDS. A backend this
// machine does not have (cuda without a GPU or driver) makes its tests SKIP; one
// that is there and fails to start makes them FAIL.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ferry/backend.hpp"
#include "ferry/make_backend.hpp"

namespace ferry::testing {

// The sim instance that models the H200's 2 MiB granule (the h200 profile), run
// beside "sim" (64 KiB granules) so that no test assumes the granule it was written on.
inline constexpr const char* kSimH200 = "sim_h200";

// The spec of the backend named `name` (a test parameter: "sim", "cuda", or
// kSimH200, the sim on the h200 profile whatever `profile` says).
inline BackendSpec backend_spec(const std::string& name, SimFaults faults = {}, std::uint64_t seed = 1,
                                const char* profile = "tiny") {
  BackendSpec spec;
  const bool h200 = name == kSimH200;
  spec.kind = h200 ? BackendKind::sim : parse_backend_kind(name).value_or(BackendKind::sim);
  spec.profile = h200 ? "h200" : profile;
  spec.seed = seed;
  if (spec.kind == BackendKind::sim) spec.faults = faults;
  return spec;
}

// Whether a backend that failed to start means "this machine has no such device"
// (SKIP) or a bug (FAIL): only `unsupported` — no device, no driver, or a build
// without the backend — is a reason to skip. Any other start-up error on a machine
// that has the device must fail the suite, never hide it as skipped.
inline bool is_unavailable(const Error& e) { return e.code == ErrorCode::unsupported; }

// The error of this thread's last make_backend() that returned null.
inline Error& last_backend_error() {
  thread_local Error e;
  return e;
}

// Null when the backend could not be made; FERRY_REQUIRE_BACKEND then skips or
// fails by last_backend_error().
inline std::unique_ptr<Backend> make_backend(const std::string& name, SimFaults faults = {},
                                             std::uint64_t seed = 1, const char* profile = "tiny") {
  auto made = ::ferry::make_backend(backend_spec(name, faults, seed, profile));
  if (!made.ok()) {
    last_backend_error() = made.error();
    return nullptr;
  }
  return std::move(made).value();
}

// Why this machine lacks the backend (skip), or empty: it has it, or it has the
// device and the backend failed to start (the caller's own make then fails the test).
inline std::string backend_skip_reason(const std::string& name) {
  auto made = ::ferry::make_backend(backend_spec(name));
  return !made.ok() && is_unavailable(made.error()) ? made.error().message : std::string{};
}

// Names instances after their backend (Suite.Test/sim, Suite.Test/cuda), so that
// --gtest_filter='*/cuda' picks a backend.
inline std::string backend_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

// Every backend's name, from the one name table (backend_kinds()).
inline std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const NamedValue<BackendKind>& n : backend_kinds()) names.emplace_back(n.name);
  return names;
}

// The backends, and the name of each instance:
// INSTANTIATE_TEST_SUITE_P(Backends, Suite, FERRY_BACKENDS).
#define FERRY_BACKEND_NAMES ::testing::ValuesIn(::ferry::testing::backend_names())
#define FERRY_BACKENDS FERRY_BACKEND_NAMES, ::ferry::testing::backend_name
// The second sim pass at the H200's granule: INSTANTIATE_TEST_SUITE_P(H200, Suite,
// FERRY_SIM_H200) names its instances H200/Suite.Test/sim_h200.
#define FERRY_SIM_H200 ::testing::Values(std::string(::ferry::testing::kSimH200)), ::ferry::testing::backend_name
// Inside a ::testing::Combine (which names its instances itself): FERRY_BACKEND_NAMES.

// When `backend` is null: skips the current test if the machine lacks the backend,
// fails it (fatally: SetUp stops the test body) on any other start-up error.
#define FERRY_REQUIRE_BACKEND(backend, name)                                                     \
  do {                                                                                          \
    if (!(backend)) {                                                                           \
      const ::ferry::Error& ferry_why_ = ::ferry::testing::last_backend_error();                \
      if (::ferry::testing::is_unavailable(ferry_why_)) {                                       \
        GTEST_SKIP() << "backend " << (name) << " unavailable: " << ferry_why_.message;         \
      }                                                                                         \
      FAIL() << "backend " << (name) << " failed to start (" << ::ferry::to_string(ferry_why_.code)     \
             << "): " << ferry_why_.message;                                                    \
    }                                                                                           \
  } while (0)

// Skips the current test when the machine lacks backend `name` (see is_unavailable).
#define FERRY_SKIP_WITHOUT_BACKEND(name)                                                         \
  do {                                                                                          \
    if (const std::string ferry_why_ = ::ferry::testing::backend_skip_reason(name);             \
        !ferry_why_.empty()) {                                                                  \
      GTEST_SKIP() << "backend " << (name) << " unavailable: " << ferry_why_;                   \
    }                                                                                           \
  } while (0)

}  // namespace ferry::testing
