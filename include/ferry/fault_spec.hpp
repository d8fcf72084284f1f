// ferry — the faults the sim backend injects, and their specs (`--inject ...`).
//
// Grammar (comma-separated items; the option may also be repeated):
//
//   pinned-noop[:P]   report 000: pinned buffers go stale with probability P in [0,1]
//                     (default 1); copies out of a stale buffer silently do nothing
//   peer-noop[:P]     each copy from a peer device silently does nothing with
//                     probability P in [0,1] (default 1): report 000's fault on a peer link
//   batch-broken      the batched copy applies only the first copy of each batch
//   batch-missing     the backend has no batched copy
//   fail-map:N        the N-th (1-based, N >= 1) device map() call fails
//   delay:NS          every completion is delayed by up to NS virtual nanoseconds
//   none              no fault (useful to reset in scripts)
//
// Items apply left to right; a later item overrides an earlier one of the same kind.
// Parsing never throws; errors are invalid_argument with the offending item and
// the grammar.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/result.hpp"

namespace ferry FERRY_API {

// The faults the sim injects (SimOptions::faults). A real device injects none.
struct SimFaults {
  // Report 000: each pinned buffer goes stale with this probability at a seeded
  // virtual time after it is pinned (sooner after heavy pinned churn and after a
  // delay between pinning and its first copy); from then on copies out of it
  // leave the destination unchanged and still report success.
  double pinned_noop = 0.0;
  // Each PeerCopyOp leaves its destination unchanged with this probability and
  // still reports success (drawn per stream and ticket).
  double peer_noop = 0.0;
  // The batched copy silently applies only the first copy of each batch.
  bool batch_broken = false;
  // The batched copy is absent (DeviceInfo::batched_copy = false).
  bool batch_missing = false;
  // map() call number N (1-based) fails with out_of_memory; 0 = never.
  std::uint64_t fail_map_call = 0;
  // Every operation's completion is delayed by a seeded amount in [0, max].
  std::uint64_t max_completion_delay_ns = 0;

  friend bool operator==(const SimFaults&, const SimFaults&) = default;
  bool any() const noexcept { return *this != SimFaults{}; }
};


// Applies one spec string (possibly comma-separated) to *faults. On error *faults
// keeps the items applied before the bad one.
Result<void> apply_fault_spec(std::string_view spec, SimFaults& faults);

// Parses every spec (each as for apply_fault_spec) onto a default SimFaults.
Result<SimFaults> parse_fault_specs(std::span<const std::string> specs);
Result<SimFaults> parse_fault_spec(std::string_view spec);

// The canonical spec of `faults` ("none" when there is none), e.g.
// "pinned-noop:0.3,batch-broken". parse_fault_spec(describe(f)) == f.
std::string describe(const SimFaults& faults);

}  // namespace ferry
