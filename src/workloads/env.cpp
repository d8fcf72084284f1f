#include "workloads/env.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <utility>

#include "ferry/make_backend.hpp"

namespace ferry::workloads {

Env::~Env() {
  // Users of the engine go first; then the objects in reverse order of making.
  engine.reset();
  arena.reset();
  pool.reset();
  order.reset();
  meter.reset();
  backend.reset();
}

DeviceProfile scaled_profile(DeviceProfile profile, double s) {
  const double s2 = s * s;
  profile.link_latency_ns *= s2;
  profile.kernel_latency_ns *= s2;
  const auto g = static_cast<std::uint64_t>(static_cast<double>(profile.granularity) * s2);
  profile.granularity = std::max<std::uint64_t>(4096, std::bit_floor(std::max<std::uint64_t>(g, 1)));
  return profile;
}

Result<std::unique_ptr<Env>> make_env(const WorkloadOptions& options, double scale, std::uint64_t capacity,
                                      std::uint64_t arena_budget) {
  auto env = std::make_unique<Env>();
  BackendSpec spec;
  spec.kind = options.backend;
  spec.profile = options.profile;
  spec.seed = options.seed;
  spec.faults = options.faults;
  spec.race_check = options.race_check;
  DeviceProfile profile;
  if (spec.kind == BackendKind::sim) {
    Result<DeviceProfile> named = spec_profile(spec);
    if (!named.ok()) return std::move(named).error();
    profile = scaled_profile(*named, scale);
    spec.custom_profile = profile;
  }
  Result<std::unique_ptr<Backend>> made = make_backend(spec);
  if (!made.ok()) {
    Error e = std::move(made).error();
    if (e.code == ErrorCode::unsupported) {
      e.message = "backend " + std::string(to_string(spec.kind)) + " is not available: " + e.message;
    }
    return e;
  }
  env->backend = std::move(made).value();
  if (!env->backend->info().modeled_time) {
    // A real device: no latencies known, the meter charges bandwidth and rate only.
    const DeviceInfo& info = env->backend->info();
    profile.name = info.device;
    profile.capacity = info.capacity;
    profile.mem_bytes_per_s = info.mem_bytes_per_s;
    profile.h2d_bytes_per_s = info.h2d_bytes_per_s;
    profile.pageable_bytes_per_s = info.h2d_bytes_per_s;
    profile.flops_per_s = info.flops_per_s;
  }
  env->meter = std::make_unique<BusyMeter>(*env->backend, profile);
  env->order = std::make_unique<StreamOrder>(*env->meter);
  PoolOptions pool_options;
  pool_options.capacity = capacity;
  if (spec.kind == BackendKind::sim) {
    const double s2 = scale * scale;
    pool_options.small_limit =
        std::max<std::uint64_t>(4096, static_cast<std::uint64_t>(static_cast<double>(pool_options.small_limit) * s2));
    pool_options.release_threshold =
        static_cast<std::uint64_t>(static_cast<double>(pool_options.release_threshold) * s2);
  }
  env->pool = std::make_unique<DevicePool>(*env->order, pool_options);
  if (!env->pool->status().ok()) {
    Error e = env->pool->status().error();
    e.message = "device pool: " + e.message;
    return e;
  }
  ArenaOptions arena_options;
  arena_options.budget_bytes = arena_budget;
  env->arena = std::make_unique<HostArena>(*env->order, arena_options);
  EngineOptions engine_options;
  engine_options.policy = options.integrity;
  engine_options.probe_stream = kCompute;
  env->engine = std::make_unique<TransferEngine>(*env->pool, *env->arena, engine_options);
  if (!env->engine->status().ok()) {
    Error e = env->engine->status().error();
    e.message = "transfer engine: " + e.message;
    return e;
  }
  return env;
}

}  // namespace ferry::workloads
