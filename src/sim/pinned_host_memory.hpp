// The sim backend's page-locked host memory: buffers it allocates and existing
// ranges registered in place. Copies out of either run at pinned bandwidth and
// are what the pinned-noop fault can swallow.
//
// Not thread-safe: SimGpu serializes every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>

#include "ferry/backend.hpp"
#include "ferry/result.hpp"

namespace ferry::sim {

inline constexpr std::uint64_t kNever = UINT64_MAX;

struct PinnedRange {
  std::uint64_t bytes = 0;
  bool registered = false;            // registered in place, not owned
  std::uint64_t stale_at_ns = kNever;  // pinned-noop: copies out of it are dropped from then on
};

// Invariants (validate()):
//   ranges_ are disjoint and non-empty
//   stats_.pinned_bytes == sum of bytes of the ranges that are not registered
//   stats_.pinned_allocs - stats_.pinned_frees == number of such ranges
//   stats_.registrations - stats_.unregistrations == number of registered ranges
class PinnedHostMemory {
 public:
  // Larger requests are refused as invalid rather than attempted.
  static constexpr std::uint64_t kMaxBytes = std::uint64_t{1} << 40;

  PinnedHostMemory() = default;
  PinnedHostMemory(const PinnedHostMemory&) = delete;
  PinnedHostMemory& operator=(const PinnedHostMemory&) = delete;
  ~PinnedHostMemory();

  // Page-aligned, zero-filled. Errors: invalid_argument (0 or > kMaxBytes),
  // out_of_memory (the host refused).
  Result<std::byte*> allocate(std::uint64_t bytes, std::uint64_t stale_at_ns);
  // Errors: invalid_argument (not a pointer allocate() returned, or freed).
  Result<void> free(std::byte* ptr);
  // Errors: invalid_argument (null, 0 or > kMaxBytes, wraps, overlaps a pinned range).
  Result<void> register_range(std::byte* ptr, std::uint64_t bytes, std::uint64_t stale_at_ns);
  Result<void> unregister(std::byte* ptr);

  // The pinned range holding all of [ptr, ptr + bytes), or nullptr (pageable).
  const PinnedRange* find(const std::byte* ptr, std::uint64_t bytes) const;
  // The allocation that starts at ptr, or nullptr.
  const PinnedRange* allocation_at(const std::byte* ptr) const;

  // Pin and unpin calls so far: the churn the pinned-noop fault feeds on.
  std::uint64_t churn() const noexcept {
    return stats_.pinned_allocs + stats_.pinned_frees + stats_.registrations +
           stats_.unregistrations;
  }
  // Ranges pinned so far (allocations and registrations): numbers the fault draws.
  std::uint64_t pins() const noexcept { return stats_.pinned_allocs + stats_.registrations; }
  const HostMemoryStats& stats() const noexcept { return stats_; }

  bool validate() const;

 private:
  static std::uintptr_t key(const std::byte* ptr) { return reinterpret_cast<std::uintptr_t>(ptr); }
  bool overlaps_any(std::uintptr_t begin, std::uint64_t bytes) const;

  std::map<std::uintptr_t, PinnedRange> ranges_;  // by first address
  HostMemoryStats stats_;
};

}  // namespace ferry::sim
