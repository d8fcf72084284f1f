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
//   peer copy           NVLink-class link: peer latency + bytes / peer bandwidth;
//                       PCIe: link latency + bytes / pinned link bandwidth
//   waits, nop          0
//
// A profile figure of 0 models that resource as instantaneous. Durations round
// up to whole nanoseconds (any real work takes at least 1 ns) and are capped at
// 1e18 ns so absurd figures cannot overflow a clock. The formula reads only the
// op table (op_contract.hpp): an op's engine, operands and stated figures.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/op_contract.hpp"  // Engine, engine_of: the op table

namespace ferry FERRY_API {

// Whether [ptr, ptr + bytes) is pinned or registered host memory (pinned link
// bandwidth) rather than pageable.
using PinnedQuery = std::function<bool(const std::byte* ptr, std::uint64_t bytes)>;

std::uint64_t modeled_ns(const Op& op, const DeviceProfile& profile, const PinnedQuery& pinned);

// The one roofline, unrounded: latency + max(flops / flops_per_s, bytes /
// bytes_per_s), in ns (a rate of 0 models that resource as instantaneous).
// modeled_ns charges every kernel with it; a workload its host execution.
double roofline_ns(double latency_ns, double flops, double flops_per_s, std::uint64_t bytes,
                   double bytes_per_s) noexcept;

}  // namespace ferry
