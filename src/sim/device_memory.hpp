// The sim backend's device memory: a virtual address space of reservations and
// the physical granules mapped into it, with real bytes behind them.
//
// Not thread-safe: SimGpu serializes every call.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>

#include "ferry/content.hpp"
#include "ferry/result.hpp"

namespace ferry::sim {

// Invariants (validate()):
//   mapped_bytes_ == granules_.size() * granularity_ <= capacity_
//   sum over reservations of mapped_granules == granules_.size()
//   every mapped granule lies inside exactly one reservation
//   reservations are granule-aligned, disjoint, above kFirstAddress and below
//   next_base_, with at least one unreserved granule between neighbours
class DeviceMemory {
 public:
  DeviceMemory(std::uint64_t capacity, std::uint64_t granularity);

  // Errors: invalid_argument (0 bytes), out_of_memory (virtual space exhausted).
  // Addresses are never reused, so a stale address can never reach new memory.
  Result<std::uint64_t> reserve(std::uint64_t bytes);
  // bytes may be the requested or the granule-rounded size. Errors:
  // invalid_argument (not a reservation, size mismatch, granules still mapped).
  Result<void> release(std::uint64_t base, std::uint64_t bytes);
  // Errors: invalid_argument (unaligned, outside one reservation, granule already
  // mapped / not mapped), out_of_memory (map beyond capacity). On error nothing changes.
  Result<void> map(std::uint64_t addr, std::uint64_t bytes);
  Result<void> unmap(std::uint64_t addr, std::uint64_t bytes);

  std::uint64_t mapped_bytes() const noexcept { return mapped_bytes_; }
  std::uint64_t granularity() const noexcept { return granularity_; }

  // The first address of [addr, addr + bytes) with no granule behind it, or
  // nullopt when the whole range is mapped (always for bytes == 0).
  std::optional<std::uint64_t> first_unmapped(std::uint64_t addr, std::uint64_t bytes) const;

  // Byte access. Precondition: the range is mapped (first_unmapped is nullopt).
  void read(std::uint64_t addr, std::span<std::byte> out) const;
  void write(std::uint64_t addr, std::span<const std::byte> in);
  void fill(std::uint64_t addr, std::uint64_t bytes, std::uint64_t seed, Pattern pattern);
  void copy(std::uint64_t dst, std::uint64_t src, std::uint64_t bytes);  // overlap-safe
  void hash(std::uint64_t addr, std::uint64_t bytes, ContentHasher& hasher) const;

  bool validate() const;

 private:
  struct Reservation {
    std::uint64_t bytes = 0;
    std::uint64_t mapped_granules = 0;
  };
  // A mapped granule whose bytes are still all zero has no storage yet, so
  // mapping the whole capacity of a large profile costs nothing until written.
  using Granule = std::unique_ptr<std::byte[]>;

  // Address 0 and the low 4 GiB stay unreserved: small forged addresses fault.
  static constexpr std::uint64_t kFirstAddress = std::uint64_t{1} << 32;
  static constexpr std::uint64_t kAddressLimit = std::uint64_t{1} << 56;

  // The reservation containing [addr, addr + bytes), or end().
  std::map<std::uint64_t, Reservation>::iterator find_reservation(std::uint64_t addr,
                                                                  std::uint64_t bytes);
  Result<std::map<std::uint64_t, Reservation>::iterator> check_granule_range(
      const char* what, std::uint64_t addr, std::uint64_t bytes);
  std::byte* writable(std::uint64_t granule_index);

  // Calls fn(granule_index, offset_in_granule, length, offset_in_range) for each
  // granule-bounded piece of [addr, addr + bytes), in address order.
  template <class Fn>
  void for_each_piece(std::uint64_t addr, std::uint64_t bytes, Fn&& fn) const {
    std::uint64_t done = 0;
    while (done < bytes) {
      const std::uint64_t a = addr + done;
      const std::uint64_t in_granule = a % granularity_;
      const std::uint64_t len = std::min(granularity_ - in_granule, bytes - done);
      fn(a / granularity_, in_granule, len, done);
      done += len;
    }
  }

  std::uint64_t capacity_;
  std::uint64_t granularity_;
  std::uint64_t next_base_ = kFirstAddress;
  std::uint64_t mapped_bytes_ = 0;
  std::map<std::uint64_t, Reservation> reservations_;     // by base address
  std::unordered_map<std::uint64_t, Granule> granules_;  // by address / granularity
};

}  // namespace ferry::sim
