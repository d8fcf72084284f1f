// One test suite, every backend: fixtures take the backend name as their
// parameter, and suites are instantiated with FERRY_BACKENDS. A backend this
// machine cannot run (cuda without a GPU) makes its tests SKIP.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ferry/backend.hpp"
#include "ferry/make_backend.hpp"

namespace ferry::testing {

// The spec of the backend named `name` (a test parameter: "sim" or "cuda").
inline BackendSpec backend_spec(const std::string& name, SimFaults faults = {}, std::uint64_t seed = 1,
                                const char* profile = "tiny") {
  BackendSpec spec;
  spec.kind = parse_backend_kind(name).value_or(BackendKind::sim);
  spec.profile = profile;
  spec.seed = seed;
  if (spec.kind == BackendKind::sim) spec.faults = faults;
  return spec;
}

// Null when this machine cannot run the backend (cuda without a GPU).
inline std::unique_ptr<Backend> make_backend(const std::string& name, SimFaults faults = {},
                                             std::uint64_t seed = 1, const char* profile = "tiny") {
  auto made = ::ferry::make_backend(backend_spec(name, faults, seed, profile));
  if (!made.ok()) return nullptr;
  return std::move(made).value();
}

inline std::string backend_skip_reason(const std::string& name) {
  auto made = ::ferry::make_backend(backend_spec(name));
  return made.ok() ? std::string{} : made.error().message;
}

// Names instances after their backend (Suite.Test/sim, Suite.Test/cuda), so that
// --gtest_filter='*/cuda' picks a backend.
inline std::string backend_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

// The backends, and the name of each instance:
// INSTANTIATE_TEST_SUITE_P(Backends, Suite, FERRY_BACKENDS).
#define FERRY_BACKEND_NAMES ::testing::Values(std::string("sim"), std::string("cuda"))
#define FERRY_BACKENDS FERRY_BACKEND_NAMES, ::ferry::testing::backend_name
// Inside a ::testing::Combine (which names its instances itself): FERRY_BACKEND_NAMES.

// Skips the current test when `backend` is null (a backend this machine lacks).
#define FERRY_REQUIRE_BACKEND(backend, name)                                        \
  do {                                                                             \
    if (!(backend)) GTEST_SKIP() << "backend " << (name) << " unavailable: "        \
                                 << ::ferry::testing::backend_skip_reason(name);    \
  } while (0)

}  // namespace ferry::testing
