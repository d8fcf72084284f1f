#include "ferry/offload_cache.hpp"

#include "core/align.hpp"
#include "core/invariant.hpp"
#include "core/testing_hooks.hpp"
#include "ferry/names.hpp"
#include "ferry/validation.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "ferry/transfer_engine.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kPieceAlign = detail::kBlockAlign;  // pieces start block-aligned inside a slot
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();

std::string key_text(CacheKey key) { return "cache entry " + std::to_string(key); }

constexpr std::array<NamedValue<EvictionPolicy>, 3> kEvictionPolicies{{
    {EvictionPolicy::lru, "lru"},
    {EvictionPolicy::lfu, "lfu"},
    {EvictionPolicy::optimal, "optimal"},
}};

}  // namespace

std::string_view to_string(EvictionPolicy policy) noexcept {
  return name_in<EvictionPolicy>(kEvictionPolicies, policy);
}
Result<EvictionPolicy> parse_eviction_policy(std::string_view text) {
  return value_in<EvictionPolicy>(kEvictionPolicies, text, "eviction policy");
}

namespace {

// With heavy validation on (validation.hpp), the bookkeeping is checked after
// every mutating call.
void check(const OffloadCache& cache) {
  detail::check_invariants(heavy_validation_default(), "OffloadCache",
                           [&](std::string* why) { return cache.validate(why); });
}

}  // namespace

struct OffloadCache::Impl {
  // absent -> filling -> resident            (demand fetch, by one thread)
  // absent -> filling -> loading -> finishing -> resident   (prefetch, then first acquire)
  // Threads that find an entry filling or finishing wait on `changed`.
  enum class State : std::uint8_t { absent, filling, loading, finishing, resident };

  struct Entry {
    std::vector<std::span<const std::byte>> pieces;
    std::vector<std::uint64_t> offsets;
    std::uint64_t bytes = 0;
    State state = State::absent;
    DeviceHandle slot{};
    std::optional<PendingUpload> pending;  // while loading
    StreamPoint ready{};                   // the upload's last operation
    std::uint32_t pins = 0;
    std::uint64_t last_use = 0;
    std::uint64_t uses = 0;                // acquires ever (LFU)
    bool fresh_prefetch = false;           // brought in by a prefetch, not acquired since
  };

  // What eviction took out of the map; released outside the lock.
  struct Evicted {
    DeviceHandle slot{};
    std::optional<PendingUpload> pending;
  };

  TransferEngine& engine;
  DevicePool& pool;
  CacheOptions options;
  Result<void> status;

  mutable std::mutex mu;  // guards everything below; never held across pool/engine calls
  std::condition_variable changed;
  std::unordered_map<CacheKey, Entry> entries;
  std::uint32_t occupied = 0;  // entries not absent
  std::uint64_t slot_bytes = 0;
  bool slot_fixed = false;
  std::uint64_t tick = 0;
  CacheStats st;
  bool has_plan = false;
  std::vector<CacheKey> plan;
  std::unordered_map<CacheKey, std::vector<std::uint64_t>> positions;  // key -> plan indices
  std::uint64_t cursor = 0;  // plan entries consumed

  Impl(TransferEngine& e, CacheOptions o) : engine(e), pool(e.pool()), options(o) {
    if (options.slots == 0) {
      status = make_error(ErrorCode::invalid_argument, "offload cache: slots must be >= 1");
    } else if (Result<void> up = check_stream(options.upload_stream, "offload cache: upload_stream"); !up.ok()) {
      status = std::move(up).error();
    } else if (Result<void> pre = check_stream(options.prefetch_stream, "offload cache: prefetch_stream"); !pre.ok()) {
      status = std::move(pre).error();
    } else if (!engine.status().ok()) {
      status = engine.status().error();
    }
    if (options.slot_bytes != 0) {
      slot_bytes = options.slot_bytes;
      slot_fixed = true;
    }
  }

