// ferry — one way to make any backend: a BackendSpec names the kind and its
// settings, make_backend() builds it. Nothing above the backends compares
// backend names or includes a backend's own header; they hold a BackendSpec.
//
// Thread safety: reentrant. make_backend blocks while a device initializes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/result.hpp"

namespace ferry FERRY_API {

struct BackendSpec {
  BackendKind kind = BackendKind::sim;
  // sim: the device profile, a preset by name (device_profile.hpp), or
  // custom_profile when set (a workload's scaled profile).
  std::string profile = "h200";
  std::optional<DeviceProfile> custom_profile;
  std::uint64_t seed = 1;  // sim: same seed, same schedule and bytes
  SimFaults faults;        // sim; a backend that injects no faults refuses any
  int device = 0;          // cuda: the device ordinal
  bool race_check = false; // sim: report stream races (race.hpp); a backend that cannot refuses
  std::uint64_t sim_model_bytes_limit = 0;  // sim: SimOptions::model_bytes_limit (0: none)
  bool sim_native_graphs = false;  // sim: SimOptions::native_graphs (cuda always has them)
};

// The profile a sim spec models (custom_profile, else the named preset).
// Errors: invalid_argument (an unknown profile name, listing the presets).
Result<DeviceProfile> spec_profile(const BackendSpec& spec);

// What make_backend would refuse of `spec` before it touches a device: the one
// rule, for callers that check their options before they run anything.
// Errors: invalid_argument (an unknown sim profile; faults asked of a backend
// that injects none, naming them).
Result<void> check_spec(const BackendSpec& spec);

// Errors: those of check_spec,
// unsupported (cuda not built, no driver, no device), backend_error.
Result<std::unique_ptr<Backend>> make_backend(const BackendSpec& spec);

// True when this build can make backends of `kind` (cuda: built with the toolkit).
bool backend_built(BackendKind kind) noexcept;

// The devices of `kind` this process sees: cuda's visible devices (0 without a
// driver or device); 0 for the sim, which has no devices but those it is told of.
// Blocks while a driver initializes.
std::uint32_t visible_devices(BackendKind kind) noexcept;

// What a backend of `kind` can do, before one is made: DeviceInfo's capability
// fields (modeled_time, host_visible, race_checking, fault_injection,
// lazy_host_ranges, profiled), the rest left 0; a made backend's info() says the
// same. Code above the backends asks this or Backend::info(), never the kind.
DeviceInfo capabilities_of(BackendKind kind) noexcept;

}  // namespace ferry
