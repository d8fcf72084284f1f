// ferry — recording a real program's pool traffic as a replay trace (docs/spec.md
// §3; `ferry replay FILE` runs what it writes).
//
// RecordingPool is an adaptor (STYLE practice 6: tracing is a policy that wraps
// a resource, not a flag inside it): a PoolCalls (pool_calls.hpp) over another.
// A program puts it in its Runtime's pool adaptor slot (Runtime::set_pool_adaptor,
// as the C ABI's ferry_trace_start does) or calls it in place of the calls it
// wraps; each call forwards upstream, then writes one JSON line saying what
// happened. Why an adaptor rather than a recorder the program
// calls beside the pool: the adaptor sees every call's outcome and the handle it
// returned, so it names handles itself (stable ids, no bookkeeping in the
// program) and cannot drift from what the pool did; a recorder called beside the
// pool needs each call site to repeat the handle, the size and the outcome, and
// one forgotten call silently breaks the trace.
//
// The first line is {"op":"meta","capacity":C}: the wrapped pool's capacity.
// Then one alloc line per block live when recording starts, with
// "existing": true (the replay allocates it there; its bytes are unknown), so
// later calls on blocks allocated before the recorder are recorded too.
// What is written, per call (one line each):
//   allocate        alloc {id, bytes, stream}
//   free            free {id}
//   fill            fill {id, stream, seed}
//   compute         compute {inputs, output, stream}; with no inputs: fill of the
//                   output with a fresh seed (the format needs inputs)
//   copy_on_device  copy {src, dst, stream, bytes}, with src_offset and
//                   dst_offset when not 0
//   user            user {stream, operands: [{id, access, offset, bytes}], tag}
//                   (the replay stands a kernel of its own in for the program's,
//                   with the same marks and ranges)
//   upload          upload {id, stream, seed} per distinct destination of the
//                   plan, in plan order; seeds are fresh (the trace stands for
//                   the program's bytes with patterns; the replay's reference
//                   model follows them, so checks stay meaningful)
//   copy_to_host,
//   download        check {id} (the format's read-back; the replay waits for it);
//                   a copy_to_host in a capture is check {id, stream} (below)
//   hold / release  hold / release {stream}
//   wait            wait {stream, for}
//   synchronize     sync {stream} or sync {}
//   trim            trim {}
// Ids are "b<N>" or, with a tag, "<tag>#<N>"; N counts allocations from 1, so
// an id is never reused and names one allocation for the whole trace.
// A call that fails is still recorded, with "expect": the error's code name
// ("out_of_memory", "stale_handle", ...), so the replay counts it as expected.
// A call the format cannot express is forwarded but not recorded, and counted
// in RecordingStats::unrecorded: a handle this recorder never returned (or one
// freed so long ago that it was forgotten: the last kRememberedFrees frees are
// remembered, so a double free is recorded as a free that expects
// stale_handle), or a stream outside 0..kMaxStreams-1.
// Work enqueued on pool() or upstream directly is not recorded.
// Graph capture (graph.hpp): the capture sits behind the slot, so the calls a
// program makes on a capturing stream reach the recorder as it makes them and
// are written as their lines; the Runtime tells it of each begin_capture,
// end_capture, launch and Graph::destroy (note_graph), written as
//   begin_capture   capture {phase "begin", graph, stream}; with `pool` (the
//                   latest live graph of that private pool) when
//                   CaptureOptions::pool named one that a live graph uses
//   end_capture     capture {phase "end", graph, stream} (a spoiled capture's
//                   end expects its error)
//   launch          replay {graph, stream}; a launch's ops are not written again
//   Graph::destroy  capture {phase "destroy", graph}
// Graphs are named "g<N>", N counting begin_capture calls from 1. In a capture:
// a copy_to_host is recorded there, not run, and is written as check {id,
// stream} (the replay's graph copies at each launch, and the latest copy is
// compared at the next sync covering the stream); a download, or an upload or
// device copy that the capture refused (integrity on; a replay at another
// --integrity would not refuse its line), is written as the `sync` of its
// stream, which the replay's capture refuses the same way. A capture begun
// before recording cannot be written: the calls it recorded before were not
// seen, and its later ones would be written as if run. So install the recorder
// outside captures (Runtime::capturing; ferry_trace_start refuses while a stream
// captures); a graph captured before recording began is not written either (its
// launches and destroy count as unrecorded).
//
// Several devices: the recorder sees the calls of the slot it sits in, device
// 0's; it writes no `device` field, no wait across devices and no copy_peer
// (the format has them), so ferry_trace_start refuses a Runtime with several
// devices.
//
// Replaying: `ferry replay FILE` with the same device profile runs at the
// recorded capacity (the meta line's), so that pressure (and any out_of_memory
// the trace expects) happens as it did; --capacity overrides it.
//
// Thread safety: every method may be called from any thread. The recorder's
// mutex guards its id table and the output only and is never held while the
// pool, the engine or the backend runs, so recording adds no blocking; calls
// that block (allocate under pressure, verify uploads, downloads, synchronize)
// block exactly as the wrapped call does. A call's line is written when the call
// returns, before the caller sees the result: everything a program orders (one
// thread's calls, or calls ordered by the program's own synchronization) is
// recorded in that order; calls that overlap in time on different threads may
// be recorded in either order, which the replay accepts (each line names only
// ids allocated on earlier lines).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/forwarding_pool_calls.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/user_op.hpp"

