// ferry — report 000's pinned-churn probe, on any backend (`ferry doctor`).
//
// Report 000: after heavy in-process churn of pinned allocations, host->device
// copies out of a freshly pinned buffer returned success and left the device
// bytes unchanged; a delay between pinning and copying made it far worse. The
// probe reproduces that trigger on purpose and reports what it saw:
//
//   1. churn: pin, fill and free buffers of a few MiB, `churn_rounds` times
//   2. pin one fresh small buffer with a known pattern
//   3. `copies` times: wait a growing delay, fill the device destination with a
//      different pattern, copy the buffer to it, read it back and compare
//
// On sim the delay advances the virtual clock (Backend::advance); on any
// other backend it is a real sleep — acceptable in this diagnostic only, never
// in tests. The probe deliberately bypasses the host arena: it measures the raw
// driver behaviour the arena exists to avoid.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

struct ChurnProbeOptions {
  std::uint32_t churn_rounds = 20;                        // pin+fill+free rounds (2 buffers each)
  std::uint64_t churn_bytes = std::uint64_t{4} << 20;     // size of the larger buffer per round
  std::uint32_t copies = 8;                               // probe copies (>= 1)
  std::uint64_t probe_bytes = 256;                        // size of the fresh buffer (>= 1)
  std::uint64_t delay_step_ns = 5'000'000;                // copy i waits (i + 1) * step first
  StreamId stream = 0;
};

struct ChurnVerdict {
  std::uint32_t copies = 0;       // copies attempted
  std::uint32_t failures = 0;     // copies that reported success and left wrong bytes
  bool healthy = false;           // failures == 0
  std::string verdict;            // one plain line for a person
  std::vector<bool> arrived;      // per copy: the bytes arrived
  std::uint64_t churn_pins = 0;   // pinned allocations the churn made
  bool simulated_delays = false;  // delays advanced a virtual clock (sim)
};

// Runs the probe through `pool` (device memory) and its StreamOrder. Blocks:
// on non-sim backends for the sum of the delays (about 180 ms by default).
// Errors: invalid_argument (copies or probe_bytes 0, churn_bytes 0 with rounds),
// out_of_memory / backend_error from pinning or the device, timeout. A copy that
// silently failed is not an error: it is what the verdict reports.
Result<ChurnVerdict> run_churn_probe(DevicePool& pool, const ChurnProbeOptions& options = {});

}  // namespace ferry