  std::uint64_t next_use(CacheKey key) const {
    auto it = positions.find(key);
    if (it == positions.end()) return kNever;
    auto pos = std::lower_bound(it->second.begin(), it->second.end(), cursor);
    return pos == it->second.end() ? kNever : *pos;
  }

  void consume_plan(CacheKey key) {
    if (!has_plan) return;
    if (cursor < plan.size() && plan[cursor] == key) {
      ++cursor;
      return;
    }
    auto it = positions.find(key);
    if (it == positions.end()) return;
    auto pos = std::lower_bound(it->second.begin(), it->second.end(), cursor);
    if (pos != it->second.end()) cursor = *pos + 1;
  }

  // True when `a` should be evicted before `b`.
  bool worse(const Entry& a, CacheKey ka, const Entry& b, CacheKey kb) const {
    switch (options.policy) {
      case EvictionPolicy::lru: return a.last_use < b.last_use;
      case EvictionPolicy::lfu:
        return a.uses != b.uses ? a.uses < b.uses : a.last_use < b.last_use;
      case EvictionPolicy::optimal: {
        const std::uint64_t na = next_use(ka), nb = next_use(kb);
        return na != nb ? na > nb : a.last_use < b.last_use;
      }
    }
    return false;
  }

  // The entry to evict for `incoming`, or null. See the header for the rules.
  std::optional<CacheKey> choose_victim(CacheKey incoming, bool for_prefetch) const {
    std::optional<CacheKey> best;
    const Entry* best_entry = nullptr;
    for (int tier = 0; tier < (for_prefetch ? 1 : 2) && !best; ++tier) {
      for (const auto& [k, e] : entries) {
        if (k == incoming) continue;
        const bool eligible =
            tier == 0 ? e.state == State::resident && e.pins == 0 && !(for_prefetch && e.fresh_prefetch)
                      : e.state == State::loading;
        if (!eligible) continue;
        if (best_entry == nullptr || worse(e, k, *best_entry, *best)) {
          best = k;
          best_entry = &e;
        }
      }
    }
    if (best && for_prefetch && options.policy == EvictionPolicy::optimal &&
        next_use(*best) <= next_use(incoming)) {
      return std::nullopt;  // Belady: never trade an entry needed sooner
    }
    return best;
  }

  // Takes `victim` out (its slot handle and pending upload go to the caller).
  Evicted evict_locked(CacheKey victim) {
    Entry& v = entries.at(victim);
    Evicted out;
    out.slot = v.slot;
    if (v.pending) {
      out.pending = std::move(v.pending);
      v.pending.reset();
    }
    if (v.fresh_prefetch) ++st.prefetch_wasted;
    v.fresh_prefetch = false;
    v.state = State::absent;
    v.slot = {};
    v.ready = {};
    ++st.evictions;
    return out;
  }

  // Stream-ordered free: queued work that still reads the slot keeps it (I2).
  void drop(Evicted&& ev) {
    ev.pending.reset();  // safe unfinished: the engine keeps what the device still uses
    if (ev.slot != DeviceHandle{}) (void)pool.free(ev.slot);
  }

  // Claims a slot for `key` (free, or by evicting). Caller holds the lock.
  // Returns false when no slot can be had.
  bool claim_slot_locked(CacheKey key, bool for_prefetch, Evicted* evicted) {
    if (occupied < options.slots) {
      ++occupied;
      return true;
    }
    auto victim = choose_victim(key, for_prefetch);
    if (!victim) return false;
    *evicted = evict_locked(*victim);
    return true;  // occupied unchanged: one out, one in
  }

  void fix_slot_bytes_locked() {
    if (slot_fixed) return;
    for (const auto& [k, e] : entries) slot_bytes = std::max(slot_bytes, e.bytes);
    slot_fixed = true;
  }

