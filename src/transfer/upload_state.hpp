// One upload in flight (the opaque detail::UploadState behind PendingUpload):
// the plan's ranges, each range's bytes of truth and history (RangeState), and
// the round of copies now in flight (Attempt), each through one of the paths
// the engine knows (Path, best first; transfer_engine.hpp lists them).
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "transfer/engine_state.hpp"

namespace ferry::detail {

enum class Path : std::uint8_t { batched, per_copy, staged, pageable };

const char* path_name(Path p);

// One range's bytes of truth and its history.
struct RangeState {
  const std::byte* origin = nullptr;  // the bytes the device must end up holding
  std::uint64_t bytes = 0;
  HostBlock own_block{};              // a staging block holding origin (plain host source)
  std::shared_ptr<Bytes> own_heap;    // origin in heap memory (staging refused)
  std::uint64_t hash = 0;             // content_hash(origin) (verify)
  std::uint32_t attempts = 0;
  std::string tried;                  // "batched, staged, ..." for the error message
  bool failed = false;                // failed at least once
  bool done = false;
};

// One copy of one range in the current round.
struct Attempt {
  std::uint32_t range = 0;
  Path path = Path::per_copy;
  const std::byte* src = nullptr;     // what the copy reads
  bool leased_src = false;            // src lies in a block or registered region
  bool in_batch = false;              // rode in a BatchCopyToDeviceOp
  bool has_units = false;
  PinnedUnitId first_unit = 0, last_unit = 0;
  HostBlock temp_block{};             // attempt-owned staging block (freed after enqueue)
  std::shared_ptr<Bytes> temp_heap;   // attempt-owned pageable copy
  std::uint64_t device_hash = 0;      // what the device held after a failed copy (verify)

  // Whether the copy read one of `units`.
  bool reads_any(const std::set<PinnedUnitId>& units) const {
    if (!has_units) return false;
    for (PinnedUnitId u = first_unit; u <= last_unit; ++u) {
      if (units.count(u)) return true;
    }
    return false;
  }
};

struct UploadState {
  HostArena* arena = nullptr;
  StreamId stream = 0;
  std::vector<TransferRange> ranges;
  std::vector<RangeState> rs;
  std::vector<Attempt> round;                           // the attempts in flight
  std::shared_ptr<std::vector<std::uint64_t>> results;  // device hashes of `round`
  // The last copy on `stream`, and the transfer's last operation: under verify
  // the last hash on the verify stream, which waited for that copy (so its
  // completion implies every copy and hash of the transfer completed); else
  // the last copy.
  StreamPoint copied{};
  StreamPoint last{};
  std::uint64_t bytes = 0;
  bool batched_first = false;

  UploadState() = default;
  UploadState(const UploadState&) = delete;
  UploadState& operator=(const UploadState&) = delete;
  // Staging blocks go back to the arena (pending until their copies completed),
  // on every exit: finish(), an error in begin_upload(), a dropped PendingUpload.
  ~UploadState() {
    for (RangeState& r : rs) {
      if (r.own_block) (void)arena->free(r.own_block);
    }
  }
};

}  // namespace ferry::detail
