// ferry — streams and tickets: the vocabulary of stream ordering.
//
// Every operation enqueued on a stream gets the next ticket of that stream
// (1, 2, 3, ...). Streams are FIFOs, so "ticket t of stream s has completed"
// implies every earlier ticket of s has completed too. A StreamPoint names one
// such position; it is what events are in ferry.
#pragma once

#include <cstdint>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/result.hpp"

namespace ferry FERRY_API {

using StreamId = std::uint32_t;
using Ticket = std::uint64_t;  // 0 means "nothing enqueued yet"

// Streams are small integers 0..kMaxStreams-1, created on first use.
inline constexpr StreamId kMaxStreams = 64;
// Adopted streams (Backend::adopt_stream) take ids kFirstAdoptedStream up to
// kLastAdoptedStream, then below, away from the low ids a program numbers its
// streams with; never the top four, where the transfer engine hashes by default.
inline constexpr StreamId kFirstAdoptedStream = 32;
inline constexpr StreamId kLastAdoptedStream = kMaxStreams - 5;

// The one refusal of a stream id outside 0..kMaxStreams-1, before anything indexes per
// stream. Errors: invalid_argument, "WHAT: stream N is out of range (streams are 0..63)".
Result<void> check_stream(std::uint64_t stream, std::string_view what);

struct StreamPoint {
  StreamId stream = 0;
  Ticket ticket = 0;
  friend bool operator==(const StreamPoint&, const StreamPoint&) = default;
};

// A stream or an event of the device's own API: a cudaStream_t / cudaEvent_t on
// cuda. On sim, where there is no such API, they are opaque tokens the sim hands
// out (native_stream, export_event) or takes as a program's identity for a
// stream (adopt_stream); they are never dereferenced.
using NativeStream = void*;
using NativeEvent = void*;

}  // namespace ferry