  TransferPlan plan_for(const Entry& e, DeviceHandle slot) const {
    TransferPlan p;
    for (std::size_t i = 0; i < e.pieces.size(); ++i) p.add(e.pieces[i].data(), slot, e.offsets[i], e.pieces[i].size());
    return p;
  }

  Result<StreamPoint> upload(const Entry& e, DeviceHandle slot) {
    Result<TransferReceipt> up = engine.upload(options.upload_stream, plan_for(e, slot));
    if (!up.ok()) return std::move(up).error();
    return up->done;
  }

  // The entry failed to load: give its slot back.
  void abandon(CacheKey key, DeviceHandle slot) {
    if (slot != DeviceHandle{}) (void)pool.free(slot);
    std::lock_guard lock(mu);
    Entry& e = entries.at(key);
    e.state = State::absent;
    e.slot = {};
    e.pending.reset();
    e.fresh_prefetch = false;
    --occupied;
    changed.notify_all();
  }

  CacheRef make_ref(CacheKey key, const Entry& e, bool hit, bool prefetched) const {
    CacheRef ref;
    ref.key = key;
    ref.slot = e.slot;
    ref.hit = hit;
    ref.prefetched = prefetched;
    for (std::size_t i = 0; i < e.pieces.size(); ++i) {
      ref.pieces.push_back(DeviceSlice{e.slot, e.offsets[i], e.pieces[i].size()});
    }
    return ref;
  }

  // Orders `stream` after the entry's upload. Called without the lock, on a
  // pinned entry (so the slot cannot change).
  Result<void> order_after(DeviceHandle slot, StreamPoint ready, StreamId stream) {
    FERRY_TRY(pool.make_ready(slot, stream));
    if (testing_hooks::dropped(testing_hooks::WaitSite::cache_fetch)) return {};
    Result<Ticket> t = pool.order().order_after(stream, ready);
    if (!t.ok()) return std::move(t).error();
    return {};
  }

  void unpin(CacheKey key) {
    std::lock_guard lock(mu);
    Entry& e = entries.at(key);
    if (e.pins > 0) --e.pins;
  }

  // acquire(), acquire_filled() and acquire_if_resident(): `fetch` says whether a
  // miss fetches, `fill` (when set) how.
  Result<std::optional<CacheRef>> acquire(CacheKey key, StreamId use_stream, bool fetch,
                                          const OffloadCache::SlotFill* fill = nullptr) {
    FERRY_TRY(status);
    FERRY_TRY(check_stream(use_stream, "acquire " + key_text(key)));
    std::unique_lock lock(mu);
    auto it = entries.find(key);
    if (it == entries.end()) {
      return make_error(ErrorCode::invalid_argument, "acquire: " + key_text(key) + " was never defined");
    }
    if (options.policy == EvictionPolicy::optimal && !has_plan) {
      return make_error(ErrorCode::invalid_argument,
                        "acquire " + key_text(key) + ": the optimal policy needs set_access_plan() first");
    }
    Entry& e = it->second;
    consume_plan(key);
    ++e.uses;
    e.last_use = ++tick;
    bool counted = false, hit = false, prefetched = false;
    for (;;) {
      switch (e.state) {
        case State::resident: {
          if (!counted) {
            ++st.hits;
            hit = true;
            prefetched = e.fresh_prefetch;
            if (prefetched) ++st.prefetch_hits;
          }
          e.fresh_prefetch = false;
          ++e.pins;
          CacheRef ref = make_ref(key, e, hit, prefetched);
          const StreamPoint ready = e.ready;
          lock.unlock();
          if (Result<void> r = order_after(ref.slot, ready, use_stream); !r.ok()) {
            unpin(key);
            return std::move(r).error();
          }
          return std::optional<CacheRef>(std::move(ref));
        }
        case State::loading: {
          if (!counted) {
            ++st.hits;
            ++st.prefetch_hits;
            hit = prefetched = counted = true;
          }
          ++st.waited_uploads;
          PendingUpload pending = std::move(*e.pending);
          e.pending.reset();
          e.state = State::finishing;
          e.fresh_prefetch = false;
          const DeviceHandle slot = e.slot;
          lock.unlock();
          Result<TransferReceipt> done = engine.finish(std::move(pending));
          if (!done.ok()) {
            abandon(key, slot);
            return std::move(done).error();
          }
          lock.lock();
          e.ready = done->done;
          e.state = State::resident;
          changed.notify_all();
          continue;
        }
        case State::filling:
        case State::finishing:
          changed.wait(lock);  // another thread is loading it; bounded by its upload
          continue;
        case State::absent: {
          if (!counted) {
            ++st.misses;
            counted = true;
          }
          if (!fetch) return std::optional<CacheRef>();
          FERRY_TRY(fetch_locked(key, e, lock, fill));
          continue;
        }
      }
    }
  }

