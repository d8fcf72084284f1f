#include "ferry/device_pool.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "core/invariant.hpp"
#include "ferry/user_kernel.hpp"
#include "pool/device_pool_impl.hpp"
#include "pool/pool_test_access.hpp"

namespace ferry {
namespace {

std::atomic<std::uint32_t> next_pool_id{1};

// Which device each live pool serves, so that a handle of another device's pool is
// refused with both devices named. Touched only at a pool's birth and death and in
// a refusal, never on a resolve.
struct PoolDevices {
  std::mutex mu;
  std::unordered_map<std::uint32_t, std::uint32_t> device_of;
};
PoolDevices& pool_devices() {
  static PoolDevices* registry = new PoolDevices;  // never destroyed: pools may outlive static teardown
  return *registry;
}

}  // namespace

DevicePool::Impl::Impl(StreamOrder& o, PoolOptions opt)
    : order(o), backend(o.backend()), options(opt), id(next_pool_id.fetch_add(1)),
      note_blocks(backend.race_log() != nullptr) {
  {
    PoolDevices& reg = pool_devices();
    std::lock_guard lock(reg.mu);
    reg.device_of[id] = options.device;
  }
  const DeviceInfo& info = backend.info();
  granule = std::bit_ceil(std::max<std::uint64_t>(info.granularity, kAlign));
  granule_shift = static_cast<unsigned>(std::countr_zero(granule));
  const std::uint64_t available =
      info.available == 0 ? info.capacity : std::min(info.available, info.capacity);
  // Without VMM the whole capacity is one allocation made now: asking for more than
  // is free can never succeed. With VMM granules map on demand, so an explicit
  // capacity may exceed what is free today (a map then fails as out_of_memory).
  const std::uint64_t ceiling = info.virtual_memory ? info.capacity : available;
  const std::uint64_t device_cap = ceiling / granule * granule;
  capacity = options.capacity == 0 ? available / granule * granule : std::min(options.capacity, device_cap);
  capacity = capacity / granule * granule;
  if (capacity == 0) {
    status = options.capacity == 0
                 ? make_error(ErrorCode::out_of_memory,
                              "the device has " + bytes_str(available) +
                                  " available, less than one granule (" + bytes_str(granule) + ")")
                 : make_error(ErrorCode::invalid_argument,
                              "pool capacity " + std::to_string(options.capacity) +
                                  " B is smaller than one device granule (" + bytes_str(granule) + ")");
    return;
  }
  // With virtual memory, address space is cheap: the large range has room for
  // fragmentation, because only mapped granules cost memory. Its size follows the
  // device, not the capacity, so that where a block lands never depends on the
  // capacity: only whether it fits does (a trace that replays at C replays at
  // every capacity above C).
  std::vector<std::uint64_t> sizes;
  if (info.virtual_memory) sizes = {device_cap, device_cap * 4};
  else sizes = {capacity};
  for (std::uint64_t bytes : sizes) {
    Result<std::uint64_t> base = backend.reserve_address(bytes);
    if (!base.ok()) {
      status = make_error(base.error().code,
                          "pool could not reserve " + bytes_str(bytes) + " of address space: " +
                              base.error().message);
      return;
    }
    regions.emplace_back(*base, bytes, granule_shift);
  }
}

DevicePool::Impl::~Impl() {
  {
    PoolDevices& reg = pool_devices();
    std::lock_guard lock(reg.mu);
    reg.device_of.erase(id);
  }
  // I2 holds at teardown too: nothing is unmapped while enqueued work may
  // still touch it (bounded waits; a failed wait cannot be reported here).
  UseSet in_flight;
  for (std::uint32_t b = 0; b < blocks.size(); ++b)
    if (has_block(blocks[b]) && blocks[b].leased) in_flight.merge(leases[b].uses);
  (void)order.wait(in_flight);
  for (Region& r : regions) {
    for (std::uint64_t g = 0; g < r.map.granules(); ++g) {
      if (r.map.mapped(g)) (void)backend.unmap(r.place.base() + g * granule, granule);
    }
    (void)backend.release_address(r.place.base(), r.place.bytes());
  }
}

// Errors are built out of line, so the hot path carries no string code.
Error DevicePool::Impl::stale(DeviceHandle h) const {
  if (h.pool != id) {
    std::optional<std::uint32_t> other;
    {
      PoolDevices& reg = pool_devices();
      std::lock_guard lock(reg.mu);
      if (auto it = reg.device_of.find(h.pool); it != reg.device_of.end()) other = it->second;
    }
    const std::string here = "device " + std::to_string(options.device) + "'s pool " + std::to_string(id);
    const std::string handle = "handle " + text::handle(h);
    if (other && *other != options.device) {
      return make_error(ErrorCode::stale_handle, handle + " belongs to device " + std::to_string(*other) +
                                                     "'s pool, used on " + here);
    }
    return make_error(ErrorCode::stale_handle, handle + " belongs to another pool (this is " + here + ")");
  }
  return make_error(ErrorCode::stale_handle,
                    "handle {slot " + std::to_string(h.slot) + ", generation " +
                        std::to_string(h.generation) + "} is stale: " +
                        (h.slot >= blocks.size()
                             ? std::string("no such slot")
                             : "slot is at generation " + std::to_string(blocks[h.slot].generation) +
                                   (blocks[h.slot].state != BlockState::live ? " and free" : "")));
}

// allocate()'s refusals, out of line like stale().
Error DevicePool::Impl::refuse(std::uint64_t bytes, StreamId stream) const {
  if (!status.ok()) return status.error();
  if (bytes == 0) {
    return make_error(ErrorCode::invalid_argument, "allocation of 0 bytes on stream " +
                                                       std::to_string(stream) + " (sizes must be > 0)");
  }
  return check_stream(stream, "allocation").error();
}

void DevicePool::Impl::check_now() const {
  detail::check_invariants(true, "DevicePool", [&](std::string* why) { return validate_locked(why); });
}

DevicePool::DevicePool(StreamOrder& order, PoolOptions options)
    : impl_(std::make_unique<Impl>(order, options)) {}

DevicePool::~DevicePool() = default;

const Result<void>& DevicePool::status() const noexcept { return impl_->status; }
std::uint64_t DevicePool::capacity() const noexcept { return impl_->capacity; }
StreamOrder& DevicePool::order() noexcept { return impl_->order; }

Result<DeviceHandle> DevicePool::allocate(std::uint64_t bytes, StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("allocate"));
  return impl_->allocate(bytes, stream, false);
}

