#include "sim/pinned_host_memory.hpp"

#include <sys/mman.h>

#include <iterator>
#include <string>

#include "core/text.hpp"

namespace ferry::sim {

PinnedHostMemory::~PinnedHostMemory() {
  for (const auto& [begin, range] : ranges_) {
    if (!range.registered) ::munmap(reinterpret_cast<void*>(begin), range.bytes);
  }
}

Result<std::byte*> PinnedHostMemory::allocate(std::uint64_t bytes, std::uint64_t stale_at_ns) {
  if (bytes == 0 || bytes > kMaxBytes) {
    return make_error(ErrorCode::invalid_argument,
                      "allocate_pinned(" + std::to_string(bytes) + " bytes): size must be 1 B.." +
                          text::exact_bytes(kMaxBytes));
  }
  // mmap rather than operator new: a refused request comes back as a value,
  // whereas a sanitizer's allocator aborts the process on a huge failed new.
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return make_error(ErrorCode::out_of_memory,
                      "allocate_pinned(" + text::exact_bytes(bytes) + "): the host refused; " +
                          text::exact_bytes(stats_.pinned_bytes) + " pinned already");
  }
  auto* ptr = static_cast<std::byte*>(p);
  ranges_.emplace(key(ptr), PinnedRange{bytes, false, stale_at_ns});
  ++stats_.pinned_allocs;
  stats_.pinned_bytes += bytes;
  return ptr;
}

Result<void> PinnedHostMemory::free(std::byte* ptr) {
  const auto it = ranges_.find(key(ptr));
  if (it == ranges_.end() || it->second.registered) {
    return make_error(ErrorCode::invalid_argument,
                      "free_pinned(" + text::hex(ptr) + "): not a live buffer from allocate_pinned");
  }
  ::munmap(ptr, it->second.bytes);
  ++stats_.pinned_frees;
  stats_.pinned_bytes -= it->second.bytes;
  ranges_.erase(it);
  return {};
}

Result<void> PinnedHostMemory::register_range(std::byte* ptr, std::uint64_t bytes,
                                              std::uint64_t stale_at_ns) {
  const std::string request = "register_host(" + text::hex(ptr) + ", " + std::to_string(bytes) + " bytes)";
  if (ptr == nullptr || bytes == 0 || bytes > kMaxBytes || key(ptr) > UINTPTR_MAX - bytes) {
    return make_error(ErrorCode::invalid_argument,
                      request + ": needs a non-null range of 1 B.." + text::exact_bytes(kMaxBytes));
  }
  if (overlaps_any(key(ptr), bytes)) {
    return make_error(ErrorCode::invalid_argument,
                      request + ": overlaps memory that is already pinned or registered");
  }
  ranges_.emplace(key(ptr), PinnedRange{bytes, true, stale_at_ns});
  ++stats_.registrations;
  return {};
}

Result<void> PinnedHostMemory::unregister(std::byte* ptr) {
  const auto it = ranges_.find(key(ptr));
  if (it == ranges_.end() || !it->second.registered) {
    return make_error(ErrorCode::invalid_argument,
                      "unregister_host(" + text::hex(ptr) + "): not the start of a registered range");
  }
  ranges_.erase(it);
  ++stats_.unregistrations;
  return {};
}

const PinnedRange* PinnedHostMemory::find(const std::byte* ptr, std::uint64_t bytes) const {
  const std::uintptr_t begin = key(ptr);
  auto it = ranges_.upper_bound(begin);
  if (it == ranges_.begin()) return nullptr;
  --it;
  const std::uint64_t offset = begin - it->first;
  if (offset >= it->second.bytes || bytes > it->second.bytes - offset) return nullptr;
  return &it->second;
}

const PinnedRange* PinnedHostMemory::allocation_at(const std::byte* ptr) const {
  const auto it = ranges_.find(key(ptr));
  return it == ranges_.end() || it->second.registered ? nullptr : &it->second;
}

bool PinnedHostMemory::overlaps_any(std::uintptr_t begin, std::uint64_t bytes) const {
  auto it = ranges_.lower_bound(begin);
  if (it != ranges_.end() && it->first - begin < bytes) return true;
  if (it == ranges_.begin()) return false;
  --it;
  return begin - it->first < it->second.bytes;
}

bool PinnedHostMemory::validate() const {
  std::uint64_t owned_bytes = 0, owned = 0, registered = 0;
  std::uintptr_t previous_end = 0;
  for (const auto& [begin, range] : ranges_) {
    if (range.bytes == 0 || begin < previous_end) return false;
    previous_end = begin + range.bytes;
    if (range.registered) {
      ++registered;
    } else {
      ++owned;
      owned_bytes += range.bytes;
    }
  }
  return owned_bytes == stats_.pinned_bytes &&
         owned == stats_.pinned_allocs - stats_.pinned_frees &&
         registered == stats_.registrations - stats_.unregistrations;
}

}  // namespace ferry::sim
