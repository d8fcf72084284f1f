// ferry — the deterministic simulated GPU (the default backend).
//
// A discrete-event model that holds real bytes in host memory. Time is virtual:
// host code advances it only by waiting (wait, synchronize) or by advance(). An
// operation starts when its stream predecessor has completed, its engine is free
// and the points it waits for have completed; its bytes change when it
// completes. Same options (seed included) -> same schedule and same bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ferry/backend.hpp"
#include "ferry/device_profile.hpp"

namespace ferry {

struct SimFaults {
  // Report 000: each pinned buffer goes stale with this probability at a seeded
  // virtual time after it is pinned (sooner after heavy pinned churn and after a
  // delay between pinning and its first copy); from then on copies out of it
  // leave the destination unchanged and still report success.
  double pinned_noop = 0.0;
  // The batched copy silently applies only the first copy of each batch.
  bool batch_broken = false;
  // The batched copy is absent (DeviceInfo::batched_copy = false).
  bool batch_missing = false;
  // map() call number N (1-based) fails with out_of_memory; 0 = never.
  std::uint64_t fail_map_call = 0;
  // Every operation's completion is delayed by a seeded amount in [0, max].
  std::uint64_t max_completion_delay_ns = 0;
};

struct SimOptions {
  DeviceProfile profile;  // left empty (no name, capacity 0): the "tiny" preset
  std::uint64_t seed = 1;
  SimFaults faults;
};

// Sim-only controls beyond the Backend interface.
class SimBackend : public Backend {
 public:
  // Moves the virtual clock forward, completing what finishes by then.
  virtual void advance(std::uint64_t ns) = 0;
  // Number of device operations that touched unmapped memory (each also makes the
  // backend return backend_error from then on). A correct runtime keeps it 0.
  virtual std::uint64_t illegal_accesses() const = 0;
  // Reads device bytes directly, bypassing streams (tests and reference checks).
  virtual Result<void> peek(std::uint64_t addr, std::span<std::byte> out) const = 0;
  // Number of copies out of pinned memory that the pinned-noop fault swallowed.
  virtual std::uint64_t swallowed_copies() const = 0;
  // Checks the model's own invariants (address space, pinned memory, streams,
  // engines). False means a bug in the sim, described in *why when given.
  virtual bool validate(std::string* why = nullptr) const = 0;
};

std::unique_ptr<SimBackend> make_sim_backend(const SimOptions& options);

}  // namespace ferry
