// ferry — the base of PoolCalls adaptors (STYLE: one adaptor base, override what
// you watch).
//
// Forwards every PoolCalls call to the next calls in the chain. An adaptor — the
// trace recorder, the graph capture, a Runtime's slot front, a test double —
// derives from it and overrides only the calls it observes or changes.
// Thread safety and blocking: those of the next calls, plus whatever the
// override adds. Lifetime: the next calls must outlive the adaptor, or, for an
// adaptor that overrides next(), stay alive while next()'s pointer is held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/api.hpp"
#include "ferry/pool_calls.hpp"

namespace ferry FERRY_API {

class ForwardingPoolCalls : public PoolCalls {
 public:
  explicit ForwardingPoolCalls(PoolCalls& next) noexcept : next_(&next) {}

  DevicePool& pool() noexcept override { return next()->pool(); }
  TransferEngine& engine() noexcept override { return next()->engine(); }
  Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, std::string_view tag = {}) override {
    return next()->allocate(bytes, stream, tag);
  }
  Result<void> free(DeviceHandle handle) override { return next()->free(handle); }
  Result<void> trim() override { return next()->trim(); }
  Result<Ticket> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) override {
    return next()->fill(stream, dst, seed);
  }
  Result<Ticket> compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output,
                         double flops = 0, std::uint64_t mem_bytes = 0) override {
    return next()->compute(stream, inputs, output, flops, mem_bytes);
  }
  Result<Ticket> copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) override {
    return next()->copy_to_host(stream, src, dst);
  }
  Result<Ticket> user(StreamId stream, std::span<const Operand> operands, UserKernel kernel, UserCost cost = {},
                      std::string tag = {}) override {
    return next()->user(stream, operands, std::move(kernel), cost, std::move(tag));
  }
  Result<Ticket> record_use(StreamId stream, std::span<const DeviceHandle> handles) override {
    return next()->record_use(stream, handles);
  }
  Result<TransferReceipt> upload(StreamId stream, const TransferPlan& plan) override {
    return next()->upload(stream, plan);
  }
  Result<TransferReceipt> download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                   std::span<std::byte> dst) override {
    return next()->download(stream, src, src_offset, dst);
  }
  Result<TransferReceipt> copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                         DeviceHandle src, std::uint64_t src_offset, std::uint64_t bytes) override {
    return next()->copy_on_device(stream, dst, dst_offset, src, src_offset, bytes);
  }
  Result<void> hold(StreamId stream) override { return next()->hold(stream); }
  Result<void> release(StreamId stream) override { return next()->release(stream); }
  Result<void> wait(StreamId stream, StreamId for_stream) override { return next()->wait(stream, for_stream); }
  Result<void> synchronize(StreamId stream) override { return next()->synchronize(stream); }
  Result<void> synchronize() override { return next()->synchronize(); }
  void note_graph(const GraphEvent& event) override { next()->note_graph(event); }

 protected:
  // For an adaptor that picks its next calls at each call (it overrides next()).
  ForwardingPoolCalls() noexcept = default;
  // The calls a call goes on to; the pointer keeps them alive until that call
  // returns. The default, over the constructor's `next`, owns nothing.
  virtual std::shared_ptr<PoolCalls> next() const { return {std::shared_ptr<PoolCalls>{}, next_}; }

 private:
  PoolCalls* next_ = nullptr;
};

}  // namespace ferry
