#include "ferry/transfer_engine.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "core/text.hpp"
#include "ferry/content.hpp"

namespace ferry {
namespace {

enum class Path : std::uint8_t { batched, per_copy, staged, pageable };

const char* path_name(Path p) {
  switch (p) {
    case Path::batched: return "batched";
    case Path::per_copy: return "per-copy";
    case Path::staged: return "staged";
    case Path::pageable: return "pageable";
  }
  return "?";
}

using text::hex16;

std::string handle_text(DeviceHandle h) {
  return "{pool " + std::to_string(h.pool) + ", slot " + std::to_string(h.slot) + ", gen " +
         std::to_string(h.generation) + "}";
}

bool fits(std::uint64_t offset, std::uint64_t bytes, std::uint64_t size) {
  return offset <= size && bytes <= size - offset;
}

using Bytes = std::vector<std::byte>;

}  // namespace

// ---------------------------------------------------------------------------
// TransferPlan

TransferPlan& TransferPlan::add(const HostBlock& src, std::uint64_t src_offset, DeviceHandle dst,
                                std::uint64_t dst_offset, std::uint64_t bytes) {
  ranges_.push_back(TransferRange{src, src_offset, nullptr, dst, dst_offset, bytes});
  return *this;
}

TransferPlan& TransferPlan::add(const HostBlock& src, DeviceHandle dst, std::uint64_t dst_offset) {
  return add(src, 0, dst, dst_offset, src.bytes);
}

TransferPlan& TransferPlan::add(const std::byte* src, DeviceHandle dst, std::uint64_t dst_offset,
                                std::uint64_t bytes) {
  ranges_.push_back(TransferRange{HostBlock{}, 0, src, dst, dst_offset, bytes});
  return *this;
}

TransferPlan& TransferPlan::add(std::span<const std::byte> src, DeviceHandle dst,
                                std::uint64_t dst_offset) {
  return add(src.data(), dst, dst_offset, src.size());
}

std::uint64_t TransferPlan::bytes() const noexcept {
  std::uint64_t n = 0;
  for (const TransferRange& r : ranges_) n += r.bytes;
  return n;
}

// ---------------------------------------------------------------------------
// Upload state

namespace {

// One range's bytes of truth and its history.
struct RangeState {
  const std::byte* origin = nullptr;  // the bytes the device must end up holding
  std::uint64_t bytes = 0;
  HostBlock own_block{};              // a staging block holding origin (plain host source)
  std::shared_ptr<Bytes> own_heap;    // origin in heap memory (staging refused)
  std::uint64_t hash = 0;             // content_hash(origin) (verify)
  std::uint32_t attempts = 0;
  std::string tried;                  // "batched, staged, ..." for the error message
  bool failed = false;                // failed at least once
  bool done = false;
};

// One copy of one range in the current round.
struct Attempt {
  std::uint32_t range = 0;
  Path path = Path::per_copy;
  const std::byte* src = nullptr;     // what the copy reads
  bool leased_src = false;            // src lies in a block or registered region
  bool in_batch = false;              // rode in a BatchCopyToDeviceOp
  bool has_units = false;
  PinnedUnitId first_unit = 0, last_unit = 0;
  HostBlock temp_block{};             // attempt-owned staging block (freed after enqueue)
  std::shared_ptr<Bytes> temp_heap;   // attempt-owned pageable copy
};

}  // namespace

struct PendingUpload::State {
  HostArena* arena = nullptr;
  StreamId stream = 0;
  std::vector<TransferRange> ranges;
  std::vector<RangeState> rs;
  std::vector<Attempt> round;                        // the attempts in flight
  std::shared_ptr<std::vector<std::uint64_t>> results;  // device hashes of `round`
  // The last copy on `stream`, and the transfer's last operation: under verify
  // the last hash on the verify stream, which waited for that copy (so its
  // completion implies every copy and hash of the transfer completed); else
  // the last copy.
  StreamPoint copied{};
  StreamPoint last{};
  std::uint64_t bytes = 0;
  bool batched_first = false;

  // Staging blocks go back to the arena (pending until their copies completed),
  // on every exit: finish(), an error in begin_upload(), a dropped PendingUpload.
  ~State() {
    for (RangeState& r : rs) {
      if (r.own_block) (void)arena->free(r.own_block);
    }
  }
};

struct TransferEngine::Impl {
  struct UnitProbe {
    bool probed = false;
    std::uint32_t transfers = 0;
    std::uint64_t bytes = 0;
  };

  mutable std::mutex mu;  // guards everything below; never held while waiting
  IntegrityCounters counters;
  std::string batch_reason;
  BatchProbeReport probe_report;
  std::unordered_map<PinnedUnitId, UnitProbe> unit_probe;
  std::map<std::pair<std::uintptr_t, std::uint64_t>, std::uint64_t> hash_cache;
  std::map<std::uintptr_t, std::pair<std::uint64_t, RegionId>> immutable;  // start -> (bytes, id)
  // What the device may still write into or read from after a call gave up
  // waiting (hash results, pageable copies, bounce buffers): kept until done.
  std::vector<std::pair<StreamPoint, std::shared_ptr<void>>> keepalive;
  // Event waits on the verify streams not yet known complete: (the wait's own
  // point, the copy it waits for). A hash can only finish once every wait ahead
  // of it on its verify stream has, so finish() dispatches held copies named here.
  std::deque<std::pair<StreamPoint, StreamPoint>> verify_waits;
  std::uint64_t canary_seed = 0x9e3779b97f4a7c15ull;

  std::atomic<bool> batching{false};
  Result<void> status;
};

// ---------------------------------------------------------------------------
// PendingUpload

PendingUpload::PendingUpload() noexcept = default;

PendingUpload::PendingUpload(PendingUpload&& o) noexcept
    : engine_(std::exchange(o.engine_, nullptr)), state_(std::move(o.state_)) {}

PendingUpload& PendingUpload::operator=(PendingUpload&& o) noexcept {
  if (this != &o) {
    PendingUpload dropped(std::move(*this));
    engine_ = std::exchange(o.engine_, nullptr);
    state_ = std::move(o.state_);
  }
  return *this;
}

StreamPoint PendingUpload::point() const noexcept { return state_ ? state_->last : StreamPoint{}; }

// ---------------------------------------------------------------------------
// TransferEngine internals

namespace detail {

struct EngineOps {
  static EngineOps of(TransferEngine& e) {
    return EngineOps{e.pool_, e.arena_, e.order_, e.options_, *e.impl_};
  }

  DevicePool& pool;
  HostArena& arena;
  StreamOrder& order;
  const EngineOptions& opt;
  TransferEngine::Impl& m;

