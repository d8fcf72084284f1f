// ferry — recording a real program's pool traffic as a replay trace (docs/spec.md
// §3; `ferry replay FILE` runs what it writes).
//
// RecordingPool is an adaptor (STYLE practice 6: tracing is a policy that wraps
// a resource, not a flag inside it). The program keeps its DevicePool and calls
// the RecordingPool instead; each call forwards to the pool (or to the transfer
// engine or the backend for stream and copy operations), then writes one JSON
// line saying what happened. Why an adaptor rather than a recorder the program
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
//   copy_on_device  user {stream, operands: [{src, read}, {dst, write}] with the
//                   copy's offsets and bytes, tag "copy"}
//   user            user {stream, operands: [{id, access, offset, bytes}], tag}
//                   (the replay stands a kernel of its own in for the program's,
//                   with the same marks and ranges)
//   upload          upload {id, stream, seed} per distinct destination of the
//                   plan, in plan order; seeds are fresh (the trace stands for
//                   the program's bytes with patterns; the replay's reference
//                   model follows them, so checks stay meaningful)
//   copy_to_host,
//   download        check {id} (the format's read-back; the replay waits for it)
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
// Work enqueued on pool() directly is not recorded.
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

class RecordingPool {
 public:
  // Frees remembered per recorder, for recording double frees.
  static constexpr std::size_t kRememberedFrees = 4096;

  // Records to `out`, which must outlive the recorder. `pool` must outlive it too.
  RecordingPool(DevicePool& pool, std::ostream& out);
  // Records to a file it creates (truncating), opened without blocking, and
  // writes and flushes its first lines before it returns. Errors:
  // invalid_argument (the file cannot be opened for writing, is not a regular
  // file — a FIFO, a device — or its first lines cannot be written; the message
  // names it). Never blocks on a FIFO.
  static Result<std::unique_ptr<RecordingPool>> to_file(DevicePool& pool, const std::string& path);

  ~RecordingPool();  // flushes
  RecordingPool(const RecordingPool&) = delete;
  RecordingPool& operator=(const RecordingPool&) = delete;

  // --- the pool's calls (errors as DevicePool's) -----------------------------
  // `tag` (optional) names the allocation in the trace: "<tag>#<N>".
  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag = {});
  Result<void> free(DeviceHandle handle);
  Result<void> trim();

  // --- device work on pooled memory (errors as enqueue_fill & co.) -----------
  Result<Ticket> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed);
  Result<Ticket> compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output,
                         double flops = 0, std::uint64_t mem_bytes = 0);
  Result<Ticket> copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst);
  // The program's own kernel (enqueue_user, user_op.hpp; errors as it). An operand
  // this recorder did not hand out leaves the call unrecorded.
  Result<Ticket> user(StreamId stream, std::span<const Operand> operands, UserKernel kernel, UserCost cost = {},
                      std::string tag = {});

  // --- transfers through `engine`, which must use pool() (errors as the engine's)
  Result<TransferReceipt> upload(TransferEngine& engine, StreamId stream, const TransferPlan& plan);
  Result<TransferReceipt> download(TransferEngine& engine, StreamId stream, DeviceHandle src,
                                   std::uint64_t src_offset, std::span<std::byte> dst);
  Result<TransferReceipt> copy_on_device(TransferEngine& engine, StreamId stream, DeviceHandle dst,
                                         std::uint64_t dst_offset, DeviceHandle src,
                                         std::uint64_t src_offset, std::uint64_t bytes);

  // --- streams, on the pool's backend ------------------------------------------
  // hold: Backend::set_hold(stream, true). release: set_hold(false) and flush.
  // Errors: invalid_argument (stream out of range), backend_error. Never block.
  Result<void> hold(StreamId stream);
  Result<void> release(StreamId stream);
  // `stream` waits for everything enqueued on `for_stream` so far (an event wait,
  // StreamOrder::order_after), recorded as the trace's `wait`, so a recording
  // replays under --strict with the program's own ordering. Never blocks.
  // Errors: invalid_argument (a stream out of range), backend_error.
  Result<void> wait(StreamId stream, StreamId for_stream);
  // Waits for everything enqueued on `stream` so far (dispatching what it
  // holds), or for every stream. Blocks (bounded). Errors: invalid_argument,
  // timeout, backend_error.
  Result<void> synchronize(StreamId stream);
  Result<void> synchronize();

  // --- inspection -----------------------------------------------------------------
  DevicePool& pool() noexcept;
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
