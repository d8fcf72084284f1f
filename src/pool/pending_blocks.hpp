// ferry — pending blocks (internal): freed blocks whose leases have not retired.
//
// Pure bookkeeping: no locks, no device, no bytes. A block freed while enqueued
// work still touches it (I2) is filed here under its owner's key with its open
// leases (a UseSet the owner keeps); retire() yields the keys whose leases all
// completed, looking only at what can have completed: per stream, a min-heap by
// the one lease's ticket of the blocks leased on that stream alone (the heap tops
// that completed), and, once a stream advanced, the blocks leased on several
// streams. O(log n) to file or remove, O(retired) to retire. The device pool and
// the host arena keep their pending blocks here.
//
// Invariants (validate()):
//   each filed key is on exactly one list: on_[s] when its leases are all on
//   stream s (keyed by that lease's ticket, a min-heap), else multi_
//   an entry's position is its index in its list
//   bit s of streams_  <=>  on_[s] is not empty
//   multi_streams_ holds every stream a lease of a multi_ entry names
// Not thread-safe: the owner serializes.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/stream.hpp"
#include "ferry/stream_order.hpp"

namespace ferry::detail {

template <class Key>
class PendingBlocks {
 public:
  using Id = std::uint32_t;  // a filed key's entry, until it is removed or retires
  static constexpr Id kNone = UINT32_MAX;

  // Nothing is pending (the owner's hot path tests this alone).
  bool empty() const noexcept { return streams_ == 0 && multi_.empty(); }
  std::size_t size() const noexcept { return entries_.size() - spare_.size(); }

  // Files `key`, whose open leases are `uses` (not empty); returns its entry.
  Id file(const Key& key, const UseSet& uses) {
    Id id;
    if (spare_.empty()) {
      id = static_cast<Id>(entries_.size());
      entries_.emplace_back();
    } else {
      id = spare_.back();
      spare_.pop_back();
    }
    entries_[id].key = key;
    entries_[id].filed = true;
    if (auto s = uses.single_stream()) {
      push(*s, id, uses.points()[0].ticket);
    } else {
      put_multi(id, uses);
    }
    return id;
  }

  // Takes entry `id` out before its leases retired (the owner drops or refiles its key).
  void remove(Id id) {
    if (entries_[id].multi) {
      erase_multi(id);
    } else {
      erase(entries_[id].stream, id);
    }
    release(id);
  }

  const Key& key(Id id) const { return entries_[id].key; }

  // Calls retired(key) for each key whose leases all completed, after taking it
  // out; uses_of(key) is the key's UseSet, which retire() prunes of completed points.
  template <class UsesOf, class Retired>
  void retire(StreamOrder& order, UsesOf&& uses_of, Retired&& retired) {
    if (!multi_.empty()) sweep_multi(order, uses_of, retired);
    for (std::uint64_t mask = streams_; mask != 0; mask &= mask - 1) {
      const auto s = static_cast<StreamId>(std::countr_zero(mask));
      auto& h = on_[s];
      while (!h.empty() && order.is_complete({s, entries_[h.front()].ticket})) {
        const Id id = h.front();
        erase(s, id);
        const Key k = entries_[id].key;
        release(id);
        retired(k);
      }
    }
  }

  // Every filed key: the multi-stream ones, then stream by stream.
  template <class F>
  void for_each(F&& f) const {
    for (Id id : multi_) f(entries_[id].key);
    for (const auto& h : on_)
      for (Id id : h) f(entries_[id].key);
  }

  // The invariants above, against each filed key's UseSet (uses_of) and entry
  // (entry_of(key) == its id, as the owner recorded it).
  template <class UsesOf, class EntryOf>
  bool validate(UsesOf&& uses_of, EntryOf&& entry_of, std::string* why = nullptr) const {
    auto fail = [&](const char* what) {
      if (why) *why = what;
      return false;
    };
    std::size_t filed = 0;
    for (std::size_t i = 0; i < multi_.size(); ++i) {
      const Entry& e = entries_[multi_[i]];
      ++filed;
      if (!e.filed || !e.multi || e.pos != i) return fail("pending_multi position wrong");
      if (entry_of(e.key) != multi_[i]) return fail("a pending block's entry is not its own");
      const auto points = uses_of(e.key).points();
      if (points.size() < 2) return fail("a block on pending_multi is leased on one stream");
      for (const StreamPoint& p : points)
        if (!((multi_streams_ >> p.stream) & 1u)) return fail("multi_streams misses a lease's stream");
    }
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      const auto& h = on_[s];
      for (std::size_t i = 0; i < h.size(); ++i) {
        const Entry& e = entries_[h[i]];
        ++filed;
        if (!e.filed || e.multi || e.stream != s || e.pos != i) return fail("pending heap position wrong");
        if (entry_of(e.key) != h[i]) return fail("a pending block's entry is not its own");
        if (i > 0 && earlier(h[i], h[(i - 1) / 2])) return fail("pending heap out of order");
        const auto points = uses_of(e.key).points();
        if (points.size() != 1 || points[0].stream != s || points[0].ticket != e.ticket)
          return fail("block pending on one stream holds a lease on another, or its key is stale");
      }
      if (((streams_ >> s) & 1u) != !h.empty()) return fail("pending_streams mask wrong");
    }
    if (filed != size()) return fail("pending entries and lists disagree");
    return true;
  }

