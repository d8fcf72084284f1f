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
// by the race checker as they are issued. The capture is the end of the
// Runtime's chain of calls (pool_calls.hpp): an adaptor in the pool adaptor
// slot (the trace recorder) sees a capture's calls as the program makes them,
// and is told of begin_capture, end_capture, launch and destroy (GraphEvent),
// but not of a launch's ops, which run behind it.
//
// A replay as one op (GraphStats::native). On a device with native graphs
// (DeviceInfo::native_graphs: cuda, or the sim when its spec asks), end_capture
// enqueues the recorded ops once more on the capture stream while the backend
// keeps their device work for a graph of its own (Backend::begin_graph; a no-op
// runs in each one's place, so nothing recorded runs) and builds it (cuda:
// stream capture on a private stream, cudaGraphInstantiate). A launch is then
// one user op over every block the graph touches, read and written, whose
// kernel replays the graph (cuda: one cudaGraphLaunch): the same refusal of a
// freed block first, the same leases until the replay completed (I2), ordered
// after each block's earlier users (I3). Only fills, computes, user ops and
// record_use go in a native graph; a graph with a transfer engine call (an
// upload, a device copy, a copy to the host: the engine counts and checks each
// one), or whose ops the device cannot capture (a program's kernel that
// synchronizes, allocates or fails), replays op by op as on every device, and
// GraphStats::per_op_reason says why. A program's kernel in a native graph is
// called once, when the graph is built (cuda; on the sim at each launch, on the
// operands' views): what it enqueues on the stream it is given is what every
// replay runs. Work the program enqueues straight on the native stream
// (Backend::native_stream) during a capture is not captured: the capture is
// above the backend, so ferry's own ops reach the stream only at end_capture,
// and a CUDA capture of the stream begun at begin_capture would hold the
// program's kernels without ferry's between them; make such work a user op.
// end_capture and the capture stream's other calls must not run at once on
// two threads (the backend keeps whatever is enqueued on it meanwhile).
//
// What cannot be captured is refused when it is called, with a message naming
// the op and why, and the refusal spoils the capture: end_capture returns it.
//   - a verified upload or device copy, a probed upload (the compare needs the host)
//   - a download, synchronize(stream) on the capturing stream (a host wait)
//   - synchronize() of every stream while any stream captures
//   - hold / release of the capturing stream (a graph is replayed whole)
//   - a wait between the capturing stream and another (one stream per capture),
//     and Runtime::copy_peer between devices (its source leg waits on the host;
//     within device 0 it is a device-to-device copy, recorded)
//   - an allocation on the capturing stream larger than the largest free extent
//     (it would need the reclaim ladder, whose last rung waits)
//
// The graph's own memory, a private pool (PyTorch's graph pools are the model).
// A block allocated on a capturing stream is the pool's. The program's free()
// of it, during the capture or after, is deferred: the block stays the pool's,
// reused by no one outside it, and a later allocation on a capturing stream of
// the same pool that fits gets it back under a new handle: the same size gets
// the whole block (DevicePool::reissue), a smaller one a part of the best
// fitting free range of the blocks the program freed (DevicePool::sub_block: a
// handle of its own over part of the block, leased as the block), so several
// smaller allocations pack into one freed block and a larger one takes a block
// of its own. A freed handle, a block's or a part's, is stale at once (I1); the
// graph's ops follow each block and part through its handles, and a replay runs
// them in the order recorded, so an op over a part comes after the ops recorded
// before it over the whole block. When the last graph of the pool is
// destroyed, the pool frees the blocks the program freed, stream-ordered, so
// they are reused only after that graph's last replay completed (I2, I3); a
// block the program still holds is its own again, and one of whose parts the
// program still holds stays the pool's until it frees the last of them. Graphs captured one after another may share a pool
// (CaptureOptions::pool, PyTorch's `pool=`): decode graphs for several batch
// sizes then share memory, and must not be replayed at once (a block one of
// them freed in its capture may be another's). Every other block a graph
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
#include <string>
#include <utility>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

