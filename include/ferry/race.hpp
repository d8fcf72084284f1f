// ferry — stream races as values: two accesses to overlapping device bytes from
// different streams, at least one a write, with no happens-before between them
// (docs/spec.md §9). The sim finds them when asked (SimOptions::race_check,
// BackendSpec::race_check); Backend::race_log() returns what it found.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/device_handle.hpp"
#include "ferry/stream.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry FERRY_API {

// The `stream` of a race's host side: a host read or write of host memory that a
// device operation may still use (ticket 0, kind "host").
inline constexpr StreamId kHostSide = kMaxStreams;

// The pool block a side's bytes belonged to when it touched them (the pool names
// each allocation to the backend, Backend::note_block).
struct RaceBlock {
  DeviceHandle handle;  // null: no pool block (host bytes, or memory no pool handed out)
  std::string tag;      // DevicePool::set_tag's name for it, else empty
};

// One side of a race: the operation and how it touched the bytes.
struct RaceAccess {
  StreamPoint op;       // stream and ticket; stream kHostSide: the host itself
  std::string_view kind;  // the op's name ("fill", "user", ...; op_contract.hpp): static storage
  std::string tag;      // a user op's tag, else empty
  Access access = Access::read;
  RaceBlock block;      // for the first byte of the race's range
  // The device of the op's stream (its index in the Runtime; 0 with one device).
  // The race's addresses are this side's device's, except for a peer copy's read
  // of its source: the peer's (the other side's) device bytes.
  std::uint32_t device = 0;
};

struct Race {
  RaceAccess earlier;  // issued first
  RaceAccess later;
  std::uint64_t addr = 0;   // the overlapping bytes [addr, addr + bytes): device
                            // addresses, or host ones when a side is the host's or
                            // a copy's host range
  std::uint64_t bytes = 0;
  // The sides touched two different allocations of the same bytes: a block freed
  // and handed out again while the earlier side's work could still run (the
  // allocator-reuse race; I3's ordering missing).
  bool reuse = false;
};

struct RaceLog {
  std::uint64_t count = 0;   // every race found
  std::vector<Race> kept;    // the first ones, up to the checker's cap
};

}  // namespace ferry
