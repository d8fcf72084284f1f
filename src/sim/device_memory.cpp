#include "sim/device_memory.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "core/text.hpp"

namespace ferry::sim {
namespace {

// Zeros to hash for granules that were mapped but never written.
constexpr std::size_t kZeroBlock = 64 * 1024;
const std::array<std::byte, kZeroBlock> kZeros{};

// Precondition: bytes + granularity does not overflow (callers bound bytes first).
std::uint64_t round_up(std::uint64_t bytes, std::uint64_t granularity) {
  return (bytes + granularity - 1) / granularity * granularity;
}

}  // namespace

DeviceMemory::DeviceMemory(std::uint64_t capacity, std::uint64_t granularity)
    : capacity_(capacity), granularity_(granularity) {}

Result<std::uint64_t> DeviceMemory::reserve(std::uint64_t bytes) {
  if (bytes == 0) {
    return make_error(ErrorCode::invalid_argument, "reserve_address of 0 bytes");
  }
  // One unreserved granule after each reservation: an overrun past its end
  // faults instead of landing in the neighbour.
  const std::uint64_t limit_left = kAddressLimit - next_base_;
  if (bytes > limit_left || round_up(bytes, granularity_) + granularity_ > limit_left) {
    return make_error(ErrorCode::out_of_memory,
                      "reserve_address of " + text::exact_bytes(bytes) + ": the simulated virtual "
                          "address space has " + text::exact_bytes(limit_left) + " left");
  }
  const std::uint64_t size = round_up(bytes, granularity_);
  const std::uint64_t base = next_base_;
  reservations_.emplace(base, Reservation{size, 0});
  next_base_ = base + size + granularity_;
  return base;
}

Result<void> DeviceMemory::release(std::uint64_t base, std::uint64_t bytes) {
  const auto it = reservations_.find(base);
  if (it == reservations_.end()) {
    return make_error(ErrorCode::invalid_argument,
                      "release_address(" + text::hex(base) + "): not the base of a reservation");
  }
  if (bytes != it->second.bytes &&
      (bytes == 0 || bytes > it->second.bytes || round_up(bytes, granularity_) != it->second.bytes)) {
    return make_error(ErrorCode::invalid_argument,
                      "release_address(" + text::hex(base) + ", " + text::exact_bytes(bytes) +
                          "): the reservation there is " + text::exact_bytes(it->second.bytes));
  }
  if (it->second.mapped_granules != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "release_address(" + text::hex(base) + "): " +
                          std::to_string(it->second.mapped_granules) +
                          " granules are still mapped inside; unmap them first");
  }
  reservations_.erase(it);
  return {};
}

std::map<std::uint64_t, DeviceMemory::Reservation>::iterator DeviceMemory::find_reservation(
    std::uint64_t addr, std::uint64_t bytes) {
  auto it = reservations_.upper_bound(addr);
  if (it == reservations_.begin()) return reservations_.end();
  --it;
  const std::uint64_t offset = addr - it->first;
  if (offset >= it->second.bytes || bytes > it->second.bytes - offset) return reservations_.end();
  return it;
}

Result<std::map<std::uint64_t, DeviceMemory::Reservation>::iterator>
DeviceMemory::check_granule_range(const char* what, std::uint64_t addr, std::uint64_t bytes) {
  const std::string request = std::string(what) + "(" + text::hex(addr) + ", " + text::exact_bytes(bytes) + ")";
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, request + ": 0 bytes");
  if (addr % granularity_ != 0 || bytes % granularity_ != 0) {
    return make_error(ErrorCode::invalid_argument,
                      request + ": address and size must be multiples of the granularity " +
                          text::exact_bytes(granularity_));
  }
  const auto it = find_reservation(addr, bytes);
  if (it == reservations_.end()) {
    return make_error(ErrorCode::invalid_argument, request + ": not inside one reserved range");
  }
  return it;
}

Result<void> DeviceMemory::map(std::uint64_t addr, std::uint64_t bytes) {
  auto checked = check_granule_range("map", addr, bytes);
  if (!checked.ok()) return std::move(checked).error();
  const std::uint64_t first = addr / granularity_;
  const std::uint64_t count = bytes / granularity_;
  for (std::uint64_t g = first; g < first + count; ++g) {
    if (granules_.contains(g)) {
      return make_error(ErrorCode::invalid_argument,
                        "map(" + text::hex(addr) + ", " + text::exact_bytes(bytes) + "): granule at " +
                            text::hex(g * granularity_) + " is already mapped");
    }
  }
  if (bytes > capacity_ - mapped_bytes_) {
    return make_error(ErrorCode::out_of_memory,
                      "map(" + text::hex(addr) + ", " + text::exact_bytes(bytes) + "): " +
                          text::exact_bytes(mapped_bytes_) + " of the device's " +
                          text::exact_bytes(capacity_) + " are already mapped");
  }
  for (std::uint64_t g = first; g < first + count; ++g) granules_.emplace(g, nullptr);
  (*checked)->second.mapped_granules += count;
  mapped_bytes_ += bytes;
  return {};
}

