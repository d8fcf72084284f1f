// The one place that knows every backend.
#include "ferry/make_backend.hpp"

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

Result<std::unique_ptr<Backend>> make_backend(const BackendSpec& spec) {
  switch (spec.kind) {
    case BackendKind::sim: {
      Result<DeviceProfile> profile = spec_profile(spec);
      if (!profile.ok()) return std::move(profile).error();
      std::unique_ptr<Backend> sim = make_sim_backend({*profile, spec.seed, spec.faults});
      return sim;
    }
    case BackendKind::cuda: {
      if (spec.faults.any()) {
        return make_error(ErrorCode::invalid_argument,
                          "fault injection (" + describe(spec.faults) +
                              ") is a sim feature; the cuda backend injects no faults");
      }
      return make_cuda_backend(CudaOptions{spec.device});
    }
  }
  return make_error(ErrorCode::invalid_argument, "unknown backend kind");
}

}  // namespace ferry
