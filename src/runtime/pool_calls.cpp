#include "ferry/pool_calls.hpp"

#include <utility>

namespace ferry {

Result<DeviceHandle> DirectPoolCalls::allocate(std::uint64_t bytes, StreamId stream, std::string_view) {
  return pool_.allocate(bytes, stream);
}

Result<void> DirectPoolCalls::free(DeviceHandle handle) { return pool_.free(handle); }

Result<void> DirectPoolCalls::trim() { return pool_.trim(); }

Result<Ticket> DirectPoolCalls::fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) {
  return enqueue_fill(pool_, stream, dst, seed);
}

Result<Ticket> DirectPoolCalls::compute(StreamId stream, std::span<const DeviceHandle> inputs, DeviceHandle output,
                                        double flops, std::uint64_t mem_bytes) {
  return enqueue_compute(pool_, stream, inputs, output, flops, mem_bytes);
}

Result<Ticket> DirectPoolCalls::copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) {
  return enqueue_copy_to_host(pool_, stream, src, dst);
}

Result<Ticket> DirectPoolCalls::user(StreamId stream, std::span<const Operand> operands, UserKernel kernel,
                                     UserCost cost, std::string tag) {
  return enqueue_user(pool_, stream, operands, std::move(kernel), cost, std::move(tag));
}

Result<Ticket> PoolCalls::record_use(StreamId stream, std::span<const DeviceHandle> handles) {
  return ::ferry::record_use(pool(), stream, handles);
}

void PoolCalls::note_graph(const GraphEvent&) {}

Result<TransferReceipt> DirectPoolCalls::upload(StreamId stream, const TransferPlan& plan) {
  return engine_.upload(stream, plan);
}

Result<TransferReceipt> DirectPoolCalls::download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                                  std::span<std::byte> dst) {
  return engine_.download(stream, src, src_offset, dst);
}

Result<TransferReceipt> DirectPoolCalls::copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                                        DeviceHandle src, std::uint64_t src_offset,
                                                        std::uint64_t bytes) {
  return engine_.copy_on_device(stream, dst, dst_offset, src, src_offset, bytes);
}

Result<void> DirectPoolCalls::hold(StreamId stream) {
  FERRY_TRY(check_stream(stream, "hold"));
  pool_.order().backend().set_hold(stream, true);
  return {};
}

Result<void> DirectPoolCalls::release(StreamId stream) {
  FERRY_TRY(check_stream(stream, "release"));
  Backend& backend = pool_.order().backend();
  backend.set_hold(stream, false);
  return backend.flush(stream);
}

Result<void> DirectPoolCalls::wait(StreamId stream, StreamId for_stream) {
  for (StreamId s : {stream, for_stream}) FERRY_TRY(check_stream(s, "wait"));
  StreamOrder& order = pool_.order();
  Result<Ticket> t = order.order_after(stream, {for_stream, order.backend().submitted(for_stream)});
  if (!t.ok()) return std::move(t).error();
  return {};
}

Result<void> DirectPoolCalls::synchronize(StreamId stream) {
  FERRY_TRY(check_stream(stream, "synchronize"));
  StreamOrder& order = pool_.order();
  return order.wait(StreamPoint{stream, order.backend().submitted(stream)});
}

Result<void> DirectPoolCalls::synchronize() { return pool_.order().backend().synchronize(); }

}  // namespace ferry