  // acquire()'s miss: claims a slot (evicting), then allocates and fills it
  // without the lock. On success the lock is held again and the entry resident;
  // on an error the lock may be released.
  Result<void> fetch_locked(CacheKey key, Entry& e, std::unique_lock<std::mutex>& lock,
                            const OffloadCache::SlotFill* fill) {
    fix_slot_bytes_locked();
    Evicted evicted;
    if (!claim_slot_locked(key, /*for_prefetch=*/false, &evicted)) {
      return make_error(ErrorCode::out_of_memory,
                        "acquire " + key_text(key) + ": every one of the " +
                            std::to_string(options.slots) + " cache slots is pinned or loading");
    }
    e.state = State::filling;
    const std::uint64_t bytes = slot_bytes;
    lock.unlock();
    drop(std::move(evicted));
    Result<DeviceHandle> slot = pool.allocate(bytes, options.upload_stream);
    if (!slot.ok()) {
      abandon(key, {});
      Error err = std::move(slot).error();
      err.message = "acquire " + key_text(key) + ": slot of " + std::to_string(bytes) + " bytes: " + err.message;
      return err;
    }
    Result<StreamPoint> done = fill != nullptr ? (*fill)(*slot, options.upload_stream) : upload(e, *slot);
    if (!done.ok()) {
      abandon(key, *slot);
      Error err = std::move(done).error();
      err.message = "acquire " + key_text(key) + ": " + err.message;
      return err;
    }
    lock.lock();
    e.slot = *slot;
    e.ready = *done;
    e.state = State::resident;
    e.fresh_prefetch = false;
    if (fill != nullptr) {
      ++st.fills;
      st.bytes_filled += e.bytes;
    } else {
      ++st.uploads;
      st.bytes_uploaded += e.bytes;
    }
    changed.notify_all();
    return {};
  }
};

OffloadCache::OffloadCache(TransferEngine& engine, CacheOptions options)
    : impl_(std::make_unique<Impl>(engine, options)) {}

OffloadCache::~OffloadCache() {
  std::vector<Impl::Evicted> all;
  {
    std::lock_guard lock(impl_->mu);
    for (auto& [k, e] : impl_->entries) {
      if (e.state == Impl::State::absent) continue;
      Impl::Evicted ev;
      ev.slot = e.slot;
      if (e.pending) ev.pending = std::move(e.pending);
      all.push_back(std::move(ev));
      e.state = Impl::State::absent;
    }
  }
  for (auto& ev : all) impl_->drop(std::move(ev));
}

const Result<void>& OffloadCache::status() const noexcept { return impl_->status; }
const CacheOptions& OffloadCache::options() const noexcept { return impl_->options; }

