#include "sim/device_memory.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "core/align.hpp"
#include "core/text.hpp"

namespace ferry::sim {
namespace {

// Zeros to hash for granules that were mapped but never written.
constexpr std::size_t kZeroBlock = 64 * 1024;
const std::array<std::byte, kZeroBlock> kZeros{};

// Callers bound bytes first, so bytes + granularity does not overflow.
using detail::align_up;

}  // namespace

DeviceMemory::DeviceMemory(std::uint64_t capacity, std::uint64_t granularity, std::uint64_t storage_limit)
    : capacity_(capacity),
      granularity_(granularity),
      storage_limit_(storage_limit == 0 ? UINT64_MAX : storage_limit) {}

DeviceMemory::Storage& DeviceMemory::Storage::operator=(Storage&& other) noexcept {
  if (this != &other) {
    if (bytes_ != nullptr) ::munmap(bytes_, size_);
    bytes_ = std::exchange(other.bytes_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceMemory::Storage::~Storage() {
  if (bytes_ != nullptr) ::munmap(bytes_, size_);
}

Result<std::uint64_t> DeviceMemory::reserve(std::uint64_t bytes) {
  if (bytes == 0) {
    return make_error(ErrorCode::invalid_argument, "reserve_address of 0 bytes");
  }
  // One unreserved granule after each reservation: an overrun past its end
  // faults instead of landing in the neighbour.
  const std::uint64_t limit_left = kAddressLimit - next_base_;
  if (bytes > limit_left || align_up(bytes, granularity_) + granularity_ > limit_left) {
    return make_error(ErrorCode::out_of_memory,
                      "reserve_address of " + text::exact_bytes(bytes) + ": the simulated virtual "
                          "address space has " + text::exact_bytes(limit_left) + " left");
  }
  const std::uint64_t size = align_up(bytes, granularity_);
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
      (bytes == 0 || bytes > it->second.bytes || align_up(bytes, granularity_) != it->second.bytes)) {
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
  for (std::uint64_t g = first; g < first + count; ++g) granules_.emplace(g, Granule{});
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
  for (std::uint64_t g = first; g < first + count; ++g) {
    const auto it = granules_.find(g);
    drop_storage(it->second);
    granules_.erase(it);
  }
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

void DeviceMemory::drop_storage(Granule& granule) noexcept {
  if (!granule.storage) return;
  granule.storage = Storage{};
  stored_bytes_ -= granularity_;
}

void DeviceMemory::generate(const Granule& granule, std::uint64_t off, std::span<std::byte> out) const {
  if (granule.storage) {
    std::memcpy(out.data(), granule.storage.get() + off, out.size());
  } else if (granule.symbol) {
    fill_with(granule.symbol->pattern, granule.symbol->seed, granule.symbol->origin + off, out);
  } else {
    std::memset(out.data(), 0, out.size());
  }
}

Result<void> DeviceMemory::store(const std::vector<std::uint64_t>& gs) {
  std::vector<std::pair<std::uint64_t, std::optional<Symbol>>> stored;  // what to undo on failure
  const auto refused = [&](const std::string& why) {
    Error e = make_error(ErrorCode::out_of_memory,
                         "host memory for the simulated device's bytes is exhausted: " + why + " (" +
                             text::exact_bytes(stored_bytes_) + " held for written granules; fills are "
                             "kept as patterns and cost none)");
    for (auto& [g, symbol] : stored) {
      Granule& granule = granules_.at(g);
      drop_storage(granule);
      granule.symbol = symbol;
    }
    return e;
  };
  for (const std::uint64_t g : gs) {
    Granule& granule = granules_.at(g);
    if (granule.storage) continue;
    if (granularity_ > storage_limit_ - stored_bytes_) {
      return refused("one more granule of " + text::exact_bytes(granularity_) +
                     " would pass the model's limit of " + text::exact_bytes(storage_limit_));
    }
    // mmap rather than operator new: a refused request comes back as a value,
    // whereas a sanitizer's allocator aborts the process on a failed new.
    void* p = ::mmap(nullptr, granularity_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return refused("the host refused " + text::exact_bytes(granularity_) + " more");
    Storage storage(static_cast<std::byte*>(p), granularity_);
    if (granule.symbol) generate(granule, 0, std::span<std::byte>(storage.get(), granularity_));
    stored.emplace_back(g, granule.symbol);
    granule.symbol.reset();  // zeros need no copy: a fresh mapping is zeros
    granule.storage = std::move(storage);
    stored_bytes_ += granularity_;
  }
  return {};
}

Result<void> DeviceMemory::store_touched(std::uint64_t addr, std::uint64_t bytes, bool whole) {
  std::vector<std::uint64_t> gs;
  for_each_piece(addr, bytes, [&](std::uint64_t g, std::uint64_t, std::uint64_t len, std::uint64_t) {
    if (whole || len < granularity_) gs.push_back(g);
  });
  return store(gs);
}

void DeviceMemory::read(std::uint64_t addr, std::span<std::byte> out) const {
  for_each_piece(addr, out.size(), [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                       std::uint64_t pos) {
    generate(granules_.at(g), off, out.subspan(pos, len));
  });
}

Result<void> DeviceMemory::write(std::uint64_t addr, std::span<const std::byte> in) {
  FERRY_TRY(prepare_write(addr, in.size()));
  for_each_piece(addr, in.size(), [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                      std::uint64_t pos) {
    std::memcpy(granules_.at(g).storage.get() + off, in.data() + pos, len);
  });
  return {};
}

Result<void> DeviceMemory::fill(std::uint64_t addr, std::uint64_t bytes, std::uint64_t seed, Pattern pattern) {
  FERRY_TRY(prepare_fill(addr, bytes));
  for_each_piece(addr, bytes, [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                  std::uint64_t pos) {
    Granule& granule = granules_.at(g);
    if (len == granularity_) {
      drop_storage(granule);
      granule.symbol = Symbol{seed, pos, pattern};
    } else {
      fill_with(pattern, seed, pos, std::span<std::byte>(granule.storage.get() + off, len));
    }
  });
  return {};
}

Result<void> DeviceMemory::prepare_copy(std::uint64_t dst, std::uint64_t src, std::uint64_t bytes) {
  if (bytes == 0 || dst == src) return {};
  // A dst granule covered whole from a whole src granule that is not stored takes
  // over its state (zeros, or the symbol): nothing to store. Everything else of dst
  // is stored first. When the two ranges share a granule, storing dst could store
  // a src granule meant to be taken over: then all of dst is stored.
  const std::uint64_t g = granularity_;
  const bool share = dst / g <= (src + bytes - 1) / g && src / g <= (dst + bytes - 1) / g;
  const auto taken_over = [&](std::uint64_t piece_len, std::uint64_t src_addr) {
    return piece_len == g && src_addr % g == 0 && !granules_.at(src_addr / g).storage;
  };
  std::vector<std::uint64_t> gs;
  for_each_piece(dst, bytes, [&](std::uint64_t dg, std::uint64_t, std::uint64_t len, std::uint64_t pos) {
    if (share || !taken_over(len, src + pos)) gs.push_back(dg);
  });
  return store(gs);
}

Result<void> DeviceMemory::copy(std::uint64_t dst, std::uint64_t src, std::uint64_t bytes) {
  if (bytes == 0 || dst == src) return {};
  FERRY_TRY(prepare_copy(dst, src, bytes));
  const std::uint64_t g = granularity_;
  // Pieces go back to front when dst is above src, so an overlapping source is
  // read before it is overwritten.
  std::vector<std::array<std::uint64_t, 3>> pieces;  // dst granule, offset in it, offset in range
  pieces.reserve(static_cast<std::size_t>(bytes / g + 2));
  for_each_piece(dst, bytes, [&](std::uint64_t dg, std::uint64_t off, std::uint64_t, std::uint64_t pos) {
    pieces.push_back({dg, off, pos});
  });
  if (dst > src) std::reverse(pieces.begin(), pieces.end());
  std::vector<std::byte> bounce;
  for (const auto& [dg, off, pos] : pieces) {
    const std::uint64_t len = std::min(g - off, bytes - pos);
    Granule& to = granules_.at(dg);
    if (!to.storage) {  // taken over: stored above otherwise
      const Granule& from = granules_.at((src + pos) / g);
      to.symbol = from.symbol;
      continue;
    }
    bounce.resize(static_cast<std::size_t>(len));
    read(src + pos, bounce);
    std::memcpy(to.storage.get() + off, bounce.data(), len);
  }
  return {};
}

void DeviceMemory::hash(std::uint64_t addr, std::uint64_t bytes, ContentHasher& hasher) const {
  for_each_piece(addr, bytes, [&](std::uint64_t g, std::uint64_t off, std::uint64_t len,
                                  std::uint64_t) {
    const Granule& granule = granules_.at(g);
    if (granule.storage) {
      hasher.update(std::span<const std::byte>(granule.storage.get() + off, len));
      return;
    }
    if (granule.symbol) {
      return hasher.update_pattern(granule.symbol->pattern, granule.symbol->seed, granule.symbol->origin + off, len);
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
  std::uint64_t stored = 0;
  for (const auto& [g, granule] : granules_) {
    if (granule.storage && granule.symbol) return false;
    if (granule.storage) stored += granularity_;
  }
  if (stored != stored_bytes_ || stored_bytes_ > storage_limit_) return false;
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
  for (const auto& [g, granule] : granules_) {
    const auto it = reservations_.upper_bound(g * granularity_);
    if (it == reservations_.begin()) return false;
    const auto& [base, r] = *std::prev(it);
    if (g * granularity_ >= base + r.bytes) return false;
  }
  return true;
}

}  // namespace ferry::sim