  void count(auto&& f) {
    std::lock_guard lock(m.mu);
    f(m.counters);
  }

  void park(StreamPoint point, std::shared_ptr<void> what) {
    if (!what) return;
    std::lock_guard lock(m.mu);
    m.keepalive.emplace_back(point, std::move(what));
  }

  void prune() {
    std::vector<std::shared_ptr<void>> dead;  // destroyed outside the lock
    std::lock_guard lock(m.mu);
    std::size_t keep = 0;
    for (auto& k : m.keepalive) {
      if (order.is_complete(k.first)) {
        dead.push_back(std::move(k.second));
      } else {
        m.keepalive[keep++] = std::move(k);
      }
    }
    m.keepalive.resize(keep);
    std::erase_if(m.verify_waits, [&](const auto& w) { return order.is_complete(w.second); });
  }

  // Submits the op that build(point) returns. A build error after some leases
  // were recorded still consumes the ticket with a no-op, so those leases name a
  // ticket that completes (StreamOrder's contract: a failed prepare records nothing).
  template <class Build>
  Result<StreamPoint> submit(StreamId stream, Build&& build) {
    std::optional<Error> failed;
    Result<Ticket> t = order.submit(stream, [&](Ticket ticket) -> Result<Op> {
      Result<Op> op = build(StreamPoint{stream, ticket});
      if (!op.ok()) {
        failed = std::move(op).error();
        return Op{NopOp{}};
      }
      return op;
    });
    if (!t.ok()) return std::move(t).error();
    if (failed) return std::move(*failed);
    return StreamPoint{stream, *t};
  }

  Result<DeviceRange> lease_dst(DeviceHandle h, std::uint64_t off, std::uint64_t bytes,
                                StreamPoint point) {
    auto span = pool.lease(h, point);
    if (!span.ok()) return std::move(span).error();
    if (!fits(off, bytes, span->bytes)) {
      return make_error(ErrorCode::invalid_argument,
                        "device range [" + std::to_string(off) + ", +" + std::to_string(bytes) +
                            ") lies outside allocation " + handle_text(h) + " of " +
                            std::to_string(span->bytes) + " bytes");
    }
    return DeviceRange{span->addr + off, bytes};
  }

  // Also orders `stream` after the block's allocation point when it reused memory
  // still in use on another stream (DevicePool::make_ready, I3).
  Result<void> check_dst(DeviceHandle h, std::uint64_t off, std::uint64_t bytes, StreamId stream) {
    FERRY_TRY(pool.make_ready(h, stream));
    auto span = pool.resolve(h);
    if (!span.ok()) return std::move(span).error();
    if (!fits(off, bytes, span->bytes)) {
      return make_error(ErrorCode::invalid_argument,
                        "device range [" + std::to_string(off) + ", +" + std::to_string(bytes) +
                            ") lies outside allocation " + handle_text(h) + " of " +
                            std::to_string(span->bytes) + " bytes");
    }
    return {};
  }

  // --- hashing

  std::uint64_t source_hash(const std::byte* ptr, std::uint64_t bytes) {
    const auto key = std::make_pair(reinterpret_cast<std::uintptr_t>(ptr), bytes);
    bool cacheable = false;
    {
      std::lock_guard lock(m.mu);
      if (auto it = m.hash_cache.find(key); it != m.hash_cache.end()) return it->second;
      auto it = m.immutable.upper_bound(key.first);
      if (it != m.immutable.begin()) {
        --it;
        cacheable = fits(key.first - it->first, bytes, it->second.first);
      }
    }
    // Hash without the lock: it costs host time proportional to the bytes.
    const std::uint64_t h = content_hash({ptr, bytes});
    if (cacheable) {
      std::lock_guard lock(m.mu);
      m.hash_cache.emplace(key, h);
    }
    return h;
  }

  // --- canaries (report 000's probe, made general)

  // Copies the unit's canary span to fresh device scratch (pre-filled with a
  // different pattern) behind everything already on `stream`, reads it back and
  // compares. Blocks (bounded). Returns true when the bytes arrived.
  Result<bool> canary(PinnedUnitId unit, StreamId stream) {
    auto span = arena.canary(unit);
    if (!span) return true;  // released: nothing reads it any more
    auto scratch = pool.allocate(span->bytes, stream);
    if (!scratch.ok()) return std::move(scratch).error();
    // A seed whose pattern differs from the canary bytes, so a dropped copy shows.
    std::uint64_t seed = 0;
    {
      std::lock_guard lock(m.mu);
      seed = m.canary_seed = splitmix64(m.canary_seed);
    }
    Bytes fill(span->bytes);
    for (;; ++seed) {
      fill_pattern(seed, 0, fill);
      if (std::memcmp(fill.data(), span->expected.data(), span->bytes) != 0) break;
    }
    auto readback = std::make_shared<Bytes>(span->bytes);
    auto finish = [&](Result<bool> r) -> Result<bool> {
      (void)pool.free(*scratch);  // stream-ordered: legal with the work in flight
      return r;
    };
    if (auto f = enqueue_fill(pool, stream, *scratch, seed); !f.ok()) {
      return finish(std::move(f).error());
    }
    auto copy = submit(stream, [&](StreamPoint p) -> Result<Op> {
      auto dst = lease_dst(*scratch, 0, span->bytes, p);
      if (!dst.ok()) return std::move(dst).error();
      FERRY_TRY(arena.lease_unit(unit, p));
      return Op{CopyToDeviceOp{*dst, span->data}};
    });
    if (!copy.ok()) return finish(std::move(copy).error());
    auto back = enqueue_copy_to_host(pool, stream, *scratch, *readback);
    if (!back.ok()) return finish(std::move(back).error());
    const StreamPoint point{stream, *back};
    if (auto w = order.wait(point); !w.ok()) {
      park(point, readback);
      return finish(std::move(w).error());
    }
    const bool ok = std::memcmp(readback->data(), span->expected.data(), span->bytes) == 0;
    count([&](IntegrityCounters& c) {
      ++c.canaries;
      c.bytes_moved += 2 * span->bytes;
      if (!ok) {
        ++c.canary_failures;
        // Report 000: once copies go missing in a process they keep going
        // missing; from now on probe checks every transfer.
        c.probe_escalated = true;
      }
    });
    {
      std::lock_guard lock(m.mu);
      auto& up = m.unit_probe[unit];
      up.probed = true;
      up.transfers = 0;
      up.bytes = 0;
    }
    return finish(ok);
  }

