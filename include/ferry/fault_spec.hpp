// ferry — fault injection specs for the sim backend (`--inject ...`).
//
// Grammar (comma-separated items; the option may also be repeated):
//
//   pinned-noop[:P]   report 000: pinned buffers go stale with probability P in [0,1]
//                     (default 1); copies out of a stale buffer silently do nothing
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

#include <span>
#include <string>
#include <string_view>

#include "ferry/result.hpp"
#include "ferry/sim_backend.hpp"

namespace ferry {

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
