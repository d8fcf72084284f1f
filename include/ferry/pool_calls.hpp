// ferry — PoolCalls: the calls a program makes on pooled memory and its streams
// (allocate, free, device work, transfers, holds, waits), as one interface.
//
// A policy over these calls (the trace recorder, trace_recorder.hpp) is an
// adaptor: a PoolCalls that wraps another and forwards to it (STYLE practice 6).
// DirectPoolCalls is the end of the chain: each call on the pool, the transfer
// engine or the pool's backend itself. A Runtime's chain is calls() -> the
// adaptor in its slot, if any -> its graph capture (graph.hpp), which records
// the calls on capturing streams and makes the rest on direct calls of its own
// (Runtime::calls, direct_calls), so a caller goes through whatever adaptor
// sits there without asking whether one does, and an adaptor sees captured
// calls as the program made them.
//
// Errors and blocking: each call's are those of what it forwards to (named per
// call below); an adaptor adds none of its own. Thread safety: as what it
// forwards to; DirectPoolCalls keeps no state of its own.
#pragma once

#include <cstddef>
#include <cstdint>
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

struct GraphEvent;  // graph.hpp

class PoolCalls {
 public:
  virtual ~PoolCalls() = default;

  // The pool the calls reach, and the engine its transfers go through.
  virtual DevicePool& pool() noexcept = 0;
  virtual TransferEngine& engine() noexcept = 0;

  // DevicePool::allocate / free / trim. `tag` names the block to an adaptor (the
  // recorder's trace id); the pool does not see it.
  virtual Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag = {}) = 0;
  virtual Result<void> free(DeviceHandle handle) = 0;
  virtual Result<void> trim() = 0;

  // enqueue_fill, enqueue_compute, enqueue_copy_to_host, enqueue_user (user_op.hpp).
  virtual Result<Ticket> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) = 0;
  virtual Result<Ticket> compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output,
                                 double flops = 0, std::uint64_t mem_bytes = 0) = 0;
  virtual Result<Ticket> copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) = 0;
  virtual Result<Ticket> user(StreamId stream, std::span<const Operand> operands, UserKernel kernel,
                              UserCost cost = {}, std::string tag = {}) = 0;

  // record_use (user_op.hpp) on pool(): the default calls record_use itself.
  // An adaptor forwards it instead, or a capture behind it would not record it.
  virtual Result<Ticket> record_use(StreamId stream, std::span<const DeviceHandle> handles);

  // TransferEngine::upload / download / copy_on_device on engine().
  virtual Result<TransferReceipt> upload(StreamId stream, const TransferPlan& plan) = 0;
  virtual Result<TransferReceipt> download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                           std::span<std::byte> dst) = 0;
  virtual Result<TransferReceipt> copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                                 DeviceHandle src, std::uint64_t src_offset, std::uint64_t bytes) = 0;

  // hold: Backend::set_hold(stream, true). release: set_hold(false), then flush.
  // Errors: invalid_argument (stream out of range), backend_error. Never block.
  virtual Result<void> hold(StreamId stream) = 0;
  virtual Result<void> release(StreamId stream) = 0;
  // `stream` waits for everything enqueued on `for_stream` so far
  // (StreamOrder::order_after). Never blocks. Errors: invalid_argument (a stream
  // out of range), backend_error.
  virtual Result<void> wait(StreamId stream, StreamId for_stream) = 0;
  // Waits for everything enqueued on `stream` so far (dispatching what it holds),
  // or on every stream. Blocks (bounded). Errors: invalid_argument, timeout,
  // backend_error.
  virtual Result<void> synchronize(StreamId stream) = 0;
  virtual Result<void> synchronize() = 0;

  // Graph capture (graph.hpp): the Runtime tells the calls in its slot what
  // each begin_capture, end_capture, launch and Graph::destroy did, after it
  // ran. The capture itself is the end of the chain (Runtime::direct_calls): a
  // call on a capturing stream passes through every adaptor before it is
  // recorded, and a launch's ops run behind them all. An adaptor that wraps
  // another forwards this too. The default does nothing. Never fails; must not
  // block or call the Runtime back.
  virtual void note_graph(const GraphEvent& event);
};

// The calls made straight on `pool`, `engine` (which must use `pool`) and the
// pool's backend. Both must outlive it.
class DirectPoolCalls : public PoolCalls {
 public:
  DirectPoolCalls(DevicePool& pool, TransferEngine& engine) noexcept : pool_(pool), engine_(engine) {}

  DevicePool& pool() noexcept override { return pool_; }
  TransferEngine& engine() noexcept override { return engine_; }
  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag = {}) override;
  Result<void> free(DeviceHandle handle) override;
  Result<void> trim() override;
  Result<Ticket> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) override;
  Result<Ticket> compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output,
                         double flops = 0, std::uint64_t mem_bytes = 0) override;
  Result<Ticket> copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) override;
  Result<Ticket> user(StreamId stream, std::span<const Operand> operands, UserKernel kernel, UserCost cost = {},
                      std::string tag = {}) override;
  Result<TransferReceipt> upload(StreamId stream, const TransferPlan& plan) override;
  Result<TransferReceipt> download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                   std::span<std::byte> dst) override;
  Result<TransferReceipt> copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                         DeviceHandle src, std::uint64_t src_offset, std::uint64_t bytes) override;
  Result<void> hold(StreamId stream) override;
  Result<void> release(StreamId stream) override;
  Result<void> wait(StreamId stream, StreamId for_stream) override;
  Result<void> synchronize(StreamId stream) override;
  // Backend::synchronize.
  Result<void> synchronize() override;

 private:
  DevicePool& pool_;
  TransferEngine& engine_;
};

}  // namespace ferry