  void retire_unit(PinnedUnitId unit, const std::string& why) {
    auto r = arena.retire(unit, why);
    if (r.ok() && *r) {
      std::lock_guard lock(m.mu);
      ++m.counters.units_retired;
      if (m.counters.units_retired >= opt.distrust_pinned_after) m.counters.pinned_distrusted = true;
    }
  }

  bool distrusted() {
    std::lock_guard lock(m.mu);
    return m.counters.pinned_distrusted;
  }

  void disable_batching(const std::string& why) {
    std::lock_guard lock(m.mu);
    if (m.batching.exchange(false)) m.batch_reason = why;
    if (m.batch_reason.empty()) m.batch_reason = why;
    m.counters.batched_disabled = true;
  }

  // --- building attempts

  // Reads range r's origin through `path` (per_copy/batched: in place; staged:
  // a new arena block; pageable: heap). Staging that the arena refuses falls to
  // pageable.
  Result<Attempt> make_attempt(PendingUpload::State& s, std::uint32_t r, Path path) {
    RangeState& rs = s.rs[r];
    Attempt a;
    a.range = r;
    // Heap origins (staging was refused) are only ever copied as pageable: the
    // copy must not read memory the transfer state frees when it returns.
    a.path = rs.own_heap ? Path::pageable : path;
    if (a.path == Path::staged) {
      auto block = arena.allocate(rs.bytes);
      if (block.ok()) {
        std::memcpy(block->data, rs.origin, rs.bytes);
        a.temp_block = *block;
        a.src = block->data;
        a.leased_src = true;
        a.has_units = true;
        a.first_unit = a.last_unit = block->chunk;
        count([](IntegrityCounters& c) { ++c.staged; });
        return a;
      }
      if (block.error().code != ErrorCode::out_of_memory) return std::move(block).error();
      a.path = Path::pageable;
    }
    if (a.path == Path::pageable) {
      a.temp_heap = std::make_shared<Bytes>(rs.bytes);
      std::memcpy(a.temp_heap->data(), rs.origin, rs.bytes);
      a.src = a.temp_heap->data();
      count([](IntegrityCounters& c) { ++c.pageable; });
      return a;
    }
    // In place: the origin lives in a block or a registered region (or the heap,
    // when staging was refused).
    a.src = rs.origin;
    if (auto info = arena.locate(rs.origin, rs.bytes)) {
      if (info->retired) return make_attempt(s, r, distrusted() ? Path::pageable : Path::staged);
      a.leased_src = true;
      a.has_units = true;
      a.first_unit = info->first_unit;
      a.last_unit = info->last_unit;
    } else if (!rs.own_heap) {
      return make_error(ErrorCode::stale_handle,
                        "range " + std::to_string(r) + ": its host block was freed during the transfer");
    }
    return a;
  }

  // Enqueues the copies of s.round on s.stream (one batch when `batch`), then,
  // under verify, each attempt's HashOp on the verify stream behind an event wait
  // for its copy, so the upload stream never waits for a hash (nor for whatever
  // kernel occupies the engine a hash runs on). Each hash leases the destination
  // and the source for its own ticket (I2, I6). Attempt-owned staging blocks are
  // freed once every op that reads them is leased.
  Result<void> enqueue_round(PendingUpload::State& s, bool batch) {
    const StreamId stream = s.stream;
    std::uint64_t moved = 0;
    std::shared_ptr<std::vector<std::shared_ptr<Bytes>>> heaps;
    for (const Attempt& a : s.round) {
      moved += s.rs[a.range].bytes;
      if (a.temp_heap) {
        if (!heaps) heaps = std::make_shared<std::vector<std::shared_ptr<Bytes>>>();
        heaps->push_back(a.temp_heap);
      }
    }
    auto copy_op = [&](const Attempt& a, StreamPoint p) -> Result<CopyToDeviceOp> {
      const TransferRange& tr = s.ranges[a.range];
      auto dst = lease_dst(tr.dst, tr.dst_offset, tr.bytes, p);
      if (!dst.ok()) return std::move(dst).error();
      if (a.leased_src) FERRY_TRY(arena.lease_source(a.src, tr.bytes, p));
      return CopyToDeviceOp{*dst, a.src};
    };
    Result<void> result;
    StreamPoint copied = s.copied;
    std::vector<StreamPoint> copy_at;  // the copy point of each attempt of the round
    copy_at.reserve(s.round.size());
    if (batch) {
      auto p = submit(stream, [&](StreamPoint point) -> Result<Op> {
        BatchCopyToDeviceOp op;
        op.copies.reserve(s.round.size());
        for (const Attempt& a : s.round) {
          auto c = copy_op(a, point);
          if (!c.ok()) return std::move(c).error();
          op.copies.push_back(*c);
        }
        return Op{std::move(op)};
      });
      if (p.ok()) {
        copied = *p;
        copy_at.assign(s.round.size(), *p);
        count([](IntegrityCounters& c) { ++c.batches; });
      } else {
        result = std::move(p).error();
      }
    } else {
      for (const Attempt& a : s.round) {
        auto p = submit(stream, [&](StreamPoint point) -> Result<Op> {
          auto c = copy_op(a, point);
          if (!c.ok()) return std::move(c).error();
          return Op{*c};
        });
        if (!p.ok()) {
          result = std::move(p).error();
          break;
        }
        copied = *p;
        copy_at.push_back(*p);
        count([](IntegrityCounters& c) { ++c.per_copy; });
      }
    }
    count([&](IntegrityCounters& c) { c.bytes_moved += moved; });
    StreamPoint last = copied;
    if (result.ok() && opt.policy == IntegrityPolicy::verify) {
      s.results = std::make_shared<std::vector<std::uint64_t>>(s.round.size(), 0);
      result = enqueue_hashes(s, copy_at, &last);
      park(last, s.results);  // dropped by prune() once the hashes landed
    }
    // Leased (or never enqueued): the arena keeps each block until the last op
    // that reads it completed.
    for (Attempt& a : s.round) {
      if (a.temp_block) (void)arena.free(a.temp_block);
      a.temp_block = {};
    }
    park(copied, heaps);
    s.copied = copied;
    s.last = last;
    return result;
  }

  // The verify stream that hashes uploads on `stream` (EngineOptions).
  StreamId verify_stream_of(StreamId stream) const {
    return opt.verify_stream - stream % opt.verify_streams;
  }

