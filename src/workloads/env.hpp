// Internal to the workloads: the run environment, the backend, meter, stream
// order, pool, arena and engine one live run owns, made from the options.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/runtime.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/workload.hpp"
#include "workloads/meter.hpp"

namespace ferry::workloads {

// Streams every workload uses. Every host->device upload of weights runs on
// kUpload: the host link is one resource, whatever number of copy engines the
// device has.
inline constexpr StreamId kCompute = 0;
inline constexpr StreamId kUpload = 1;
inline constexpr StreamId kPrefetch = 2;
inline constexpr StreamId kHostIo = 3;  // moe host execution: activations out, results in

// One device's parts, by the names the workloads use.
struct DeviceEnv {
  Backend* backend = nullptr;  // the one make_backend built; the stack sits on `meter`, which wraps it
  BusyMeter* meter = nullptr;
  StreamOrder* order = nullptr;
  DevicePool* pool = nullptr;
  HostArena* arena = nullptr;
  TransferEngine* engine = nullptr;
};

// The Runtime one live run owns (a meter per device in its backend adaptor
// slot) and each device's parts; `clock` keeps several modeled devices' clocks
// one host's (meter.hpp), null with one device or a real one.
struct Env {
  std::unique_ptr<HostClock> clock;  // declared first: outlives the meters that read it
  std::unique_ptr<Runtime> runtime;
  std::vector<DeviceEnv> devices;  // by index; never empty
  DeviceEnv& at(std::uint32_t device) { return devices[device]; }
};

// The sim profile a run at scale `s` models: per-operation latencies and the
// mapping granularity shrink by s^2 like every buffer does, so the timeline and
// the granule-level layout are the full shape's, shrunk (see workload.hpp).
DeviceProfile scaled_profile(DeviceProfile profile, double s);

// Makes the Runtime over options.devices devices: each a backend, meter, order,
// pool (of `capacity`), arena and engine, the faults on options.fault_device
// only when it is set. On a profiled backend (the sim) the profile is
// scaled_profile(options.profile, scale), and the pool's small-block limit and
// release threshold shrink by scale^2 too.
// Errors: invalid_argument (profile), unsupported (backend), backend_error.
Result<std::unique_ptr<Env>> make_env(const WorkloadOptions& options, double scale, std::uint64_t capacity,
                                      std::uint64_t arena_budget);

}  // namespace ferry::workloads
