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

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/race.hpp"

namespace ferry FERRY_API {

struct SimOptions {
  DeviceProfile profile;  // left empty (no name, capacity 0): the "tiny" preset
  std::uint64_t seed = 1;
  SimFaults faults;
  // Checks every issued operation for stream races (race.hpp): vector clocks over
  // the streams and the host, a shadow of the last accesses to every byte range.
  // A Runtime's sim devices share one checker (Backend::join_race_checker).
  bool race_check = false;
  std::size_t races_kept = 64;  // races kept in full; all are counted
  // Host bytes the model may hold for device bytes written as bytes (uploads,
  // user kernels, partial writes; fills and computes are kept as their pattern).
  // 0: as many as the host gives. Past it, or when the host refuses, the op that
  // needed them fails with out_of_memory as its stream's fault; bytes unchanged.
  std::uint64_t model_bytes_limit = 0;
  // DeviceInfo::native_graphs: end_graph makes the kept ops one graph, whose launch
  // is one user op applying their effects in order (fills, computes, device
  // copies, user kernels) on its operands' views; the native path of graph replay
  // (graph.hpp) in the deterministic model. Off: the sim makes no native graphs.
  bool native_graphs = false;
};

// Sim-only controls beyond the Backend interface.
class SimBackend : public Backend {
 public:
  // fault_counters(), one at a time.
  std::uint64_t illegal_accesses() const { return fault_counters().illegal_accesses; }
  std::uint64_t swallowed_copies() const { return fault_counters().swallowed_copies; }
  // Reads device bytes directly, bypassing streams (tests and reference checks).
  virtual Result<void> peek(std::uint64_t addr, std::span<std::byte> out) const = 0;
  // Checks the model's own invariants (address space, pinned memory, streams,
  // engines). False means a bug in the sim, described in *why when given.
  virtual bool validate(std::string* why = nullptr) const = 0;
};

std::unique_ptr<SimBackend> make_sim_backend(const SimOptions& options);

// `info` with the sim's capability fields set (DeviceInfo: modeled time, host-visible
// bytes, race checking, fault injection, lazy host ranges, a profiled device): what
// every sim's info() says and capabilities_of(BackendKind::sim) answers.
DeviceInfo sim_capabilities(DeviceInfo info) noexcept;

}  // namespace ferry
