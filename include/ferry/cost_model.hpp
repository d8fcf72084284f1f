// ferry — the one cost model: how long an op takes on a device profile, and
// which engine it occupies. The sim's clock runs on it and the workloads' busy
// meter charges it, so the two cannot drift apart. (The meter charges at
// enqueue: injected completion delays and a failed held op's stand-in no-op are
// the sim's alone.)
//
//   fill, hash          kernel latency + bytes / memory bandwidth
//   device copy         kernel latency + 2 * bytes / memory bandwidth (read and write)
//   compute, user       kernel latency + max(flops / rate, bytes / memory bandwidth);
//                       an op with no figures charges the bytes it touches (a GEMM
//                       user op's figures default to its shape's: gemm.hpp)
//   host <-> device     link latency + bytes / link bandwidth (pinned or pageable),
//                       one latency per batch
//   waits, nop          0
//
// A profile figure of 0 models that resource as instantaneous. Durations round
// up to whole nanoseconds (any real work takes at least 1 ns) and are capped at
// 1e18 ns so absurd figures cannot overflow a clock. Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_profile.hpp"

namespace ferry FERRY_API {

enum class Engine : std::uint8_t {
  none,      // waits and no-ops
  compute,   // fill, compute, user, hash, device-to-device copy
  copy_h2d,  // a copy engine and the host->device direction of the link
  copy_d2h,  // a copy engine and the device->host direction of the link
};
Engine engine_of(const Op& op) noexcept;

// Whether [ptr, ptr + bytes) is pinned or registered host memory (pinned link
// bandwidth) rather than pageable.
using PinnedQuery = std::function<bool(const std::byte* ptr, std::uint64_t bytes)>;

std::uint64_t modeled_ns(const Op& op, const DeviceProfile& profile, const PinnedQuery& pinned);

}  // namespace ferry