  // verify: one HashOp per attempt of s.round on s.stream's verify stream, each
  // behind a WaitOp for its copy (copy_at[i]; one wait per distinct point). On
  // return *last is the last op enqueued there (the hashes run in line, ordered
  // by the FIFO, when that verify stream is the upload stream itself).
  Result<void> enqueue_hashes(PendingUpload::State& s, const std::vector<StreamPoint>& copy_at,
                              StreamPoint* last) {
    const StreamId vs = verify_stream_of(s.stream);
    StreamPoint awaited{};
    for (std::size_t i = 0; i < s.round.size(); ++i) {
      const Attempt& a = s.round[i];
      const TransferRange& tr = s.ranges[a.range];
      if (vs != s.stream && copy_at[i] != awaited) {
        auto w = submit(vs, [&](StreamPoint point) -> Result<Op> {
          std::lock_guard lock(m.mu);  // a stream's submission lock, then m.mu: never the reverse
          m.verify_waits.emplace_back(point, copy_at[i]);
          return Op{WaitOp{copy_at[i]}};
        });
        if (!w.ok()) return std::move(w).error();
        awaited = copy_at[i];
        *last = *w;
      }
      std::uint64_t* slot = s.results->data() + i;
      // No make_ready(dst, vs): the hash waits for the copy, which the upload
      // stream already ordered after the block's allocation point.
      auto p = submit(vs, [&](StreamPoint point) -> Result<Op> {
        auto dst = lease_dst(tr.dst, tr.dst_offset, tr.bytes, point);
        if (!dst.ok()) return std::move(dst).error();
        // The copy's verdict is this hash: its source stays unreused until then.
        if (a.leased_src) FERRY_TRY(arena.lease_source(a.src, tr.bytes, point));
        return Op{HashOp{*dst, slot}};
      });
      if (!p.ok()) return std::move(p).error();
      *last = *p;
    }
    return {};
  }

  // Before a wait for `point`: the copies that event waits on a verify stream at
  // or before `point` name, where their streams are held, are waited for (which
  // dispatches them), since `point` could never complete otherwise — as a sync
  // dispatches what it waits for. Blocks (bounded).
  Result<void> dispatch_awaited_copies(StreamPoint point) {
    std::vector<StreamPoint> ahead;
    {
      std::lock_guard lock(m.mu);
      for (const auto& [wait, copy] : m.verify_waits) {
        if (wait.stream == point.stream && wait.ticket <= point.ticket) ahead.push_back(copy);
      }
    }
    for (const StreamPoint& p : ahead) {
      if (!order.is_complete(p) && order.backend().held(p.stream)) FERRY_TRY(order.wait(p));
    }
    return {};
  }

  // verify: blocks (bounded) until the round's copies and hashes completed: the
  // copies first (which dispatches them if s.stream is held), then the held
  // copies of other transfers that its hashes queue behind, then the hashes.
  Result<void> wait_round(const PendingUpload::State& s) {
    FERRY_TRY(order.wait(s.copied));
    FERRY_TRY(dispatch_awaited_copies(s.last));
    return order.wait(s.last);
  }

  // Chooses how range a.range is tried next after its attempt failed.
  Path next_path(const Attempt& a, bool unit_bad) {
    if (unit_bad) return distrusted() ? Path::pageable : Path::staged;
    if (a.in_batch) {
      disable_batching("a batched copy failed verification while its source's canary passed");
      return a.path == Path::pageable ? Path::pageable : Path::per_copy;
    }
    return Path::pageable;
  }

  // Runs the canaries of `units` on `stream`; retires the failing ones. Returns
  // the set of bad units (already retired ones included).
  Result<std::set<PinnedUnitId>> diagnose(const std::set<PinnedUnitId>& units, StreamId stream) {
    std::set<PinnedUnitId> bad;
    for (PinnedUnitId u : units) {
      if (arena.retired(u)) {
        bad.insert(u);
        continue;
      }
      auto ok = canary(u, stream);
      if (!ok.ok()) return std::move(ok).error();
      if (!*ok) {
        bad.insert(u);
        retire_unit(u, "canary copy came back wrong (report 000: pinned copy silently dropped)");
      }
    }
    return bad;
  }

  // Builds the next round from the failed attempts. Ranges out of attempts are
  // left failed (not done); the caller reports them.
  Result<void> plan_retries(PendingUpload::State& s, const std::vector<Attempt>& failed,
                            const std::set<PinnedUnitId>& bad) {
    std::vector<Attempt> next;
    for (const Attempt& a : failed) {
      RangeState& rs = s.rs[a.range];
      rs.failed = true;
      if (rs.attempts >= opt.max_attempts) continue;
      bool unit_bad = false;
      if (a.has_units) {
        for (PinnedUnitId u = a.first_unit; u <= a.last_unit; ++u) unit_bad = unit_bad || bad.count(u);
      }
      // The last attempt is always the one that needs no pinned memory at all.
      const Path path = rs.attempts + 1 >= opt.max_attempts ? Path::pageable : next_path(a, unit_bad);
      auto na = make_attempt(s, a.range, path);
      if (!na.ok()) return std::move(na).error();
      count([&](IntegrityCounters& c) {
        ++c.retries;
        if (na->path != a.path) ++c.fallbacks;
      });
      ++rs.attempts;
      rs.tried += std::string(", ") + path_name(na->path);
      next.push_back(std::move(*na));
    }
    s.round = std::move(next);
    return {};
  }

  // probe: canaries the units of this round that are due, behind its copies.
  // Returns the attempts that read a unit whose canary failed.
  Result<std::vector<Attempt>> probe_round(PendingUpload::State& s, std::set<PinnedUnitId>* bad) {
    std::set<PinnedUnitId> due;
    {
      std::lock_guard lock(m.mu);
      std::set<PinnedUnitId> touched;
      for (const Attempt& a : s.round) {
        if (!a.has_units) continue;
        for (PinnedUnitId u = a.first_unit; u <= a.last_unit; ++u) {
          auto& up = m.unit_probe[u];
          up.bytes += s.rs[a.range].bytes;
          if (touched.insert(u).second) ++up.transfers;
          // A redone copy is always checked: it replaces one that was lost.
          if (s.rs[a.range].failed) due.insert(u);
        }
      }
      for (PinnedUnitId u : touched) {
        const auto& up = m.unit_probe[u];
        if (m.counters.probe_escalated || !up.probed || up.transfers >= opt.probe_every_transfers ||
            up.bytes >= opt.probe_every_bytes) {
          due.insert(u);
        }
      }
    }
    std::vector<Attempt> failed;
    if (due.empty()) return failed;
    auto diag = diagnose(due, s.stream);
    if (!diag.ok()) return std::move(diag).error();
    *bad = std::move(*diag);
    if (bad->empty()) return failed;
    for (const Attempt& a : s.round) {
      if (!a.has_units) continue;
      for (PinnedUnitId u = a.first_unit; u <= a.last_unit; ++u) {
        if (bad->count(u)) {
          failed.push_back(a);
          break;
        }
      }
    }
    count([&](IntegrityCounters& c) { c.mismatches += failed.size(); });
    return failed;
  }

