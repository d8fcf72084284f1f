// ferry — reading a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot)
// as a ferry trace (docs/spec.md §3, "PyTorch memory snapshots").
//
// The snapshot is a pickle; ferry reads it with a restricted unpickler that
// executes nothing: every opcode that names or calls a Python object is
// refused (invalid_argument naming the opcode and its byte offset). No Python
// is needed at run time.
//
// Thread safety: the functions are reentrant and keep no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/result.hpp"

namespace ferry FERRY_API {

// What the snapshot's own history says (the replay report's `source` object).
struct TorchSnapshotSource {
  std::string format = "torch-snapshot";
  int device = 0;                          // the device whose history was imported
  int devices = 0;                         // devices with a history in the file
  std::uint64_t events = 0;                // entries of that device's history
  std::uint64_t allocs = 0;                // `alloc` entries
  std::uint64_t frees = 0;                 // blocks freed within the history (free_completed)
  std::uint64_t streams = 0;               // distinct streams of the allocations
  std::uint64_t reconstructed_blocks = 0;  // blocks alive before the history starts
  std::uint64_t peak_requested_bytes = 0;  // most bytes of live blocks, alloc to free_completed
  std::uint64_t peak_reserved_bytes = 0;   // most bytes of live segments (PyTorch's reserved)
  std::uint64_t segment_allocs = 0;        // segment_alloc and segment_map entries
  std::uint64_t ooms = 0;                  // `oom` entries
  std::uint64_t deferred_frees = 0;        // frees completed later than requested (record_stream)
  // PyTorch's reserved bytes along the trace, as steps {after, bytes}: after the
  // trace's first `after` lines, until the next step, its segments held `bytes`.
  // The first step is {0, reserved before the history}; `after` increases.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> reserved_steps;
};

struct TorchSnapshotImport {
  std::string trace;  // ferry trace text, JSON Lines (docs/spec.md §3)
  TorchSnapshotSource source;
};

// True when `bytes` opens like a pickle of protocol 2 to 5: how `ferry replay`,
// `snapshot` and `bench fragmentation` tell a snapshot from a trace. Never fails.
bool is_torch_snapshot(std::string_view bytes) noexcept;

// Imports the history of `device` (default: the device with the most entries)
// from the snapshot's bytes. `name` stands for the file in messages.
// Errors: invalid_argument ("NAME: what is wrong"): not a pickle, a refused
// opcode (named with its byte offset), truncated, the wrong shape or types (the
// message names the entry's index and field: device_traces[0][17].size), an
// unknown action, a second alloc at a live address, more than 63 streams, a
// device with no history, a history that contradicts itself (overlapping live
// blocks, a second free, an active block listed twice: both entries named), a
// figure of 2^50 bytes or more, a read over 64 visits or a trace over 64 bytes
// per byte of the file (docs/spec.md §3); out_of_memory when the host cannot
// hold the import.
// Nothing in the file is executed in any case.
Result<TorchSnapshotImport> import_torch_snapshot(std::string_view bytes, std::string_view name,
                                                  std::optional<int> device = std::nullopt);

// The source figures as one JSON object (the report's `source`, docs/spec.md §5).
std::string source_json(const TorchSnapshotSource& source);

}  // namespace ferry