namespace ferry FERRY_API {

struct RecordingStats {
  std::uint64_t lines = 0;       // lines written
  std::uint64_t unrecorded = 0;  // calls forwarded but not expressible in the format
  std::uint64_t failed_calls = 0;  // calls recorded with "expect" (the call failed)
};

class RecordingPool final : public ForwardingPoolCalls {
 public:
  // Frees remembered per recorder, for recording double frees.
  static constexpr std::size_t kRememberedFrees = 4096;

  // Records the calls it forwards to `upstream` (a Runtime's calls(), or a
  // DirectPoolCalls over a pool and its engine) to `out`. Both must outlive it.
  RecordingPool(PoolCalls& upstream, std::ostream& out);
  // Records to a file it creates (truncating), opened without blocking, and
  // writes and flushes its first lines before it returns. Errors:
  // invalid_argument (the file cannot be opened for writing, is not a regular
  // file — a FIFO, a device — or its first lines cannot be written; the message
  // names it). Never blocks on a FIFO.
  static Result<std::unique_ptr<RecordingPool>> to_file(PoolCalls& upstream, const std::string& path);

  ~RecordingPool() override;  // flushes
  RecordingPool(const RecordingPool&) = delete;
  RecordingPool& operator=(const RecordingPool&) = delete;

  // --- the calls (pool_calls.hpp; errors and blocking as upstream's) -----------
  // `tag` (optional) names the allocation in the trace: "<tag>#<N>".
  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag = {}) override;
  Result<void> free(DeviceHandle handle) override;
  Result<void> trim() override;
  Result<Ticket> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) override;
  Result<Ticket> compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output,
                         double flops = 0, std::uint64_t mem_bytes = 0) override;
  Result<Ticket> copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) override;
  // The program's own kernel. An operand this recorder did not hand out leaves
  // the call unrecorded.
  Result<Ticket> user(StreamId stream, std::span<const Operand> operands, UserKernel kernel, UserCost cost = {},
                      std::string tag = {}) override;
  Result<TransferReceipt> upload(StreamId stream, const TransferPlan& plan) override;
  Result<TransferReceipt> download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                   std::span<std::byte> dst) override;
  Result<TransferReceipt> copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                         DeviceHandle src, std::uint64_t src_offset, std::uint64_t bytes) override;
  // A stream out of range is refused here (invalid_argument) and not recorded.
  // `wait` is recorded as the trace's `wait`, so a recording replays under
  // --strict with the program's own ordering.
  Result<void> hold(StreamId stream) override;
  Result<void> release(StreamId stream) override;
  Result<void> wait(StreamId stream, StreamId for_stream) override;
  Result<void> synchronize(StreamId stream) override;
  Result<void> synchronize() override;
  // Forwarded, not recorded (the format has no lease of its own).
  Result<Ticket> record_use(StreamId stream, std::span<const DeviceHandle> handles) override;
  // Writes the graph's `capture` or `replay` line (see above), then nothing else.
  void note_graph(const GraphEvent& event) override;

  // --- inspection (pool() and engine() are upstream's) -------------------------------
  // The id the trace uses for `handle`, if this recorder returned it (and, once
  // freed, still remembers it).
  std::optional<std::string> id_of(DeviceHandle handle) const;
  RecordingStats stats() const;
  // The first write error (the output went bad), if any; once bad, nothing more
  // is written but every call still runs. Recording never fails a call.
  Result<void> status() const;
  // Flushes the output. Errors: as status().
  Result<void> flush();

 private:
  struct Impl;
  explicit RecordingPool(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
