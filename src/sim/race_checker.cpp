#include "sim/race_checker.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "ferry/op_contract.hpp"

namespace ferry::sim {

std::uint32_t RaceChecker::add_device() {
  std::lock_guard lock(mu_);
  devices_.emplace_back();
  return static_cast<std::uint32_t>(devices_.size() - 1);
}

RaceLog RaceChecker::log() const {
  std::lock_guard lock(mu_);
  return log_;
}

bool RaceChecker::join(Clock& c, const Clock& other) {
  if (c.size() < other.size()) c.resize(other.size(), 0);
  bool grew = false;
  for (std::size_t i = 0; i < other.size(); ++i) {
    if (other[i] > c[i]) {
      c[i] = other[i];
      grew = true;
    }
  }
  return grew;
}

RaceChecker::Clock RaceChecker::clock_of(std::uint32_t device, StreamPoint p) const {
  const std::vector<Segment>& segs = devices_[device].segments[p.stream];
  // The last segment that starts at or before the ticket.
  auto it = std::upper_bound(segs.begin(), segs.end(), p.ticket,
                             [](Ticket t, const Segment& s) { return t < s.from; });
  Clock c;
  if (it != segs.begin()) c = std::prev(it)->clock;
  const std::size_t own = slot(device, p.stream);
  if (c.size() <= own) c.resize(own + 1, 0);
  c[own] = std::max(c[own], p.ticket);
  return c;
}

void RaceChecker::issue(std::uint32_t device, StreamId stream, Ticket ticket, const Op& op, const PeerSide* peer) {
  std::lock_guard lock(mu_);
  Device& dev = devices_[device];
  Clock clock = clock_of(device, {stream, ticket - 1});
  bool joined = dev.segments[stream].empty();
  joined |= join(clock, host_);  // enqueued after whatever the host has seen complete
  if (const auto* w = std::get_if<WaitOp>(&op)) joined |= join(clock, clock_of(device, w->point));
  if (peer != nullptr && std::holds_alternative<NativeWaitOp>(op)) joined |= join(clock, clock_of(peer->device, peer->point));
  clock[slot(device, stream)] = ticket;
  if (joined) dev.segments[stream].push_back({ticket, clock});

  Side side;
  side.device = device;
  side.op = {stream, ticket};
  side.kind = op_name(op);
  if (const auto* u = std::get_if<UserOp>(&op)) side.tag = u->tag;
  for_each_device_range(op, [&](const DeviceOperand& d) {
    if (d.bytes == 0) return;
    side.access = d.access;
    access(dev.shadow, &dev.owners, side, clock, d.addr, d.bytes);
  });
  for_each_host_range(op, [&](const HostOperand& h) {
    if (h.bytes == 0) return;
    side.access = h.access;
    access(host_shadow_, nullptr, side, clock, reinterpret_cast<std::uintptr_t>(h.ptr), h.bytes);
  });
  // A peer copy's source is the peer's bytes, read on this device's stream.
  if (const auto* p = std::get_if<PeerCopyOp>(&op); p != nullptr && peer != nullptr && p->dst.bytes > 0) {
    side.access = Access::read;
    Device& src = devices_[peer->device];
    access(src.shadow, &src.owners, side, clock, p->src_addr, p->dst.bytes);
  }
}

void RaceChecker::host_waited(std::uint32_t device, StreamPoint point) {
  std::lock_guard lock(mu_);
  host_waited_locked(device, point);
}

void RaceChecker::host_waited_locked(std::uint32_t device, StreamPoint point) {
  join(host_, clock_of(device, point));
}

void RaceChecker::host_synchronized(std::uint32_t device, const std::array<Ticket, kMaxStreams>& issued) {
  std::lock_guard lock(mu_);
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    if (issued[s] > 0) host_waited_locked(device, {s, issued[s]});
  }
}

void RaceChecker::block(std::uint32_t device, std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
                        std::string_view tag) {
  if (bytes == 0) return;
  std::lock_guard lock(mu_);
  std::map<std::uint64_t, Owner>& owners = devices_[device].owners;
  const std::uint64_t end = addr + bytes;
  // Naming the same allocation again (a tag) renames it; a new one takes the bytes.
  auto same = owners.find(addr);
  if (same != owners.end() && same->second.end == end && same->second.block != kNoBlock &&
      blocks_[same->second.block].handle == handle) {
    blocks_[same->second.block].tag = std::string(tag);
    return;
  }
  // Cut the ranges that overlap [addr, end) to what lies outside it.
  auto it = owners.lower_bound(addr);
  if (it != owners.begin() && std::prev(it)->second.end > addr) --it;
  while (it != owners.end() && it->first < end) {
    const std::uint64_t lo = it->first;
    const Owner o = it->second;
    it = owners.erase(it);
    if (lo < addr) owners.emplace(lo, Owner{addr, o.block});
    if (o.end > end) it = owners.emplace(end, Owner{o.end, o.block}).first;
  }
  blocks_.push_back(RaceBlock{handle, std::string(tag)});
  owners.emplace(addr, Owner{end, static_cast<std::uint32_t>(blocks_.size() - 1)});
}

std::uint32_t RaceChecker::block_at(const std::map<std::uint64_t, Owner>& owners, std::uint64_t addr) {
  auto it = owners.upper_bound(addr);
  if (it == owners.begin()) return kNoBlock;
  --it;
  return addr < it->second.end ? it->second.block : kNoBlock;
}

void RaceChecker::split_at(ShadowMap& shadow, std::uint64_t addr) {
  auto it = shadow.upper_bound(addr);
  if (it == shadow.begin()) return;
  --it;
  if (it->first == addr || it->second.end <= addr) return;
  Shadow right = it->second;
  it->second.end = addr;
  shadow.emplace(addr, std::move(right));
}