Result<void> OffloadCache::define(CacheKey key, std::vector<std::span<const std::byte>> pieces) {
  Impl& p = *impl_;
  if (pieces.empty()) {
    return make_error(ErrorCode::invalid_argument, "define " + key_text(key) + ": no pieces");
  }
  Impl::Entry e;
  std::uint64_t offset = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].empty() || pieces[i].data() == nullptr) {
      return make_error(ErrorCode::invalid_argument,
                        "define " + key_text(key) + ": piece " + std::to_string(i) + " is empty");
    }
    // Sizes past 2^64 would wrap into a small entry: refused here, before any slot is sized by it.
    const std::optional<std::uint64_t> at = detail::checked_align_up(offset, kPieceAlign);
    if (!at || pieces[i].size() > UINT64_MAX - *at) {
      return make_error(ErrorCode::invalid_argument,
                        "define " + key_text(key) + ": the pieces' sizes sum past 2^64 bytes at piece " +
                            std::to_string(i));
    }
    offset = *at;
    e.offsets.push_back(offset);
    offset += pieces[i].size();
  }
  e.bytes = offset;
  // Slots are sized by the largest entry (slot_bytes 0): one larger than the pool
  // would make every later acquire out_of_memory, small entries included.
  if (e.bytes > p.pool.capacity()) {
    return make_error(ErrorCode::invalid_argument,
                      "define " + key_text(key) + ": " + std::to_string(e.bytes) +
                          " bytes are larger than the device pool's capacity of " +
                          std::to_string(p.pool.capacity()) + " bytes");
  }
  e.pieces = std::move(pieces);
  std::lock_guard lock(p.mu);
  if (p.entries.count(key) != 0) {
    return make_error(ErrorCode::invalid_argument, "define " + key_text(key) + ": already defined");
  }
  if (p.slot_fixed && e.bytes > p.slot_bytes) {
    return make_error(ErrorCode::invalid_argument,
                      "define " + key_text(key) + ": " + std::to_string(e.bytes) +
                          " bytes do not fit a slot of " + std::to_string(p.slot_bytes) + " bytes");
  }
  p.entries.emplace(key, std::move(e));
  return {};
}

void OffloadCache::set_access_plan(std::vector<CacheKey> plan) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.positions.clear();
  for (std::uint64_t i = 0; i < plan.size(); ++i) p.positions[plan[i]].push_back(i);
  p.plan = std::move(plan);
  p.cursor = 0;
  p.has_plan = true;
}

Result<CacheRef> OffloadCache::acquire(CacheKey key, StreamId use_stream) {
  Result<std::optional<CacheRef>> r = impl_->acquire(key, use_stream, /*fetch=*/true);
  check(*this);
  if (!r.ok()) return std::move(r).error();
  return std::move(**r);
}

Result<CacheRef> OffloadCache::acquire_filled(CacheKey key, StreamId use_stream, const SlotFill& fill) {
  Result<std::optional<CacheRef>> r = impl_->acquire(key, use_stream, /*fetch=*/true, &fill);
  check(*this);
  if (!r.ok()) return std::move(r).error();
  return std::move(**r);
}

Result<std::optional<CacheRef>> OffloadCache::acquire_if_resident(CacheKey key, StreamId use_stream) {
  Result<std::optional<CacheRef>> r = impl_->acquire(key, use_stream, /*fetch=*/false);
  check(*this);
  return r;
}

Result<void> OffloadCache::release(CacheKey key) {
  Impl& p = *impl_;
  {
    std::lock_guard lock(p.mu);
    auto it = p.entries.find(key);
    if (it == p.entries.end() || it->second.pins == 0) {
      return make_error(ErrorCode::invalid_argument, "release: " + key_text(key) + " is not pinned");
    }
    --it->second.pins;
  }
  check(*this);
  return {};
}

