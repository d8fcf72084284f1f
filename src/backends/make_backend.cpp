// The one place that knows every backend.
#include "ferry/make_backend.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "ferry/cuda_backend.hpp"
#include "ferry/sim_backend.hpp"

namespace ferry {

Result<DeviceProfile> spec_profile(const BackendSpec& spec) {
  if (spec.custom_profile) return *spec.custom_profile;
  if (auto p = find_profile(spec.profile)) return *p;
  std::string known;
  for (const std::string& n : profile_names()) known += (known.empty() ? "" : ", ") + n;
  return make_error(ErrorCode::invalid_argument,
                    "unknown device profile '" + spec.profile + "'; expected " + known);
}

bool backend_built(BackendKind kind) noexcept {
  switch (kind) {
    case BackendKind::sim: return true;
    case BackendKind::cuda: return cuda_backend_built();
  }
  return false;
}

std::uint32_t visible_devices(BackendKind kind) noexcept {
  switch (kind) {
    case BackendKind::sim: return 0;
    case BackendKind::cuda: return static_cast<std::uint32_t>(std::max(0, cuda_device_count()));
  }
  return 0;
}

DeviceInfo capabilities_of(BackendKind kind) noexcept {
  DeviceInfo info;
  info.backend = kind;
  switch (kind) {
    case BackendKind::sim: return sim_capabilities(info);
    case BackendKind::cuda:
      info.native_graphs = true;  // what its info() says once a device opens (src/cuda/setup.cpp)
      return info;
  }
  return info;
}

Result<void> check_spec(const BackendSpec& spec) {
  const DeviceInfo can = capabilities_of(spec.kind);
  if (can.profiled) {
    Result<DeviceProfile> profile = spec_profile(spec);
    return profile.ok() ? Result<void>() : Result<void>(std::move(profile).error());
  }
  if (spec.faults.any() && !can.fault_injection) {
    return make_error(ErrorCode::invalid_argument, "fault injection (" + describe(spec.faults) +
                                                       ") needs the sim backend; the " +
                                                       std::string(to_string(spec.kind)) +
                                                       " backend runs on a real device");
  }
  if (spec.race_check && !can.race_checking) {
    return make_error(ErrorCode::unsupported, "race checking needs the sim backend, which sees every byte "
                                              "and every operation; the " +
                                                  std::string(to_string(spec.kind)) + " backend cannot");
  }
  return {};
}

Result<std::unique_ptr<Backend>> make_backend(const BackendSpec& spec) {
  FERRY_TRY(check_spec(spec));
  switch (spec.kind) {
    case BackendKind::sim: {
      SimOptions options{*spec_profile(spec), spec.seed, spec.faults};
      options.race_check = spec.race_check;
      options.model_bytes_limit = spec.sim_model_bytes_limit;
      options.native_graphs = spec.sim_native_graphs;
      std::unique_ptr<Backend> sim = make_sim_backend(options);
      return sim;
    }
    case BackendKind::cuda:
      return make_cuda_backend(CudaOptions{spec.device});
  }
  return make_error(ErrorCode::invalid_argument, "unknown backend kind");
}

}  // namespace ferry
