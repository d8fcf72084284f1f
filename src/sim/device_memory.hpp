// The sim backend's device memory: a virtual address space of reservations and
// the physical granules mapped into it, with their bytes — sparse and lazy, so a
// 141 GB device fits a small host:
//
//   * a granule never written is zeros and has no storage;
//   * a granule a fill (or a compute, which writes a pattern) covered whole is
//     kept symbolic, as the pattern's seed and the offset into it: its bytes are
//     a function of the two, generated whenever they are read or hashed;
//   * only a granule written by bytes (an upload, a user kernel, a copy from a
//     stored granule) or partly overwritten is stored, in a page of its own
//     (mmap, so a refusal comes back as a value, never as an abort).
//
// Storing a granule is the one step that can fail: out_of_memory when the host
// refuses the page or the model's own limit is reached. Every write first
// stores what it needs (which changes no byte), then writes, so a failed write
// leaves every byte as it was.
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
#include <utility>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/result.hpp"

namespace ferry::sim {

// Invariants (validate()):
//   mapped_bytes_ == granules_.size() * granularity_ <= capacity_
//   stored_bytes_ == (granules with storage) * granularity_ <= storage_limit_
//   no granule has both storage and a symbol
//   sum over reservations of mapped_granules == granules_.size()
//   every mapped granule lies inside exactly one reservation
//   reservations are granule-aligned, disjoint, above kFirstAddress and below
//   next_base_, with at least one unreserved granule between neighbours
class DeviceMemory {
 public:
  // storage_limit: the host bytes the model may store for granules (0: as many
  // as the host gives).
  DeviceMemory(std::uint64_t capacity, std::uint64_t granularity, std::uint64_t storage_limit = 0);
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

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
  // Host bytes held for the granules' bytes (stored granules only).
  std::uint64_t stored_bytes() const noexcept { return stored_bytes_; }
  std::uint64_t granularity() const noexcept { return granularity_; }

  // The first address of [addr, addr + bytes) with no granule behind it, or
  // nullopt when the whole range is mapped (always for bytes == 0).
  std::optional<std::uint64_t> first_unmapped(std::uint64_t addr, std::uint64_t bytes) const;

  // Byte access. Precondition: the range is mapped (first_unmapped is nullopt).
  // Errors of the writes: out_of_memory (host memory for the model exhausted, or
  // its limit reached; said plainly); every byte then holds what it held before.
  void read(std::uint64_t addr, std::span<std::byte> out) const;
  Result<void> write(std::uint64_t addr, std::span<const std::byte> in);
  Result<void> fill(std::uint64_t addr, std::uint64_t bytes, std::uint64_t seed, Pattern pattern);
  Result<void> copy(std::uint64_t dst, std::uint64_t src, std::uint64_t bytes);  // overlap-safe
  void hash(std::uint64_t addr, std::uint64_t bytes, ContentHasher& hasher) const;
  // What write / fill / copy of the same arguments store before they write,
  // stored now: the backend's admit() calls them, so an op the model cannot
  // hold is refused at enqueue rather than failing at completion. Changes no
  // byte. Errors: out_of_memory, as above.
  Result<void> prepare_write(std::uint64_t addr, std::uint64_t bytes) { return store_touched(addr, bytes, true); }
  Result<void> prepare_fill(std::uint64_t addr, std::uint64_t bytes) { return store_touched(addr, bytes, false); }
  Result<void> prepare_copy(std::uint64_t dst, std::uint64_t src, std::uint64_t bytes);

  bool validate() const;

 private:
  struct Reservation {
    std::uint64_t bytes = 0;
    std::uint64_t mapped_granules = 0;
  };
  // One granule's page of host memory, from mmap; empty when there is none.
  class Storage {
   public:
    Storage() = default;
    Storage(std::byte* bytes, std::uint64_t size) noexcept : bytes_(bytes), size_(size) {}
    Storage(Storage&& other) noexcept
        : bytes_(std::exchange(other.bytes_, nullptr)), size_(std::exchange(other.size_, 0)) {}
    Storage& operator=(Storage&& other) noexcept;
    ~Storage();
    std::byte* get() const noexcept { return bytes_; }
    explicit operator bool() const noexcept { return bytes_ != nullptr; }

   private:
    std::byte* bytes_ = nullptr;
    std::uint64_t size_ = 0;
  };
  // Byte i of a symbolic granule is byte origin + i of fill_with(pattern, seed).
  struct Symbol {
    std::uint64_t seed = 0;
    std::uint64_t origin = 0;
    Pattern pattern = Pattern::bytes;
  };
  // Zeros (neither), symbolic (symbol), or stored (storage): never both.
  struct Granule {
    Storage storage;
    std::optional<Symbol> symbol;
  };

  // Address 0 and the low 4 GiB stay unreserved: small forged addresses fault.
  static constexpr std::uint64_t kFirstAddress = std::uint64_t{1} << 32;
  static constexpr std::uint64_t kAddressLimit = std::uint64_t{1} << 56;

  // The reservation containing [addr, addr + bytes), or end().
  std::map<std::uint64_t, Reservation>::iterator find_reservation(std::uint64_t addr,
                                                                  std::uint64_t bytes);
  Result<std::map<std::uint64_t, Reservation>::iterator> check_granule_range(
      const char* what, std::uint64_t addr, std::uint64_t bytes);
  // Makes each granule of `gs` stored, keeping its bytes (a symbol's generated,
  // or zeros). Errors: out_of_memory; then each is as it was, storage included.
  Result<void> store(const std::vector<std::uint64_t>& gs);
  // store() of every granule that [addr, addr + bytes) touches only in part, or
  // of every one it touches with `whole` set.
  Result<void> store_touched(std::uint64_t addr, std::uint64_t bytes, bool whole);
  void drop_storage(Granule& granule) noexcept;
  // Bytes [off, off + out.size()) of one granule, whatever its state.
  void generate(const Granule& granule, std::uint64_t off, std::span<std::byte> out) const;

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
  std::uint64_t storage_limit_;
  std::uint64_t next_base_ = kFirstAddress;
  std::uint64_t mapped_bytes_ = 0;
  std::uint64_t stored_bytes_ = 0;
  std::map<std::uint64_t, Reservation> reservations_;     // by base address
  std::unordered_map<std::uint64_t, Granule> granules_;  // by address / granularity
};

}  // namespace ferry::sim