Result<std::uint32_t> OffloadCache::prefetch(std::span<const CacheKey> keys) {
  Impl& p = *impl_;
  FERRY_TRY(p.status);
  std::uint32_t issued = 0;
  for (CacheKey key : keys) {
    std::unique_lock lock(p.mu);
    auto it = p.entries.find(key);
    if (it == p.entries.end()) {
      return make_error(ErrorCode::invalid_argument, "prefetch: " + key_text(key) + " was never defined");
    }
    if (p.options.policy == EvictionPolicy::optimal && !p.has_plan) {
      return make_error(ErrorCode::invalid_argument,
                        "prefetch " + key_text(key) + ": the optimal policy needs set_access_plan() first");
    }
    Impl::Entry& e = it->second;
    if (e.state != Impl::State::absent) continue;
    p.fix_slot_bytes_locked();
    Impl::Evicted evicted;
    if (!p.claim_slot_locked(key, /*for_prefetch=*/true, &evicted)) {
      ++p.st.prefetch_dropped;
      continue;
    }
    e.state = Impl::State::filling;
    const std::uint64_t bytes = p.slot_bytes;
    lock.unlock();
    p.drop(std::move(evicted));
    Result<DeviceHandle> slot = p.pool.allocate(bytes, p.options.prefetch_stream);
    if (!slot.ok()) {
      p.abandon(key, {});
      if (slot.error().code == ErrorCode::out_of_memory) {
        std::lock_guard relock(p.mu);
        ++p.st.prefetch_dropped;
        continue;
      }
      return std::move(slot).error();
    }
    Result<PendingUpload> pending = p.engine.begin_upload(p.options.prefetch_stream, p.plan_for(e, *slot));
    if (!pending.ok()) {
      p.abandon(key, *slot);
      if (pending.error().code == ErrorCode::out_of_memory) {
        std::lock_guard relock(p.mu);
        ++p.st.prefetch_dropped;
        continue;
      }
      return std::move(pending).error();
    }
    lock.lock();
    e.slot = *slot;
    e.ready = pending->point();
    e.pending = std::move(*pending);
    e.state = Impl::State::loading;
    e.fresh_prefetch = true;
    e.last_use = ++p.tick;
    ++p.st.prefetches;
    ++p.st.uploads;
    p.st.bytes_uploaded += e.bytes;
    p.changed.notify_all();
    ++issued;
  }
  check(*this);
  return issued;
}

bool OffloadCache::resident(CacheKey key) const {
  std::lock_guard lock(impl_->mu);
  auto it = impl_->entries.find(key);
  return it != impl_->entries.end() && it->second.state != Impl::State::absent;
}

std::uint32_t OffloadCache::occupied() const {
  std::lock_guard lock(impl_->mu);
  return impl_->occupied;
}

std::uint64_t OffloadCache::slot_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->slot_fixed ? impl_->slot_bytes : 0;
}

CacheStats OffloadCache::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->st;
}

bool OffloadCache::validate(std::string* why) const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  const auto fail = [&](std::string what) {
    if (why != nullptr) *why = std::move(what);
    return false;
  };
  std::uint32_t occupied = 0;
  for (const auto& [k, e] : p.entries) {
    using S = Impl::State;
    if (e.state != S::absent) ++occupied;
    if (e.pins > 0 && e.state != S::resident) return fail(key_text(k) + " is pinned but not resident");
    if ((e.state == S::loading) != e.pending.has_value()) return fail(key_text(k) + ": pending upload mismatch");
    if (e.state == S::resident || e.state == S::loading || e.state == S::finishing) {
      if (!p.pool.resolve(e.slot).ok()) return fail(key_text(k) + " holds a stale slot handle");
      if (e.bytes > p.slot_bytes) return fail(key_text(k) + " is larger than its slot");
    }
    if (e.state == S::absent && e.slot != DeviceHandle{}) return fail(key_text(k) + " is absent but holds a slot");
    if (e.last_use > p.tick) return fail(key_text(k) + " was used in the future");
  }
  if (occupied != p.occupied) return fail("occupied count disagrees with the entries");
  if (p.occupied > p.options.slots) return fail("more entries occupy slots than there are slots");
  if (p.cursor > p.plan.size()) return fail("access plan cursor past its end");
  if (p.st.prefetch_hits > p.st.hits) return fail("more prefetch hits than hits");
  return true;
}

}  // namespace ferry
