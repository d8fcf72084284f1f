// HostArena: registered regions (pinned in place, in pieces), where a host range
// lives, the leases transfers take on it, canaries, and retiring a unit.
#include <algorithm>
#include <cstring>

#include "transfer/host_arena_impl.hpp"

namespace ferry {

using detail::addr;
using Unit = detail::ArenaUnit;
using Region = detail::ArenaRegion;
using LiveBlock = detail::ArenaBlock;

const HostArena::Impl::Unit* HostArena::Impl::unit_at(std::uintptr_t p, PinnedUnitId* id_out) const {
  auto it = by_addr.upper_bound(p);
  if (it == by_addr.begin()) return nullptr;
  --it;
  const Unit& u = units[it->second];
  const std::uintptr_t start = u.kind == Unit::Kind::chunk ? addr(u.base) : addr(u.raw);
  const std::uint64_t size = u.kind == Unit::Kind::chunk ? u.bytes : u.raw_bytes;
  if (p - start >= size) return nullptr;
  *id_out = it->second;
  return &u;
}

std::optional<HostRangeInfo> HostArena::Impl::locate(const std::byte* ptr, std::uint64_t bytes) const {
  if (ptr == nullptr || bytes == 0 || addr(ptr) > UINTPTR_MAX - bytes) return std::nullopt;
  PinnedUnitId id = 0;
  const Unit* u = unit_at(addr(ptr), &id);
  if (u == nullptr) return std::nullopt;
  HostRangeInfo info;
  if (u->kind == Unit::Kind::chunk) {
    const std::uint64_t off = addr(ptr) - addr(u->base);
    auto it = u->blocks.upper_bound(off);
    if (it == u->blocks.begin()) return std::nullopt;
    --it;
    const LiveBlock& b = it->second;
    if (b.pending || off - it->first >= b.requested || bytes > b.requested - (off - it->first)) {
      return std::nullopt;
    }
    info.kind = HostRangeInfo::Kind::block;
    info.first_unit = info.last_unit = id;
    info.retired = u->retired;
    info.block = HostBlock{u->base + it->first, b.requested, id, it->first, b.serial};
    return info;
  }
  const Region& r = regions.at(u->region);
  if (r.closing || addr(ptr) + bytes > addr(r.ptr) + r.bytes) return std::nullopt;
  info.kind = HostRangeInfo::Kind::registered;
  info.region = u->region;
  info.first_unit = id;
  PinnedUnitId last = id;
  while (last < r.last) {
    const Unit& nxt = units[last + 1];
    if (addr(nxt.raw) >= addr(ptr) + bytes) break;
    ++last;
  }
  info.last_unit = last;
  for (PinnedUnitId k = id; k <= last; ++k) info.retired = info.retired || units[k].retired;
  return info;
}

Result<RegionId> HostArena::register_host(std::byte* ptr, std::uint64_t bytes) {
  Impl& m = *impl_;
  const std::string request = "host arena register_host(" + std::to_string(bytes) + " bytes)";
  if (ptr == nullptr || bytes == 0 || addr(ptr) > UINTPTR_MAX - bytes) {
    return make_error(ErrorCode::invalid_argument, request + ": needs a non-null, non-wrapping range");
  }
  std::lock_guard reg(m.register_mu);
  {
    std::lock_guard lock(m.mu);
    // Overlap with any live unit (chunks included: their memory is ours).
    auto it = m.by_addr.lower_bound(addr(ptr));
    bool overlap = it != m.by_addr.end() && it->first - addr(ptr) < bytes;
    if (!overlap && it != m.by_addr.begin()) {
      --it;
      const Unit& u = m.units[it->second];
      const std::uintptr_t start = u.kind == Unit::Kind::chunk ? addr(u.base) : addr(u.raw);
      const std::uint64_t size = u.kind == Unit::Kind::chunk ? u.bytes : u.raw_bytes;
      overlap = addr(ptr) - start < size;
    }
    if (overlap) {
      return make_error(ErrorCode::invalid_argument,
                        request + ": overlaps a registered region or an arena chunk");
    }
  }
  // Pin in pieces without the arena lock: registering is slow on real drivers.
  Backend& backend = order_.backend();
  const std::uint64_t piece = options_.register_piece_bytes;
  std::vector<std::pair<std::byte*, std::uint64_t>> done;
  for (std::uint64_t off = 0; off < bytes; off += piece) {
    const std::uint64_t len = std::min(piece, bytes - off);
    auto r = backend.register_host(ptr + off, len);
    if (!r.ok()) {
      for (const auto& [p, l] : done) (void)backend.unregister_host(p);
      std::lock_guard lock(m.mu);
      m.st.registrations += done.size();
      m.st.unregistrations += done.size();
      Error e = std::move(r).error();
      e.message = request + ": piece at offset " + std::to_string(off) + ": " + e.message;
      return e;
    }
    done.emplace_back(ptr + off, len);
  }
  std::lock_guard lock(m.mu);
  const RegionId rid = m.next_region++;
  Region region;
  region.ptr = ptr;
  region.bytes = bytes;
  region.first = static_cast<PinnedUnitId>(m.units.size());
  for (const auto& [p, l] : done) {
    Unit u;
    u.kind = Unit::Kind::piece;
    u.raw = p;
    u.raw_bytes = l;
    u.region = rid;
    const auto id = static_cast<PinnedUnitId>(m.units.size());
    m.units.push_back(std::move(u));
    m.by_addr.emplace(addr(p), id);
  }
  region.last = static_cast<PinnedUnitId>(m.units.size() - 1);
  m.regions.emplace(rid, std::move(region));
  m.st.registrations += done.size();
  m.st.registered_bytes += bytes;
  return rid;
}

Result<void> HostArena::unregister_host(RegionId region) {
  Impl& m = *impl_;
  std::lock_guard reg(m.register_mu);
  UseSet uses;
  {
    std::lock_guard lock(m.mu);
    auto it = m.regions.find(region);
    if (it == m.regions.end()) {
      return make_error(ErrorCode::stale_handle,
                        "host arena unregister_host(region " + std::to_string(region) +
                            "): no such region");
    }
    it->second.closing = true;  // refuse new leases from here on
    uses = it->second.uses;
    for (PinnedUnitId k = it->second.first; k <= it->second.last; ++k) {
      uses.merge(m.units[k].canary_uses);
    }
  }
  auto w = order_.wait(uses);
  if (!w.ok()) {
    std::lock_guard lock(m.mu);
    m.regions.at(region).closing = false;
    Error e = std::move(w).error();
    e.message = "host arena unregister_host(region " + std::to_string(region) +
                "): transfers still read it: " + e.message;
    return e;
  }
  std::vector<std::byte*> pieces;
  {
    std::lock_guard lock(m.mu);
    Region& r = m.regions.at(region);
    for (PinnedUnitId k = r.first; k <= r.last; ++k) {
      Unit& u = m.units[k];
      u.released = true;
      m.by_addr.erase(addr(u.raw));
      pieces.push_back(u.raw);
    }
    m.st.registered_bytes -= r.bytes;
    m.st.unregistrations += pieces.size();
    m.regions.erase(region);
  }
  Result<void> result;
  for (std::byte* p : pieces) {
    auto r = order_.backend().unregister_host(p);
    if (!r.ok() && result.ok()) result = std::move(r).error();
  }
  return result;
}

std::optional<HostRangeInfo> HostArena::locate(const std::byte* ptr, std::uint64_t bytes) const {
  std::lock_guard lock(impl_->mu);
  return impl_->locate(ptr, bytes);
}

Result<void> HostArena::lease_source(const std::byte* ptr, std::uint64_t bytes, StreamPoint point) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  auto info = m.locate(ptr, bytes);
  if (!info) {
    return make_error(ErrorCode::stale_handle,
                      "host arena lease of " + std::to_string(bytes) +
                          " bytes: not inside a live block or registered region");
  }
  if (info->kind == HostRangeInfo::Kind::block) {
    m.units[info->block.chunk].blocks.at(info->block.offset).uses.add(point);
  } else {
    m.regions.at(info->region).uses.add(point);
  }
  return {};
}

