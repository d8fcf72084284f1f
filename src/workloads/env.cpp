#include "workloads/env.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <utility>

#include "ferry/make_backend.hpp"

namespace ferry::workloads {

DeviceProfile scaled_profile(DeviceProfile profile, double s) {
  const double s2 = s * s;
  profile.link_latency_ns *= s2;
  profile.kernel_latency_ns *= s2;
  profile.peer_latency_ns *= s2;
  const auto g = static_cast<std::uint64_t>(static_cast<double>(profile.granularity) * s2);
  profile.granularity = std::max<std::uint64_t>(4096, std::bit_floor(std::max<std::uint64_t>(g, 1)));
  return profile;
}

Result<std::unique_ptr<Env>> make_env(const WorkloadOptions& options, double scale, std::uint64_t capacity,
                                      std::uint64_t arena_budget) {
  RuntimeOptions o;
  o.backend.kind = options.backend;
  o.backend.profile = options.profile;
  o.backend.seed = options.seed;
  o.backend.faults = options.faults;
  o.backend.race_check = options.race_check;
  const bool profiled = capabilities_of(o.backend.kind).profiled;
  DeviceProfile profile;
  if (profiled) {
    Result<DeviceProfile> named = spec_profile(o.backend);
    if (!named.ok()) return std::move(named).error();
    profile = scaled_profile(*named, scale);
    o.backend.custom_profile = profile;
  }
  o.devices.count = options.devices;
  if (options.links) {
    o.devices.links = *options.links;  // device_specs refuses a pair beyond the count, or links on cuda
  } else if (options.devices > 1 && profiled && profile.peer_bytes_per_s > 0) {
    for (std::uint32_t a = 0; a < options.devices; ++a)
      for (std::uint32_t b = a + 1; b < options.devices; ++b) o.devices.links.push_back({a, b, PeerLink::nvlink});
  }
  if (options.fault_device) {
    o.devices.faults.assign(options.devices, SimFaults{});
    if (*options.fault_device < options.devices) o.devices.faults[*options.fault_device] = options.faults;
  }
  auto env = std::make_unique<Env>();
  if (options.devices > 1 && capabilities_of(o.backend.kind).modeled_time) env->clock = std::make_unique<HostClock>();
  std::vector<BusyMeter*> meters;
  // Called once per device, in device order.
  o.backend_adaptor = [&](Backend& made) -> Result<std::unique_ptr<Backend>> {
    if (!made.info().modeled_time) {
      // A real device: no latencies known, the meter charges bandwidth and rate only.
      const DeviceInfo& info = made.info();
      profile.name = info.device;
      profile.capacity = info.capacity;
      profile.mem_bytes_per_s = info.mem_bytes_per_s;
      profile.h2d_bytes_per_s = info.h2d_bytes_per_s;
      profile.pageable_bytes_per_s = info.h2d_bytes_per_s;
      profile.flops_per_s = info.flops_per_s;
    }
    if (env->clock) env->clock->add(made);
    auto made_meter = std::make_unique<BusyMeter>(made, profile, env->clock.get());
    meters.push_back(made_meter.get());
    return std::unique_ptr<Backend>(std::move(made_meter));
  };
  o.pool.capacity = capacity;
  if (profiled) {
    const double s2 = scale * scale;
    o.pool.small_limit =
        std::max<std::uint64_t>(4096, static_cast<std::uint64_t>(static_cast<double>(o.pool.small_limit) * s2));
    o.pool.release_threshold = static_cast<std::uint64_t>(static_cast<double>(o.pool.release_threshold) * s2);
  }
  o.arena.budget_bytes = arena_budget;
  o.engine.policy = options.integrity;
  o.engine.probe_stream = kCompute;
  Result<std::unique_ptr<Runtime>> made = Runtime::create(std::move(o));
  if (!made.ok()) return std::move(made).error();
  env->runtime = std::move(made).value();
  Runtime& rt = *env->runtime;
  for (std::uint32_t i = 0; i < rt.device_count(); ++i) {
    RuntimeDevice& d = rt.device(i);
    env->devices.push_back(DeviceEnv{&d.backend().innermost(), meters[i], &d.order(), &d.pool(), &d.arena(), &d.engine()});
  }
  return env;
}

}  // namespace ferry::workloads