Result<void> DeviceMemory::unmap(std::uint64_t addr, std::uint64_t bytes) {
  auto checked = check_granule_range("unmap", addr, bytes);
  if (!checked.ok()) return std::move(checked).error();
  const std::uint64_t first = addr / granularity_;
  const std::uint64_t count = bytes / granularity_;
  for (std::uint64_t g = first; g < first + count; ++g) {
    if (!granules_.contains(g)) {
      return make_error(ErrorCode::invalid_argument,
                        "unmap(" + text::hex(addr) + ", " + text::exact_bytes(bytes) + "): granule at " +
                            text::hex(g * granularity_) + " is not mapped");
    }
  }
  for (std::uint64_t g = first; g < first + count; ++g) granules_.erase(g);
  (*checked)->second.mapped_granules -= count;
  mapped_bytes_ -= bytes;
  return {};
}

std::optional<std::uint64_t> DeviceMemory::first_unmapped(std::uint64_t addr,
                                                          std::uint64_t bytes) const {
  if (bytes == 0) return std::nullopt;
  if (addr > UINT64_MAX - bytes) return addr;
  const std::uint64_t first = addr / granularity_;
  const std::uint64_t last = (addr + bytes - 1) / granularity_;
  // Bounded by the number of mapped granules + 1, however long the range.
  for (std::uint64_t g = first; g <= last; ++g) {
    if (!granules_.contains(g)) return std::max(addr, g * granularity_);
  }
  return std::nullopt;
}

std::byte* DeviceMemory::writable(std::uint64_t granule_index) {
  Granule& g = granules_.at(granule_index);
  if (!g) g = std::make_unique<std::byte[]>(granularity_);  // value-initialized: zeros
  return g.get();
}

void DeviceMemory::read(std::uint64_t addr, std::span<std::byte> out) const {
  for_each_piece(addr, out.size(), [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                       std::uint64_t pos) {
    const Granule& granule = granules_.at(g);
    if (granule) {
      std::memcpy(out.data() + pos, granule.get() + off, len);
    } else {
      std::memset(out.data() + pos, 0, len);
    }
  });
}

void DeviceMemory::write(std::uint64_t addr, std::span<const std::byte> in) {
  for_each_piece(addr, in.size(), [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                      std::uint64_t pos) {
    std::memcpy(writable(g) + off, in.data() + pos, len);
  });
}

void DeviceMemory::fill(std::uint64_t addr, std::uint64_t bytes, std::uint64_t seed, Pattern pattern) {
  for_each_piece(addr, bytes, [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                  std::uint64_t pos) {
    fill_with(pattern, seed, pos, std::span<std::byte>(writable(g) + off, len));
  });
}

void DeviceMemory::copy(std::uint64_t dst, std::uint64_t src, std::uint64_t bytes) {
  if (bytes == 0 || dst == src) return;
  // Chunks go through a bounce buffer; copying back to front when dst is above
  // src keeps an overlapping source from being overwritten before it is read.
  const std::uint64_t chunk = std::min(bytes, granularity_);
  std::vector<std::byte> bounce(chunk);
  const std::uint64_t chunks = (bytes + chunk - 1) / chunk;
  for (std::uint64_t i = 0; i < chunks; ++i) {
    const std::uint64_t k = dst > src ? chunks - 1 - i : i;
    const std::uint64_t off = k * chunk;
    const std::uint64_t len = std::min(chunk, bytes - off);
    read(src + off, std::span<std::byte>(bounce.data(), len));
    write(dst + off, std::span<const std::byte>(bounce.data(), len));
  }
}

void DeviceMemory::hash(std::uint64_t addr, std::uint64_t bytes, ContentHasher& hasher) const {
  for_each_piece(addr, bytes, [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                  std::uint64_t) {
    const Granule& granule = granules_.at(g);
    if (granule) {
      hasher.update(std::span<const std::byte>(granule.get() + off, len));
      return;
    }
    for (std::uint64_t done = 0; done < len;) {
      const std::uint64_t take = std::min<std::uint64_t>(kZeroBlock, len - done);
      hasher.update(std::span<const std::byte>(kZeros.data(), take));
      done += take;
    }
  });
}

bool DeviceMemory::validate() const {
  if (granularity_ == 0 || (granularity_ & (granularity_ - 1)) != 0) return false;
  if (mapped_bytes_ != granules_.size() * granularity_ || mapped_bytes_ > capacity_) return false;
  std::uint64_t counted = 0;
  std::uint64_t previous_end = kFirstAddress;
  bool first = true;
  for (const auto& [base, r] : reservations_) {
    if (base % granularity_ != 0 || r.bytes == 0 || r.bytes % granularity_ != 0) return false;
    if (base < previous_end || (!first && base < previous_end + granularity_)) return false;
    if (base + r.bytes > next_base_) return false;
    previous_end = base + r.bytes;
    first = false;
    counted += r.mapped_granules;
  }
  if (counted != granules_.size()) return false;
  for (const auto& [g, storage] : granules_) {
    const auto it = reservations_.upper_bound(g * granularity_);
    if (it == reservations_.begin()) return false;
    const auto& [base, r] = *std::prev(it);
    if (g * granularity_ >= base + r.bytes) return false;
  }
  return true;
}

}  // namespace ferry::sim