class Runtime;
namespace detail {
struct FERRY_HIDDEN GraphState;      // src/runtime/graph_capture.hpp
struct FERRY_HIDDEN GraphPoolState;  // src/runtime/graph_capture.hpp
}  // namespace detail

// A private pool's memory: every block it holds, and those the program holds of them.
struct GraphPoolStats {
  std::uint64_t blocks = 0;
  std::uint64_t reserved_bytes = 0;   // requested bytes of every block the pool holds
  // of those, what the program holds (not freed): whole blocks' and parts' requested bytes
  std::uint64_t allocated_bytes = 0;
  std::uint64_t graphs = 0;           // graphs (and captures) using it
};

// Names a private pool, to share it between captures (CaptureOptions::pool).
// Copyable; empty: a capture makes a pool of its own. Thread safety: as the Runtime's.
class GraphPool {
 public:
  GraphPool() noexcept = default;
  explicit operator bool() const noexcept { return state_ != nullptr; }
  // Zeros when empty. Never fails, never blocks.
  GraphPoolStats stats() const;
  // Every pool of `rt` that a graph or a capture uses, oldest first. Never fails,
  // never blocks.
  static std::vector<GraphPoolStats> all(const Runtime& rt);

 private:
  friend class Runtime;
  friend class Graph;
  explicit GraphPool(std::shared_ptr<detail::GraphPoolState> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<detail::GraphPoolState> state_;
};

struct CaptureOptions {
  // The private pool the capture allocates from: another graph's (Graph::pool())
  // to share its memory, or empty for a pool of its own.
  GraphPool pool;
};

// memory_summary's section for private pools: one line per pool of all(rt) with
// its blocks, reserved and allocated bytes and graphs; empty when there is none.
// Never fails, never blocks.
std::string graph_pools_summary(const Runtime& rt);

// What a Runtime tells the calls in its pool adaptor slot about its graphs
// (PoolCalls::note_graph), after each begin_capture, end_capture, launch and
// Graph::destroy has run, on the caller's thread: an adaptor in the slot sees
// a capture's calls (the capture sits behind it, pool_calls.hpp) but not these
// Runtime calls, and a recorder needs both, in program order.
struct GraphEvent {
  enum class Kind : std::uint8_t { begin_capture, end_capture, launch, destroy };
  Kind kind = Kind::begin_capture;
  StreamId stream = 0;  // begin_capture, end_capture, launch
  // end_capture (the graph made; 0 when none), launch, destroy: a number naming
  // the graph, unique in its Runtime; 0 for an empty Graph.
  std::uint64_t graph = 0;
  // begin_capture: the private pool CaptureOptions::pool named (0: none, a pool
  // of its own); end_capture: the graph's pool. Unique in the Runtime, never 0
  // for a pool.
  std::uint64_t pool = 0;
  const Error* error = nullptr;  // the call failed with this (null: it succeeded)
};

struct GraphStats {
  std::uint64_t ops = 0;            // recorded calls, replayed in order
  std::uint64_t blocks = 0;         // distinct blocks the ops touch
  std::uint64_t launches = 0;       // replays enqueued so far
  // A launch is one op: the device's native graph of the ops (DeviceInfo::
  // native_graphs; cuda: one cudaGraphLaunch). Else each op is enqueued again,
  // and per_op_reason says why (the device has none; a transfer engine call; an
  // op the device cannot put in a graph, named).
  bool native = false;
  std::string per_op_reason;
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

  // Leaves this empty; when it was its pool's last graph, the pool frees the
  // blocks the program freed (stream-ordered: reused only once every replay that
  // touched them has completed). Empty already: does nothing, ok. Errors:
  // stale_handle (a block of the pool was freed behind its back through the
  // pool itself; the rest are freed all the same). Never blocks on the device.
  Result<void> destroy();

  explicit operator bool() const noexcept { return state_ != nullptr; }
  // Zeros when empty. Never fails, never blocks.
  GraphStats stats() const;
  // Its private pool (empty when this is), for CaptureOptions::pool.
  GraphPool pool() const;

 private:
  friend class Runtime;
  explicit Graph(std::shared_ptr<detail::GraphState> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<detail::GraphState> state_;
};

}  // namespace ferry