 private:
  struct Entry {
    Key key{};
    Ticket ticket = 0;   // its one lease's ticket, on a stream's heap
    std::uint32_t pos = 0;  // index in on_[stream], or in multi_
    StreamId stream = 0;
    bool multi = false;
    bool filed = false;
  };

  bool earlier(Id a, Id b) const { return entries_[a].ticket < entries_[b].ticket; }
  void put(std::vector<Id>& h, std::size_t i, Id id) {
    h[i] = id;
    entries_[id].pos = static_cast<std::uint32_t>(i);
  }
  void sift_up(std::vector<Id>& h, std::size_t i) {
    const Id id = h[i];
    while (i > 0 && earlier(id, h[(i - 1) / 2])) {
      put(h, i, h[(i - 1) / 2]);
      i = (i - 1) / 2;
    }
    put(h, i, id);
  }
  void sift_down(std::vector<Id>& h, std::size_t i) {
    const Id id = h[i];
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= h.size()) break;
      if (c + 1 < h.size() && earlier(h[c + 1], h[c])) ++c;
      if (!earlier(h[c], id)) break;
      put(h, i, h[c]);
      i = c;
    }
    put(h, i, id);
  }
  void push(StreamId s, Id id, Ticket ticket) {
    Entry& e = entries_[id];
    e.ticket = ticket;
    e.stream = s;
    e.multi = false;
    auto& h = on_[s];
    h.push_back(id);
    sift_up(h, h.size() - 1);
    streams_ |= std::uint64_t{1} << s;
  }
  void erase(StreamId s, Id id) {
    auto& h = on_[s];
    const std::size_t i = entries_[id].pos;
    const Id last = h.back();
    h.pop_back();
    if (i < h.size()) {
      put(h, i, last);
      sift_up(h, i);
      sift_down(h, entries_[last].pos);
    }
    if (h.empty()) streams_ &= ~(std::uint64_t{1} << s);
  }
  void put_multi(Id id, const UseSet& uses) {
    entries_[id].multi = true;
    entries_[id].pos = static_cast<std::uint32_t>(multi_.size());
    multi_.push_back(id);
    for (const StreamPoint& p : uses.points()) multi_streams_ |= std::uint64_t{1} << p.stream;
  }
  void erase_multi(Id id) {
    const std::uint32_t i = entries_[id].pos;
    const Id last = multi_.back();
    multi_[i] = last;
    entries_[last].pos = i;
    multi_.pop_back();
  }
  void release(Id id) {
    entries_[id].filed = false;
    spare_.push_back(id);
  }

  // The multi-stream entries, once a stream they name advanced: those whose leases
  // all retired go; those narrowed to one stream move to its heap.
  template <class UsesOf, class Retired>
  void sweep_multi(StreamOrder& order, UsesOf& uses_of, Retired& retired) {
    bool advanced = false;
    for (std::uint64_t mask = multi_streams_; mask != 0; mask &= mask - 1) {
      const auto s = static_cast<StreamId>(std::countr_zero(mask));
      const Ticket c = order.completed(s);
      advanced |= c != seen_[s];
      seen_[s] = c;
    }
    // Nothing completed since the last sweep: no entry here can have retired.
    if (!advanced) return;
    multi_streams_ = 0;
    for (std::size_t i = 0; i < multi_.size();) {
      const Id id = multi_[i];
      UseSet& uses = uses_of(entries_[id].key);
      if (uses.retire(order)) {
        erase_multi(id);
        const Key k = entries_[id].key;
        release(id);
        retired(k);
        continue;
      }
      if (auto s = uses.single_stream()) {
        erase_multi(id);
        push(*s, id, uses.points()[0].ticket);
        continue;
      }
      for (const StreamPoint& p : uses.points()) multi_streams_ |= std::uint64_t{1} << p.stream;
      ++i;
    }
  }

  std::vector<Entry> entries_;  // by Id
  std::vector<Id> spare_;       // entries not filed
  std::array<std::vector<Id>, kMaxStreams> on_;
  std::vector<Id> multi_;
  std::uint64_t streams_ = 0;        // bit s set  <=>  !on_[s].empty()
  std::uint64_t multi_streams_ = 0;  // streams the leases of multi_ name (a superset)
  std::array<Ticket, kMaxStreams> seen_{};  // completion seen at multi_'s last sweep
};

}  // namespace ferry::detail
