#include "sim/race_checker.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "ferry/op_contract.hpp"

namespace ferry::sim {

RaceChecker::Clock RaceChecker::clock_of(StreamPoint p) const {
  const std::vector<Segment>& segs = segments_[p.stream];
  // The last segment that starts at or before the ticket.
  auto it = std::upper_bound(segs.begin(), segs.end(), p.ticket,
                             [](Ticket t, const Segment& s) { return t < s.from; });
  Clock c{};
  if (it != segs.begin()) c = std::prev(it)->clock;
  c[p.stream] = std::max(c[p.stream], p.ticket);
  return c;
}

void RaceChecker::issue(StreamId stream, Ticket ticket, const Op& op) {
  Clock clock = clock_of({stream, ticket - 1});
  bool joined = segments_[stream].empty();
  const auto join = [&](const Clock& other) {
    for (StreamId u = 0; u < kMaxStreams; ++u) {
      if (other[u] > clock[u]) {
        clock[u] = other[u];
        joined = true;
      }
    }
  };
  join(host_);  // enqueued after whatever the host has seen complete
  if (const auto* w = std::get_if<WaitOp>(&op)) join(clock_of(w->point));
  clock[stream] = ticket;
  if (joined) segments_[stream].push_back({ticket, clock});

  Side side;
  side.op = {stream, ticket};
  side.kind = op_name(op);
  if (const auto* u = std::get_if<UserOp>(&op)) side.tag = u->tag;
  for_each_device_range(op, [&](const DeviceOperand& d) {
    if (d.bytes == 0) return;
    side.access = d.access;
    access(shadow_, side, clock, d.addr, d.bytes);
  });
  for_each_host_range(op, [&](const HostOperand& h) {
    if (h.bytes == 0) return;
    side.access = h.access;
    access(host_shadow_, side, clock, reinterpret_cast<std::uintptr_t>(h.ptr), h.bytes);
  });
}

void RaceChecker::host_waited(StreamPoint point) {
  const Clock c = clock_of(point);
  for (StreamId u = 0; u < kMaxStreams; ++u) host_[u] = std::max(host_[u], c[u]);
}

void RaceChecker::host_synchronized(const std::array<Ticket, kMaxStreams>& issued) {
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    if (issued[s] > 0) host_waited({s, issued[s]});
  }
}

void RaceChecker::block(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
                        std::string_view tag) {
  if (bytes == 0) return;
  const std::uint64_t end = addr + bytes;
  // Naming the same allocation again (a tag) renames it; a new one takes the bytes.
  auto same = owners_.find(addr);
  if (same != owners_.end() && same->second.end == end && same->second.block != kNoBlock &&
      blocks_[same->second.block].handle == handle) {
    blocks_[same->second.block].tag = std::string(tag);
    return;
  }
  // Cut the ranges that overlap [addr, end) to what lies outside it.
  auto it = owners_.lower_bound(addr);
  if (it != owners_.begin() && std::prev(it)->second.end > addr) --it;
  while (it != owners_.end() && it->first < end) {
    const std::uint64_t lo = it->first;
    const Owner o = it->second;
    it = owners_.erase(it);
    if (lo < addr) owners_.emplace(lo, Owner{addr, o.block});
    if (o.end > end) it = owners_.emplace(end, Owner{o.end, o.block}).first;
  }
  blocks_.push_back(RaceBlock{handle, std::string(tag)});
  owners_.emplace(addr, Owner{end, static_cast<std::uint32_t>(blocks_.size() - 1)});
}

std::uint32_t RaceChecker::block_at(std::uint64_t addr) const {
  auto it = owners_.upper_bound(addr);
  if (it == owners_.begin()) return kNoBlock;
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
  const auto lo = reinterpret_cast<std::uintptr_t>(ptr);
  const std::uint64_t hi = lo + bytes;
  const Side host{{kHostSide, 0}, "host", access, {}};
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

void RaceChecker::access(ShadowMap& shadow, const Side& side, const Clock& clock, std::uint64_t addr,
                         std::uint64_t bytes) {
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
  const bool named = &shadow == &shadow_;  // device bytes belong to pool blocks
  Side here = side;
  const auto conflict = [&](const Side& earlier, std::uint64_t lo, std::uint64_t hi) {
    if (earlier.op.stream == side.op.stream || ordered(earlier, clock)) return;
    for (Found& f : found) {
      if (f.earlier.op == earlier.op) {
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
    if (named) here.block = block_at(it->first);
    if (sh.write) conflict(*sh.write, it->first, sh.end);
    if (writes(side.access)) {
      for (const Side& r : sh.reads) conflict(r, it->first, sh.end);
      sh.write = here;
      sh.reads.clear();
      if (reads(side.access)) sh.reads.push_back(here);
    } else {
      auto same = std::find_if(sh.reads.begin(), sh.reads.end(),
                               [&](const Side& r) { return r.op.stream == side.op.stream; });
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
             (!x || (x->op == y->op && x->access == y->access && x->block == y->block));
    };
    bool same = same_side(a.write, b.write) && a.reads.size() == b.reads.size();
    for (std::size_t i = 0; same && i < a.reads.size(); ++i) {
      same = a.reads[i].op == b.reads[i].op && a.reads[i].block == b.reads[i].block;
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
  for (Race& r : log_->kept) {
    if (r.earlier.op == earlier.op && r.later.op == later.op) {
      const std::uint64_t hi = std::max(r.addr + r.bytes, addr + bytes);
      r.addr = std::min(r.addr, addr);
      r.bytes = hi - r.addr;
      return;
    }
  }
  ++log_->count;
  if (log_->kept.size() >= keep_) return;
  const auto to_access = [&](const Side& s) {
    RaceAccess a{s.op, s.kind, s.tag, s.access, {}};
    if (s.block != kNoBlock) a.block = blocks_[s.block];
    return a;
  };
  const bool reuse = earlier.block != kNoBlock && later.block != kNoBlock && earlier.block != later.block;
  log_->kept.push_back(Race{to_access(earlier), to_access(later), addr, bytes, reuse});
}

}  // namespace ferry::sim