  Error corrupt_error(const PendingUpload::State& s, std::uint32_t r, std::uint64_t device_hash) {
    const TransferRange& tr = s.ranges[r];
    const RangeState& rs = s.rs[r];
    std::string msg = "range " + std::to_string(r) + " of " + std::to_string(s.ranges.size()) +
                      ": host [" + text::hex(rs.origin) + ", +" + std::to_string(tr.bytes) +
                      ") -> device " + handle_text(tr.dst) + " offset " +
                      std::to_string(tr.dst_offset) + ", " + std::to_string(tr.bytes) +
                      " bytes never arrived intact after " + std::to_string(rs.attempts) +
                      " attempts (" + rs.tried + ")";
    if (opt.policy == IntegrityPolicy::verify) {
      msg += "; device hash " + hex16(device_hash) + " != source hash " + hex16(rs.hash);
    }
    return make_error(ErrorCode::transfer_corrupt, msg);
  }
};

}  // namespace detail

// ---------------------------------------------------------------------------
// TransferEngine

TransferEngine::TransferEngine(DevicePool& pool, HostArena& arena, EngineOptions options)
    : pool_(pool), arena_(arena), order_(pool.order()), options_(options),
      impl_(std::make_unique<Impl>()) {
  if (&arena.order() != &pool.order()) {
    impl_->status = make_error(ErrorCode::invalid_argument,
                               "transfer engine: the pool and the arena use different StreamOrders");
    return;
  }
  if (options_.max_attempts == 0) options_.max_attempts = 1;
  if (options_.probe_every_transfers == 0) options_.probe_every_transfers = 1;
  if (options_.probe_stream >= kMaxStreams) {
    impl_->status = make_error(ErrorCode::invalid_argument,
                               "transfer engine: probe_stream " +
                                   std::to_string(options_.probe_stream) + " is out of range");
    return;
  }
  if (options_.verify_streams == 0) options_.verify_streams = 1;
  if (options_.verify_stream >= kMaxStreams ||
      options_.verify_streams > options_.verify_stream + 1) {
    impl_->status = make_error(
        ErrorCode::invalid_argument,
        "transfer engine: verify streams " + std::to_string(options_.verify_stream) + " down to " +
            std::to_string(std::int64_t{options_.verify_stream} - options_.verify_streams + 1) +
            " (verify_stream " + std::to_string(options_.verify_stream) + ", verify_streams " +
            std::to_string(options_.verify_streams) + ") are out of range (streams are 0.." +
            std::to_string(kMaxStreams - 1) + ")");
    return;
  }
  Impl& m = *impl_;
  auto ops = detail::EngineOps::of(*this);
  const DeviceInfo& info = order_.backend().info();
  auto off = [&](std::string why, bool ran) {
    m.batching = false;
    m.batch_reason = why;
    m.counters.batched_disabled = true;
    m.probe_report.ran = ran;
    m.probe_report.passed = false;
    m.probe_report.detail = std::move(why);
  };
  if (!options_.allow_batching) {
    off("batching disabled by EngineOptions::allow_batching", false);
    return;
  }
  if (!info.batched_copy) {
    off("the backend has no native batched copy", false);
    return;
  }

  // Start-up probe: a batch of kCopies canary copies, twice (some drivers honour
  // only the first batch), with reversed destinations so that a batch that
  // ignores its offsets fails too.
  constexpr std::uint64_t kCopies = 4, kPiece = 256;
  const StreamId stream = options_.probe_stream;
  auto run_probe = [&](std::string* detail) -> Result<bool> {
    auto block = arena_.allocate(kCopies * kPiece);
    if (!block.ok()) return std::move(block).error();
    auto scratch = pool_.allocate(kCopies * kPiece, stream);
    if (!scratch.ok()) {
      (void)arena_.free(*block);
      return std::move(scratch).error();
    }
    auto cleanup = [&] {
      (void)pool_.free(*scratch);
      (void)arena_.free(*block);
    };
    auto readback = std::make_shared<Bytes>(kCopies * kPiece);
    bool passed = true;
    for (int pass = 0; pass < 2 && passed; ++pass) {
      const std::uint64_t seed = 0x5eed0000ull + static_cast<std::uint64_t>(pass);
      fill_pattern(seed, 0, block->span());
      auto f = enqueue_fill(pool_, stream, *scratch, seed ^ 0xffffull);
      if (!f.ok()) {
        cleanup();
        return std::move(f).error();
      }
      auto p = ops.submit(stream, [&](StreamPoint point) -> Result<Op> {
        BatchCopyToDeviceOp op;
        for (std::uint64_t i = 0; i < kCopies; ++i) {
          auto dst = ops.lease_dst(*scratch, (kCopies - 1 - i) * kPiece, kPiece, point);
          if (!dst.ok()) return std::move(dst).error();
          FERRY_TRY(arena_.lease_source(block->data + i * kPiece, kPiece, point));
          op.copies.push_back(CopyToDeviceOp{*dst, block->data + i * kPiece});
        }
        return Op{std::move(op)};
      });
      if (!p.ok()) {
        cleanup();
        return std::move(p).error();
      }
      auto back = enqueue_copy_to_host(pool_, stream, *scratch, *readback);
      if (!back.ok()) {
        cleanup();
        return std::move(back).error();
      }
      if (auto w = order_.wait({stream, *back}); !w.ok()) {
        ops.park({stream, *back}, readback);
        cleanup();
        return std::move(w).error();
      }
      std::uint64_t wrong = 0;
      for (std::uint64_t i = 0; i < kCopies; ++i) {
        if (std::memcmp(readback->data() + (kCopies - 1 - i) * kPiece, block->data + i * kPiece,
                        kPiece) != 0) {
          ++wrong;
        }
      }
      if (wrong != 0) {
        passed = false;
        *detail = "pass " + std::to_string(pass + 1) + " of 2: " + std::to_string(wrong) + " of " +
                  std::to_string(kCopies) + " batched copies came back wrong";
        // Was it the batch or the pinned chunk (report 000)? A per-copy canary
        // of the same chunk tells them apart.
        auto c = ops.canary(block->chunk, stream);
        if (c.ok() && !*c) {
          ops.retire_unit(block->chunk, "start-up probe: canary came back wrong");
          *detail += "; the chunk's own canary failed too (pinned memory, not the batch)";
          cleanup();
          return make_error(ErrorCode::backend_error, *detail);  // retried by the caller
        }
      }
    }
    cleanup();
    if (passed) *detail = "2 passes of " + std::to_string(kCopies) + " batched copies arrived intact";
    return passed;
  };
  std::string detail;
  Result<bool> probe = run_probe(&detail);
  if (!probe.ok()) probe = run_probe(&detail);  // once more, on a fresh chunk
  if (!probe.ok()) {
    off("the batched-copy start-up probe could not run: " + probe.error().message, false);
    return;
  }
  if (!*probe) {
    off("the batched-copy start-up probe failed: " + detail, true);
    return;
  }
  m.batching = true;
  m.probe_report = BatchProbeReport{true, true, detail};
}

TransferEngine::~TransferEngine() {
  // Wait for what the device may still write into (hash results, bounce buffers).
  std::vector<std::pair<StreamPoint, std::shared_ptr<void>>> keep;
  {
    std::lock_guard lock(impl_->mu);
    keep = std::move(impl_->keepalive);
  }
  auto ops = detail::EngineOps::of(*this);
  for (auto& [point, what] : keep) {
    if (!ops.dispatch_awaited_copies(point).ok() || !order_.wait(point).ok()) {
      // Never completes: leaking beats freeing memory the device still writes.
      new std::shared_ptr<void>(std::move(what));  // NOLINT: deliberate leak
    }
  }
}

// The device may still write the hash results: enqueue_round() parked them in
// the engine's keepalive already. ~State returns the staging blocks.
PendingUpload::~PendingUpload() = default;

const Result<void>& TransferEngine::status() const noexcept { return impl_->status; }

bool TransferEngine::batching_enabled() const noexcept { return impl_->batching.load(); }

std::string TransferEngine::batching_disabled_reason() const {
  std::lock_guard lock(impl_->mu);
  return impl_->batching.load() ? std::string{} : impl_->batch_reason;
}

BatchProbeReport TransferEngine::startup_probe() const {
  std::lock_guard lock(impl_->mu);
  return impl_->probe_report;
}

IntegrityCounters TransferEngine::counters() const {
  std::lock_guard lock(impl_->mu);
  IntegrityCounters c = impl_->counters;
  c.batched_disabled = !impl_->batching.load();
  return c;
}

Result<PendingUpload> TransferEngine::begin_upload(StreamId stream, const TransferPlan& plan) {
  FERRY_TRY(impl_->status);
  auto ops = detail::EngineOps::of(*this);
  ops.prune();
  if (stream >= kMaxStreams) {
    return make_error(ErrorCode::invalid_argument,
                      "upload on stream " + std::to_string(stream) + ": out of range");
  }
  auto state = std::make_unique<PendingUpload::State>();
  PendingUpload::State& s = *state;
  s.arena = &arena_;
  s.stream = stream;
  s.ranges.assign(plan.ranges().begin(), plan.ranges().end());
  s.rs.resize(s.ranges.size());
  s.copied = StreamPoint{stream, 0};
  s.last = s.copied;

  // Validate everything before anything is enqueued.
  for (std::uint32_t r = 0; r < s.ranges.size(); ++r) {
    const TransferRange& tr = s.ranges[r];
    const std::string what = "upload range " + std::to_string(r);
    if (tr.bytes == 0) return make_error(ErrorCode::invalid_argument, what + ": 0 bytes");
    if (tr.block) {
      if (!fits(tr.block_offset, tr.bytes, tr.block.bytes)) {
        return make_error(ErrorCode::invalid_argument,
                          what + ": [" + std::to_string(tr.block_offset) + ", +" +
                              std::to_string(tr.bytes) + ") lies outside its " +
                              std::to_string(tr.block.bytes) + "-byte host block");
      }
      auto info = arena_.locate(tr.block.data + tr.block_offset, tr.bytes);
      if (!info || info->kind != HostRangeInfo::Kind::block ||
          info->block.serial != tr.block.serial) {
        return make_error(ErrorCode::stale_handle, what + ": its host block is not live");
      }
    } else if (tr.host == nullptr ||
               reinterpret_cast<std::uintptr_t>(tr.host) > UINTPTR_MAX - tr.bytes) {
      return make_error(ErrorCode::invalid_argument, what + ": null or wrapping host range");
    }
    if (auto d = ops.check_dst(tr.dst, tr.dst_offset, tr.bytes, stream); !d.ok()) {
      Error e = std::move(d).error();
      e.message = what + ": " + e.message;
      return e;
    }
    s.bytes += tr.bytes;
  }

  const bool verify = options_.policy == IntegrityPolicy::verify;
  const bool pinned_ok = !ops.distrusted();
  const bool batch = options_.allow_batching && batching_enabled() && s.ranges.size() >= 2 && pinned_ok;
  s.batched_first = batch;
  // Origins: arena blocks and registered ranges in place; other host memory is
  // staged into an arena block owned by the transfer (so retries can re-read it).
  for (std::uint32_t r = 0; r < s.ranges.size(); ++r) {
    const TransferRange& tr = s.ranges[r];
    RangeState& rs = s.rs[r];
    rs.bytes = tr.bytes;
    const std::byte* src = tr.block ? tr.block.data + tr.block_offset : tr.host;
    if (tr.block || arena_.locate(src, tr.bytes)) {
      rs.origin = src;
    } else {
      auto block = arena_.allocate(tr.bytes);
      if (block.ok()) {
        std::memcpy(block->data, src, tr.bytes);
        rs.own_block = *block;
        rs.origin = block->data;
        ops.count([](IntegrityCounters& c) { ++c.staged; });
      } else if (block.error().code == ErrorCode::out_of_memory) {
        rs.own_heap = std::make_shared<Bytes>(src, src + tr.bytes);
        rs.origin = rs.own_heap->data();
      } else {
        return std::move(block).error();
      }
    }
    if (verify) rs.hash = ops.source_hash(rs.origin, rs.bytes);
  }
  // Round 0.
  for (std::uint32_t r = 0; r < s.ranges.size(); ++r) {
    RangeState& rs = s.rs[r];
    const Path path = !pinned_ok || rs.own_heap ? Path::pageable : batch ? Path::batched : Path::per_copy;
    auto a = ops.make_attempt(s, r, path);
    if (!a.ok()) return std::move(a).error();
    a->in_batch = batch;
    rs.attempts = 1;
    rs.tried = batch ? "batched" : path_name(a->path);
    s.round.push_back(std::move(*a));
  }
  // A staged or pageable attempt in a planned batch still rides in the batch:
  // the batch is one operation over whatever sources the round holds.
  ops.count([&](IntegrityCounters& c) {
    ++c.transfers;
    c.ranges += s.ranges.size();
    if (!pinned_ok) c.fallbacks += s.ranges.size();
  });
  FERRY_TRY(ops.enqueue_round(s, batch));

  if (options_.policy == IntegrityPolicy::probe) {
    // Canaries run now (behind the copies); failed units' copies are redone.
    for (;;) {
      std::set<PinnedUnitId> bad;
      auto failed = ops.probe_round(s, &bad);
      if (!failed.ok()) return std::move(failed).error();
      if (failed->empty()) break;
      FERRY_TRY(ops.plan_retries(s, *failed, bad));
      for (const Attempt& a : *failed) {
        if (s.rs[a.range].attempts >= options_.max_attempts &&
            std::none_of(s.round.begin(), s.round.end(),
                         [&](const Attempt& n) { return n.range == a.range; })) {
          ops.count([](IntegrityCounters& c) { ++c.corrupt; });
          return ops.corrupt_error(s, a.range, 0);
        }
      }
      if (s.round.empty()) break;
      FERRY_TRY(ops.enqueue_round(s, false));
    }
  }
  PendingUpload pending;
  pending.engine_ = this;
  pending.state_ = std::move(state);
  return pending;
}

Result<TransferReceipt> TransferEngine::finish(PendingUpload&& pending) {
  if (!pending.state_ || pending.engine_ != this) {
    return make_error(ErrorCode::invalid_argument,
                      "finish: not a pending upload of this engine (moved-from or foreign)");
  }
  auto ops = detail::EngineOps::of(*this);
  PendingUpload own(std::move(pending));  // frees the staging blocks on every return
  PendingUpload::State& s = *own.state_;
  TransferReceipt receipt;
  receipt.bytes = s.bytes;
  receipt.ranges = static_cast<std::uint32_t>(s.ranges.size());
  receipt.batched = s.batched_first;

  if (options_.policy == IntegrityPolicy::verify) {
    while (!s.round.empty()) {
      FERRY_TRY(ops.wait_round(s));
      std::vector<Attempt> failed;
      std::set<PinnedUnitId> suspects;
      std::uint64_t verified = 0;
      std::map<std::uint32_t, std::uint64_t> last_hash;
      for (std::size_t i = 0; i < s.round.size(); ++i) {
        const Attempt& a = s.round[i];
        RangeState& rs = s.rs[a.range];
        const std::uint64_t got = (*s.results)[i];
        if (got == rs.hash) {
          rs.done = true;
          verified += rs.bytes;
          if (rs.failed) ++receipt.recovered;
          continue;
        }
        last_hash[a.range] = got;
        failed.push_back(a);
        if (a.has_units) {
          for (PinnedUnitId u = a.first_unit; u <= a.last_unit; ++u) suspects.insert(u);
        }
      }
      ops.count([&](IntegrityCounters& c) {
        c.bytes_verified += verified;
        c.mismatches += failed.size();
      });
      if (failed.empty()) break;
      // Diagnose before choosing the next path: a failing canary convicts the
      // pinned unit, a passing one under a batch convicts the batch.
      auto bad = ops.diagnose(suspects, s.stream);
      if (!bad.ok()) return std::move(bad).error();
      FERRY_TRY(ops.plan_retries(s, failed, *bad));
      for (const Attempt& a : failed) {
        if (!s.rs[a.range].done &&
            std::none_of(s.round.begin(), s.round.end(),
                         [&](const Attempt& n) { return n.range == a.range; })) {
          ops.count([](IntegrityCounters& c) { ++c.corrupt; });
          return ops.corrupt_error(s, a.range, last_hash[a.range]);
        }
      }
      FERRY_TRY(ops.enqueue_round(s, false));
    }
    receipt.verified = true;
  }
  for (const RangeState& rs : s.rs) {
    if (rs.failed && options_.policy == IntegrityPolicy::probe) ++receipt.recovered;
  }
  ops.count([&](IntegrityCounters& c) { c.recovered += receipt.recovered; });
  receipt.done = s.last;
  return receipt;
}

Result<TransferReceipt> TransferEngine::upload(StreamId stream, const TransferPlan& plan) {
  auto pending = begin_upload(stream, plan);
  if (!pending.ok()) return std::move(pending).error();
  return finish(std::move(*pending));
}

Result<TransferReceipt> TransferEngine::download(StreamId stream, DeviceHandle src,
                                                 std::uint64_t src_offset,
                                                 std::span<std::byte> dst) {
  FERRY_TRY(impl_->status);
  auto ops = detail::EngineOps::of(*this);
  ops.prune();
  const std::uint64_t bytes = dst.size();
  const std::string what = "download of " + std::to_string(bytes) + " bytes from " +
                           handle_text(src) + " offset " + std::to_string(src_offset);
  if (bytes == 0 || dst.data() == nullptr) {
    return make_error(ErrorCode::invalid_argument, what + ": empty destination");
  }
  if (auto d = ops.check_dst(src, src_offset, bytes, stream); !d.ok()) {
    Error e = std::move(d).error();
    e.message = what + ": " + e.message;
    return e;
  }
  const bool verify = options_.policy == IntegrityPolicy::verify;
  // Into an arena block the copy writes in place under a lease; anywhere else it
  // lands in an engine-owned bounce buffer first, so a wait that gives up never
  // leaves the device writing into memory the caller may free.
  const bool in_arena = arena_.locate(dst.data(), bytes).has_value();
  ops.count([](IntegrityCounters& c) { ++c.transfers; ++c.ranges; });
  TransferReceipt receipt;
  receipt.bytes = bytes;
  receipt.ranges = 1;
  std::uint64_t device_hash = 0;
  std::string tried;
  for (std::uint32_t attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    auto bounce = in_arena ? nullptr : std::make_shared<Bytes>(bytes);
    std::byte* target = in_arena ? dst.data() : bounce->data();
    auto hash = std::make_shared<std::uint64_t>(0);
    if (verify) {
      auto h = ops.submit(stream, [&](StreamPoint p) -> Result<Op> {
        auto r = ops.lease_dst(src, src_offset, bytes, p);
        if (!r.ok()) return std::move(r).error();
        return Op{HashOp{*r, hash.get()}};
      });
      if (!h.ok()) return std::move(h).error();
    }
    auto c = ops.submit(stream, [&](StreamPoint p) -> Result<Op> {
      auto r = ops.lease_dst(src, src_offset, bytes, p);
      if (!r.ok()) return std::move(r).error();
      if (in_arena) FERRY_TRY(arena_.lease_source(target, bytes, p));
      return Op{CopyToHostOp{target, *r}};
    });
    if (!c.ok()) return std::move(c).error();
    receipt.done = *c;
    ops.count([&](IntegrityCounters& k) { k.bytes_moved += bytes; });
    if (auto w = order_.wait(*c); !w.ok()) {
      ops.park(*c, bounce);
      ops.park(*c, hash);
      return std::move(w).error();
    }
    if (!in_arena) std::memcpy(dst.data(), bounce->data(), bytes);
    tried += (attempt > 1 ? ", " : "") + std::string("copy-to-host");
    if (!verify) return receipt;
    if (content_hash(dst) == *hash) {
      receipt.verified = true;
      receipt.recovered = attempt > 1 ? 1 : 0;
      ops.count([&](IntegrityCounters& k) {
        k.bytes_verified += bytes;
        if (attempt > 1) ++k.recovered;
      });
      return receipt;
    }
    device_hash = *hash;
    ops.count([&](IntegrityCounters& k) {
      ++k.mismatches;
      if (attempt < options_.max_attempts) ++k.retries;
    });
  }
  ops.count([](IntegrityCounters& c) { ++c.corrupt; });
  return make_error(ErrorCode::transfer_corrupt,
                    what + " into host [" + text::hex(dst.data()) + ", +" + std::to_string(bytes) +
                        ") never arrived intact after " + std::to_string(options_.max_attempts) +
                        " attempts (" + tried + "); host hash " + hex16(content_hash(dst)) +
                        " != device hash " + hex16(device_hash));
}

Result<TransferReceipt> TransferEngine::copy_on_device(StreamId stream, DeviceHandle dst,
                                                       std::uint64_t dst_offset, DeviceHandle src,
                                                       std::uint64_t src_offset,
                                                       std::uint64_t bytes) {
  FERRY_TRY(impl_->status);
  auto ops = detail::EngineOps::of(*this);
  ops.prune();
  const std::string what = "device copy of " + std::to_string(bytes) + " bytes from " +
                           handle_text(src) + " offset " + std::to_string(src_offset) + " to " +
                           handle_text(dst) + " offset " + std::to_string(dst_offset);
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, what + ": 0 bytes");
  for (auto [h, off] : {std::pair{src, src_offset}, std::pair{dst, dst_offset}}) {
    if (auto d = ops.check_dst(h, off, bytes, stream); !d.ok()) {
      Error e = std::move(d).error();
      e.message = what + ": " + e.message;
      return e;
    }
  }
  const bool verify = options_.policy == IntegrityPolicy::verify;
  ops.count([](IntegrityCounters& c) { ++c.transfers; ++c.ranges; });
  TransferReceipt receipt;
  receipt.bytes = bytes;
  receipt.ranges = 1;
  std::uint64_t hs = 0, hd = 0;
  for (std::uint32_t attempt = 1; attempt <= options_.max_attempts; ++attempt) {
    auto c = ops.submit(stream, [&](StreamPoint p) -> Result<Op> {
      auto d = ops.lease_dst(dst, dst_offset, bytes, p);
      if (!d.ok()) return std::move(d).error();
      auto s = ops.lease_dst(src, src_offset, bytes, p);
      if (!s.ok()) return std::move(s).error();
      return Op{CopyOnDeviceOp{*d, s->addr}};
    });
    if (!c.ok()) return std::move(c).error();
    receipt.done = *c;
    ops.count([&](IntegrityCounters& k) { k.bytes_moved += bytes; });
    if (!verify) return receipt;
    auto hashes = std::make_shared<std::array<std::uint64_t, 2>>();
    for (int side = 0; side < 2; ++side) {
      auto h = ops.submit(stream, [&](StreamPoint p) -> Result<Op> {
        auto r = side == 0 ? ops.lease_dst(src, src_offset, bytes, p)
                           : ops.lease_dst(dst, dst_offset, bytes, p);
        if (!r.ok()) return std::move(r).error();
        return Op{HashOp{*r, hashes->data() + side}};
      });
      if (!h.ok()) {
        ops.park(receipt.done, hashes);
        return std::move(h).error();
      }
      receipt.done = *h;
    }
    if (auto w = order_.wait(receipt.done); !w.ok()) {
      ops.park(receipt.done, hashes);
      return std::move(w).error();
    }
    hs = (*hashes)[0];
    hd = (*hashes)[1];
    if (hs == hd) {
      receipt.verified = true;
      receipt.recovered = attempt > 1 ? 1 : 0;
      ops.count([&](IntegrityCounters& k) {
        k.bytes_verified += bytes;
        if (attempt > 1) ++k.recovered;
      });
      return receipt;
    }
    ops.count([&](IntegrityCounters& k) {
      ++k.mismatches;
      if (attempt < options_.max_attempts) ++k.retries;
    });
  }
  ops.count([](IntegrityCounters& c) { ++c.corrupt; });
  return make_error(ErrorCode::transfer_corrupt,
                    what + " never arrived intact after " + std::to_string(options_.max_attempts) +
                        " attempts; destination hash " + hex16(hd) + " != source hash " + hex16(hs));
}

