#include "ferry/allocation.hpp"

#include <new>
#include <utility>

namespace ferry {

Result<Allocation> Allocation::allocate(DevicePool& pool, std::uint64_t bytes, StreamId stream) {
  Result<DeviceHandle> h = pool.allocate(bytes, stream);
  if (!h.ok()) return std::move(h).error();
  return Allocation(pool, *h, bytes, stream);
}

Allocation::Allocation(Allocation&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      handle_(std::exchange(other.handle_, DeviceHandle{})),
      bytes_(std::exchange(other.bytes_, 0)),
      stream_(std::exchange(other.stream_, 0)) {}

Allocation& Allocation::operator=(Allocation&& other) noexcept {
  if (this != &other) {
    (void)reset();  // an assignment cannot report either; see ~Allocation
    pool_ = std::exchange(other.pool_, nullptr);
    handle_ = std::exchange(other.handle_, DeviceHandle{});
    bytes_ = std::exchange(other.bytes_, 0);
    stream_ = std::exchange(other.stream_, 0);
  }
  return *this;
}

Allocation::~Allocation() { (void)reset(); }

DeviceHandle Allocation::release() noexcept {
  pool_ = nullptr;
  bytes_ = 0;
  stream_ = 0;
  return std::exchange(handle_, DeviceHandle{});
}

Result<void> Allocation::reset() {
  if (pool_ == nullptr) return {};
  DevicePool& pool = *pool_;
  // Empty before the free, so a failed free never leaves a handle to free twice.
  const DeviceHandle h = release();
  // The destructor and move-assignment are noexcept: host memory running out in
  // the pool's bookkeeping is an error here, never std::terminate.
  try {
    return pool.free(h);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, "Allocation::reset: no host memory to free the block (it leaks)");
  }
}

}  // namespace ferry