Result<DeviceHandle> DevicePool::allocate_internal(std::uint64_t bytes, StreamId stream) {
  return impl_->allocate(bytes, stream, true);
}

Result<void> DevicePool::free(DeviceHandle handle) {
  FERRY_TRY(refuse_inside_user_kernel("free"));
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  const std::uint32_t b = p.find_block(handle);
  if (b == Impl::kNoBlock) [[unlikely]] {
    // A sub-block's free drops its handle only: the bytes are its block's.
    const std::uint32_t s = p.find_sub(handle);
    if (s == Impl::kNoBlock) return p.stale(handle);
    p.free_sub(s);
    p.check();
    return {};
  }
  p.release_handle(b);
  if (!p.queued.empty()) [[unlikely]] p.settle();
  // A free moves bytes from live to pending or releases them: no peak can rise.
  p.check();
  return {};
}

Result<DeviceSpan> DevicePool::resolve(DeviceHandle handle) const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  return DeviceSpan{p.blocks[*b].addr, p.blocks[*b].requested};
}

Result<DeviceHandle> DevicePool::reissue(DeviceHandle handle, std::uint64_t bytes) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> found = p.find(handle);
  if (!found.ok()) return std::move(found).error();
  const std::uint32_t b = *found;
  Impl::Block& blk = p.blocks[b];
  const bool sub = blk.state == Impl::BlockState::sub;
  const std::uint64_t size = p.span_of(b);
  if (bytes == 0 || bytes > size || blk.generation == Impl::kLastGeneration) {
    return make_error(ErrorCode::invalid_argument,
                      "reissue of block {slot " + std::to_string(b) + "} as " + std::to_string(bytes) + " bytes: " +
                          (blk.generation == Impl::kLastGeneration ? std::string("its slot is at its last generation")
                                                                   : "the block holds " + std::to_string(size)));
  }
  // I1: every copy of the old handle goes stale, as at a free; so does every
  // sub-block of the block.
  ++blk.generation;
  if (blk.has_subs) p.drop_subs(b);
  if (!sub) {
    p.st.requested_bytes = p.st.requested_bytes - blk.requested + bytes;
    p.st.peak_requested_bytes = std::max(p.st.peak_requested_bytes, p.st.requested_bytes);
  }
  blk.requested = bytes;
  const DeviceHandle h{p.id, b, blk.generation};
  if (p.note_blocks) p.backend.note_block(blk.addr, size, h, {});
  p.check();
  return h;
}

Result<void> DevicePool::set_tag(DeviceHandle handle, std::string_view tag) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  p.backend.note_block(p.blocks[*b].addr, p.span_of(*b), handle, tag);
  return {};
}

Result<DeviceSpan> DevicePool::lease(DeviceHandle handle, StreamPoint point) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  // I2: the block stays this operation's until `point` completes (a sub-block's parent).
  const std::uint32_t held = p.holder(*b);
  p.blocks[held].leased = true;
  p.leases[held].uses.add(point);
  return DeviceSpan{p.blocks[*b].addr, p.blocks[*b].requested};
}