Result<RegionId> TransferEngine::register_immutable(std::byte* ptr, std::uint64_t bytes) {
  auto region = arena_.register_host(ptr, bytes);
  if (!region.ok()) return region;
  const std::uint64_t h = content_hash({ptr, bytes});
  std::lock_guard lock(impl_->mu);
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  impl_->immutable[start] = {bytes, *region};
  impl_->hash_cache[{start, bytes}] = h;
  return region;
}

Result<void> TransferEngine::precompute_hash(const std::byte* ptr, std::uint64_t bytes) {
  const auto start = reinterpret_cast<std::uintptr_t>(ptr);
  {
    std::lock_guard lock(impl_->mu);
    auto it = impl_->immutable.upper_bound(start);
    const bool inside = bytes > 0 && it != impl_->immutable.begin() &&
                        fits(start - std::prev(it)->first, bytes, std::prev(it)->second.first);
    if (!inside) {
      return make_error(ErrorCode::invalid_argument,
                        "precompute_hash(" + std::to_string(bytes) +
                            " bytes): not inside a region registered with register_immutable");
    }
  }
  auto ops = detail::EngineOps::of(*this);
  (void)ops.source_hash(ptr, bytes);
  return {};
}

Result<void> TransferEngine::unregister(RegionId region) {
  {
    std::lock_guard lock(impl_->mu);
    for (auto it = impl_->immutable.begin(); it != impl_->immutable.end(); ++it) {
      if (it->second.second != region) continue;
      const std::uintptr_t start = it->first, end = start + it->second.first;
      for (auto h = impl_->hash_cache.lower_bound({start, 0});
           h != impl_->hash_cache.end() && h->first.first < end;) {
        h = impl_->hash_cache.erase(h);
      }
      impl_->immutable.erase(it);
      break;
    }
  }
  return arena_.unregister_host(region);
}

}  // namespace ferry
