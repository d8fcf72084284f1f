// The parsed form of a replay trace (docs/spec.md §3) and its validator.
//
// Ids are interned: a TraceOp names buffers by index into Trace::ids, so the
// runner never hashes strings. Validation is complete before a Trace exists:
// every op in it has every field it needs, in range, and names only ids that an
// earlier line allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/devices.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/user_op.hpp"

namespace ferry::replay {

// meta is the optional first line (its fields go to Trace, never into ops).
enum class OpKind : std::uint8_t {
  alloc, free, fill, upload, compute, hold, release, sync, trim, check, wait, user, copy, capture, replay, copy_peer, meta
};

// A `capture` op's step in its graph's life (graph.hpp): begin recording a
// stream, end it (the graph is made), destroy the graph.
enum class CapturePhase : std::uint8_t { begin, end, destroy };

std::string_view to_string(OpKind kind) noexcept;

using IdIndex = std::uint32_t;

// One operand of a `user` op: bytes [offset, offset + bytes) of an id's block
// (bytes kRestOfBlock: to its end), and how the program's kernel touched them.
struct TraceOperand {
  IdIndex id = 0;
  Access access = Access::read;
  std::uint64_t offset = 0;
  std::uint64_t bytes = kRestOfBlock;
};

struct TraceOp {
  OpKind kind = OpKind::trim;
  std::size_t line = 0;             // 1-based line in the file
  IdIndex id = 0;                   // alloc, free, fill, upload, check; compute's output; copy's and copy_peer's dst
  std::vector<IdIndex> inputs;      // compute; copy, copy_peer: its src alone
  std::vector<TraceOperand> operands;  // user
  std::string tag;                  // user: the program's name for its kernel (may be empty)
  std::uint64_t bytes = 0;          // alloc, copy, copy_peer
  std::uint64_t src_offset = 0, dst_offset = 0;  // copy, copy_peer
  std::uint64_t seed = 0;           // fill, upload
  StreamId stream = 0;              // alloc, fill, upload, compute, hold, release, sync, wait, user, copy,
                                    // capture begin and end, replay
  StreamId waits_for = 0;           // wait: the stream whose work so far `stream` waits for
  // The device the op runs on (`device`; 0 when absent). copy_peer: its dst's device.
  std::uint32_t device = 0;
  // wait: the device of `waits_for` (`for_device`; `device` when absent). copy_peer: its src's device.
  std::uint32_t for_device = 0;
  IdIndex graph = 0;                // capture, replay: index into Trace::graphs
  CapturePhase phase = CapturePhase::begin;  // capture
  std::optional<IdIndex> pool;      // capture begin: the graph whose private pool it shares
  bool all_streams = false;         // sync without a stream
  bool all_devices = false;         // sync without a stream or a device: every device's streams
  bool on_stream = false;           // check: `stream` was given (a check inside a capture on it)
  std::optional<ErrorCode> expect;  // the error the trace says this op returns
};

struct Trace {
  std::string name;
  std::vector<std::string> ids;  // IdIndex -> the id as written
  std::vector<std::string> graphs;  // capture and replay ops' graph names, as written
  std::vector<TraceOp> ops;
  std::optional<std::uint64_t> capacity;  // a first-line meta op's: the capacity the trace was made for
  std::uint32_t devices = 1;              // a first-line meta op's `devices`: how many the trace runs on
  std::vector<PeerLinkSpec> links;        // a first-line meta op's `links` between them (devices.hpp)
};

// At most this many problems are listed in a malformed-trace error.
inline constexpr std::size_t kMaxListedProblems = 10;

// Parses and validates JSON Lines text. Blank (whitespace-only) lines are
// ignored; a trailing '\r' is ignored. Errors: invalid_argument whose message
// has one "NAME:LINE: what is wrong" line per problem (the first
// kMaxListedProblems, then a count of the rest), or, for well-formed text with
// no ops (a meta line is none), "NAME: the trace is empty: ...".
Result<Trace> parse_trace(std::string_view text, std::string_view name);

// An id as messages show it: in quotes, cut short when long.
std::string quoted_id(std::string_view id);

// The error code a trace's `expect` names: "oom" or a code's own name.
std::optional<ErrorCode> parse_expect(std::string_view name) noexcept;

}  // namespace ferry::replay
