// ferry — Allocation: one DevicePool block owned by an object, freed when the
// object goes (std::unique_ptr's rules, for a DeviceHandle).
//
// The free is the pool's stream-ordered free (device_pool.hpp I3): dropping an
// Allocation while enqueued work still uses the block is legal, the memory is
// reused only once that work has completed (or by later work on the same stream).
//
//   bool(a)  <=>  a owns a handle  <=>  a.handle() != DeviceHandle{}
//
// Lifetime: the pool must outlive every Allocation of it (an Allocation holds a
// reference, not ownership). A moved-from, released or reset Allocation is empty
// and frees nothing.
//
// Thread safety: one Allocation is not safe to use from two threads at once
// (as a std::unique_ptr); distinct Allocations of one pool are, since every
// DevicePool method is. Nothing here blocks on the device.
#pragma once

#include <cstdint>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

class Allocation {
 public:
  // Empty: owns nothing.
  Allocation() noexcept = default;
  // Allocates `bytes` on `stream` (DevicePool::allocate). Errors: those of
  // DevicePool::allocate (invalid_argument, out_of_memory, backend_error).
  // May block (bounded) in the pool's reclaim sequence.
  static Result<Allocation> allocate(DevicePool& pool, std::uint64_t bytes, StreamId stream);

  // Moves ownership; `other` is left empty.
  Allocation(Allocation&& other) noexcept;
  // Frees what this one owned (errors ignored, as in the destructor), then takes
  // `other`'s block; `other` is left empty.
  Allocation& operator=(Allocation&& other) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  // Frees the block (stream-ordered). A destructor cannot report, so a failed free
  // is ignored: the only one possible is stale_handle, when someone freed
  // handle() behind the Allocation's back.
  ~Allocation();

  // The handle, to pass to enqueue_* and the transfer engine; null when empty.
  // Valid while this Allocation owns it; do not free it yourself.
  DeviceHandle handle() const noexcept { return handle_; }
  // The size asked for (the pool rounds the block up to 256). 0 when empty.
  std::uint64_t bytes() const noexcept { return bytes_; }
  // The stream it was allocated on (the stream its memory is ordered on first).
  StreamId stream() const noexcept { return stream_; }
  // The pool it came from; null when empty.
  DevicePool* pool() const noexcept { return pool_; }
  explicit operator bool() const noexcept { return pool_ != nullptr; }

  // Gives up ownership without freeing: the caller frees the returned handle
  // (DevicePool::free). Returns the null handle when empty. Never fails.
  [[nodiscard]] DeviceHandle release() noexcept;
  // Frees the block now and leaves this empty. Empty already: does nothing, ok.
  // Errors: stale_handle (the handle was freed behind the Allocation's back; it
  // is empty afterwards all the same). Never blocks.
  Result<void> reset();

 private:
  Allocation(DevicePool& pool, DeviceHandle handle, std::uint64_t bytes, StreamId stream) noexcept
      : pool_(&pool), handle_(handle), bytes_(bytes), stream_(stream) {}

  DevicePool* pool_ = nullptr;
  DeviceHandle handle_{};
  std::uint64_t bytes_ = 0;
  StreamId stream_ = 0;
};

}  // namespace ferry