Result<UseSet> DevicePool::last_uses(DeviceHandle handle) const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  UseSet out = p.leases[*b].uses;
  if (p.blocks[*b].ready_set) out.add(p.leases[*b].ready_after);
  return out;
}

Result<void> DevicePool::make_ready(DeviceHandle handle, StreamId stream) {
  StreamPoint after;
  {
    std::lock_guard lock(impl_->mu);
    Result<std::uint32_t> b = impl_->find(handle);
    if (!b.ok()) return std::move(b).error();
    const std::uint32_t held = impl_->holder(*b);
    if (impl_->blocks[held].ready_set) after = impl_->leases[held].ready_after;
  }
  Result<Ticket> t = impl_->order_after(stream, after);
  if (!t.ok()) return std::move(t).error();
  return {};
}

bool detail::PoolTestAccess::set_free_slot_generation(DevicePool& pool, std::uint32_t slot,
                                                      std::uint32_t generation) {
  DevicePool::Impl& p = *pool.impl_;
  std::lock_guard lock(p.mu);
  if (slot >= p.blocks.size() || p.blocks[slot].state != DevicePool::Impl::BlockState::spare || generation == 0) return false;
  p.blocks[slot].generation = generation;
  return true;
}

// Without the pool lock: a test must see a waiter even when a broken pool holds it.
std::uint32_t detail::PoolTestAccess::driver_waiters(const DevicePool& pool) {
  return pool.impl_->driver_waiters.load(std::memory_order_relaxed);
}
// --- convenience enqueues ------------------------------------------------------

Result<Ticket> enqueue_fill(DevicePool& pool, StreamId stream, DeviceHandle dst, std::uint64_t seed,
                            Pattern pattern) {
  FERRY_TRY(pool.make_ready(dst, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    Result<DeviceSpan> d = pool.lease(dst, {stream, t});
    if (!d.ok()) return std::move(d).error();
    return Op{FillOp{{d->addr, d->bytes}, seed, pattern}};
  });
}

Result<Ticket> enqueue_compute(DevicePool& pool, StreamId stream, std::span<const DeviceHandle> inputs,
                               DeviceHandle output, double flops, std::uint64_t mem_bytes,
                               Pattern pattern) {
  for (DeviceHandle h : inputs) FERRY_TRY(pool.make_ready(h, stream));
  FERRY_TRY(pool.make_ready(output, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    ComputeOp op;
    op.flops = flops;
    op.mem_bytes = mem_bytes;
    op.pattern = pattern;
    for (DeviceHandle h : inputs) {
      Result<DeviceSpan> s = pool.lease(h, {stream, t});
      if (!s.ok()) return std::move(s).error();
      op.inputs.push_back({s->addr, s->bytes});
    }
    Result<DeviceSpan> o = pool.lease(output, {stream, t});
    if (!o.ok()) return std::move(o).error();
    op.output = {o->addr, o->bytes};
    return Op{std::move(op)};
  });
}

Result<Ticket> enqueue_copy_to_host(DevicePool& pool, StreamId stream, DeviceHandle src,
                                    std::span<std::byte> dst) {
  FERRY_TRY(pool.make_ready(src, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    Result<DeviceSpan> r = pool.resolve(src);
    if (!r.ok()) return std::move(r).error();
    if (dst.size() < r->bytes) {
      return make_error(ErrorCode::invalid_argument,
                        "copy to host: destination holds " + std::to_string(dst.size()) +
                            " B, the block " + std::to_string(r->bytes) + " B");
    }
    Result<DeviceSpan> s = pool.lease(src, {stream, t});
    if (!s.ok()) return std::move(s).error();
    return Op{CopyToHostOp{dst.data(), {s->addr, s->bytes}}};
  });
}

Result<Ticket> enqueue_copy_to_host(DevicePool& pool, StreamId stream, DeviceHandle src,
                                    std::uint64_t offset, std::span<std::byte> dst) {
  FERRY_TRY(pool.make_ready(src, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    Result<DeviceSpan> r = pool.resolve(src);
    if (!r.ok()) return std::move(r).error();
    if (offset > r->bytes || dst.size() > r->bytes - offset) {
      return make_error(ErrorCode::invalid_argument,
                        "copy to host: bytes [" + std::to_string(offset) + ", +" + std::to_string(dst.size()) +
                            ") lie outside the block of " + std::to_string(r->bytes) + " B");
    }
    Result<DeviceSpan> s = pool.lease(src, {stream, t});
    if (!s.ok()) return std::move(s).error();
    return Op{CopyToHostOp{dst.data(), {s->addr + offset, dst.size()}}};
  });
}

}  // namespace ferry