void RaceChecker::host_access(const std::byte* ptr, std::uint64_t bytes, Access access) {
  if (bytes == 0) return;
  std::lock_guard lock(mu_);
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uint64_t hi = lo + bytes;
  const Side host{0, {kHostSide, 0}, "host", access, {}};
  // The host's own later enqueues are ordered after this access (program order),
  // so only copies already issued can race with it, and nothing is recorded.
  auto it = host_shadow_.upper_bound(lo);
  if (it != host_shadow_.begin() && std::prev(it)->second.end > lo) --it;
  for (; it != host_shadow_.end() && it->first < hi; ++it) {
    const Shadow& sh = it->second;
    const std::uint64_t a = std::max<std::uint64_t>(it->first, lo), b = std::min(sh.end, hi);
    if (sh.write && !ordered(*sh.write, host_)) report(*sh.write, host, a, b - a);
    if (writes(access)) {
      for (const Side& r : sh.reads) {
        if (!ordered(r, host_)) report(r, host, a, b - a);
      }
    }
  }
}

void RaceChecker::access(ShadowMap& shadow, const std::map<std::uint64_t, Owner>* owners, const Side& side,
                         const Clock& clock, std::uint64_t addr, std::uint64_t bytes) {
  const std::uint64_t end = addr + bytes;
  split_at(shadow, addr);
  split_at(shadow, end);
  // Fill the gaps with empty ranges, so that every byte of [addr, end) has one.
  std::uint64_t at = addr;
  for (auto it = shadow.lower_bound(addr); at < end;) {
    const std::uint64_t next = it == shadow.end() ? end : std::min(end, it->first);
    if (at < next) {
      it = shadow.emplace_hint(it, at, Shadow{next, std::nullopt, {}});
    }
    at = it->second.end;
    ++it;
  }
  struct Found {
    Side earlier;
    std::uint64_t lo, hi;
    std::uint32_t block;  // this access's block at lo
  };
  std::vector<Found> found;  // one per earlier op: its overlap with this access
  Side here = side;
  const auto conflict = [&](const Side& earlier, std::uint64_t lo, std::uint64_t hi) {
    if ((earlier.device == side.device && earlier.op.stream == side.op.stream) || ordered(earlier, clock)) return;
    for (Found& f : found) {
      if (f.earlier.device == earlier.device && f.earlier.op == earlier.op) {
        if (lo < f.lo) f.block = here.block;
        f.lo = std::min(f.lo, lo);
        f.hi = std::max(f.hi, hi);
        return;
      }
    }
    found.push_back({earlier, lo, hi, here.block});
  };
  for (auto it = shadow.lower_bound(addr); it != shadow.end() && it->first < end; ++it) {
    Shadow& sh = it->second;
    if (owners != nullptr) here.block = block_at(*owners, it->first);  // device bytes belong to pool blocks
    if (sh.write) conflict(*sh.write, it->first, sh.end);
    if (writes(side.access)) {
      for (const Side& r : sh.reads) conflict(r, it->first, sh.end);
      sh.write = here;
      sh.reads.clear();
      if (reads(side.access)) sh.reads.push_back(here);
    } else {
      auto same = std::find_if(sh.reads.begin(), sh.reads.end(),
                               [&](const Side& r) { return r.device == side.device && r.op.stream == side.op.stream; });
      if (same != sh.reads.end()) *same = here;
      else sh.reads.push_back(here);
    }
  }
  for (const Found& f : found) {
    Side later = side;
    later.block = f.block;
    report(f.earlier, later, f.lo, f.hi - f.lo);
  }
  // Neighbours left equal after the split are merged again, so the shadow stays
  // as small as the pattern of accesses.
  auto it = shadow.lower_bound(addr);
  if (it != shadow.begin()) --it;
  while (it != shadow.end() && it->first < end) {
    auto next = std::next(it);
    if (next == shadow.end() || next->first != it->second.end) {
      it = next;
      continue;
    }
    const Shadow& a = it->second;
    const Shadow& b = next->second;
    const auto same_side = [](const std::optional<Side>& x, const std::optional<Side>& y) {
      return x.has_value() == y.has_value() &&
             (!x || (x->device == y->device && x->op == y->op && x->access == y->access && x->block == y->block));
    };
    bool same = same_side(a.write, b.write) && a.reads.size() == b.reads.size();
    for (std::size_t i = 0; same && i < a.reads.size(); ++i) {
      same = a.reads[i].device == b.reads[i].device && a.reads[i].op == b.reads[i].op &&
             a.reads[i].block == b.reads[i].block;
    }
    if (!same) {
      it = next;
      continue;
    }
    it->second.end = next->second.end;
    shadow.erase(next);
  }
}

void RaceChecker::report(const Side& earlier, const Side& later, std::uint64_t addr, std::uint64_t bytes) {
  const auto same = [](const RaceAccess& a, const Side& s) { return a.device == s.device && a.op == s.op; };
  for (Race& r : log_.kept) {
    if (same(r.earlier, earlier) && same(r.later, later)) {
      const std::uint64_t hi = std::max(r.addr + r.bytes, addr + bytes);
      r.addr = std::min(r.addr, addr);
      r.bytes = hi - r.addr;
      return;
    }
  }
  ++log_.count;
  if (log_.kept.size() >= keep_) return;
  const auto to_access = [&](const Side& s) {
    RaceAccess a{s.op, s.kind, s.tag, s.access, {}, s.device};
    if (s.block != kNoBlock) a.block = blocks_[s.block];
    return a;
  };
  const bool reuse = earlier.block != kNoBlock && later.block != kNoBlock && earlier.block != later.block;
  log_.kept.push_back(Race{to_access(earlier), to_access(later), addr, bytes, reuse});
}

}  // namespace ferry::sim
