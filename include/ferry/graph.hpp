// ferry — Graph: a stream's work captured once and replayed many times (a decode
// step replayed per token), over memory that stays the graph's while it lives.
//
// Runtime::begin_capture(stream) starts recording the calls a program makes on
// `stream` through Runtime::calls() (pool_calls.hpp): fills, computes, copies to
// the host, device-to-device copies, uploads (integrity off only), user ops and
// record_use are recorded, not run; Runtime::end_capture(stream) returns them as
// a Graph, and Runtime::launch(graph, stream) enqueues them again, each time
// through the same calls, so each replay's ops take their leases (I2), are
// ordered after the point each block became its allocation's (I3) and are seen
// by the race checker as they are issued.
//
// What cannot be captured is refused when it is called, with a message naming
// the op and why, and the refusal spoils the capture: end_capture returns it.
//   - a verified upload or device copy, a probed upload (the compare needs the host)
//   - a download, synchronize(stream) on the capturing stream (a host wait)
//   - synchronize() of every stream while any stream captures
//   - hold / release of the capturing stream (a graph is replayed whole)
//   - a wait between the capturing stream and another (one stream per capture)
//   - an allocation on the capturing stream larger than the largest free extent
//     (it would need the reclaim ladder, whose last rung waits)
//
// The graph's own memory: a block allocated on a capturing stream is the
// graph's. The program's free() of it during the capture (or after) is
// deferred: the block stays the graph's, never reused by anyone, until the
// graph is destroyed; destroy() frees it stream-ordered, so it is reused only
// after the graph's last replay completed (I2, I3). Every other block a graph
// touches is the program's: free it after the graph is gone, or a later launch
// is refused with stale_handle before it enqueues anything (I1).
//
// Tickets: a recorded call returns ticket 0 (a receipt whose `done` is {stream,
// 0}): nothing was enqueued, so waiting on it returns at once.
//
// Lifetime: a Graph must be destroyed (or dropped) before the Runtime that made
// it; host buffers a recorded copy_to_host writes, and the host bytes a recorded
// upload reads, must stay valid while the graph can be launched.
//
// Thread safety: launch() and destroy() of distinct graphs may run on any thread
// at once; one Graph is not safe to use from two threads at once (as a
// std::unique_ptr). A block freed by another thread while launch() enqueues may
// stop that replay part-way (the ops enqueued so far hold their leases).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "ferry/api.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

class Runtime;
namespace detail {
struct FERRY_HIDDEN GraphState;  // src/runtime/graph.cpp
}  // namespace detail

struct GraphStats {
  std::uint64_t ops = 0;            // recorded calls, replayed in order
  std::uint64_t blocks = 0;         // distinct blocks the ops touch
  std::uint64_t owned_blocks = 0;   // of those, allocated during the capture (the graph's)
  std::uint64_t owned_bytes = 0;    // their requested bytes
  std::uint64_t launches = 0;       // replays enqueued so far
};

class Graph {
 public:
  // Empty: launches nothing.
  Graph() noexcept = default;
  Graph(Graph&& other) noexcept = default;
  // Destroys what this one held (errors ignored), then takes `other`'s graph.
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  // destroy(), its errors ignored.
  ~Graph();

  // Frees the blocks the graph owns (stream-ordered: reused only once every
  // replay that touched them has completed) and leaves this empty. Empty
  // already: does nothing, ok. Errors: stale_handle (a block the graph owns was
  // freed behind its back through the pool itself; the rest are freed all the
  // same). Never blocks on the device.
  Result<void> destroy();

  explicit operator bool() const noexcept { return state_ != nullptr; }
  // Zeros when empty. Never fails, never blocks.
  GraphStats stats() const;

 private:
  friend class Runtime;
  explicit Graph(std::shared_ptr<detail::GraphState> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<detail::GraphState> state_;
};

}  // namespace ferry