Result<void> HostArena::lease_unit(PinnedUnitId unit, StreamPoint point) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (unit >= m.units.size() || m.units[unit].released) {
    return make_error(ErrorCode::stale_handle,
                      "host arena: pinned unit " + std::to_string(unit) + " is not live");
  }
  Unit& u = m.units[unit];
  if (u.kind == Unit::Kind::piece && m.regions.at(u.region).closing) {
    return make_error(ErrorCode::stale_handle,
                      "host arena: pinned unit " + std::to_string(unit) + " is being unregistered");
  }
  u.canary_uses.add(point);
  return {};
}

std::optional<CanarySpan> HostArena::canary(PinnedUnitId unit) const {
  Impl& m = *impl_;
  std::lock_guard lock(m.mu);
  if (unit >= m.units.size() || m.units[unit].released) return std::nullopt;
  const Unit& u = m.units[unit];
  CanarySpan span;
  span.data = u.kind == Unit::Kind::chunk ? u.base : u.raw;
  span.bytes = u.kind == Unit::Kind::chunk ? kCanaryBytes : std::min(u.raw_bytes, kCanaryBytes);
  std::memcpy(span.expected.data(), span.data, span.bytes);
  return span;
}

Result<bool> HostArena::retire(PinnedUnitId unit, std::string_view why) {
  Impl& m = *impl_;
  std::vector<std::byte*> release;
  {
    std::lock_guard lock(m.mu);
    if (unit >= m.units.size() || m.units[unit].released) {
      return make_error(ErrorCode::stale_handle,
                        "host arena retire: pinned unit " + std::to_string(unit) + " is not live");
    }
    Unit& u = m.units[unit];
    if (u.retired) return false;
    u.retired = true;
    u.retire_reason = std::string(why);
    ++m.st.retired_units;
    if (u.kind == Unit::Kind::chunk) {
      m.withdraw_free(u);
      m.retired_chunks.push_back(unit);
      m.reclaim(order_, &release);
    }
  }
  for (std::byte* p : release) (void)order_.backend().free_pinned(p);
  return true;
}

bool HostArena::retired(PinnedUnitId unit) const {
  std::lock_guard lock(impl_->mu);
  return unit < impl_->units.size() && impl_->units[unit].retired;
}

}  // namespace ferry
