// The upload path: begin_upload() checks a plan, fixes each range's origin and
// enqueues round 0 (one batch when batching is on); finish() (and, under probe,
// begin_upload itself) checks the round, has diagnosis.hpp judge what failed
// and enqueues the next round of per-range copies on the paths it chose, until
// every range arrived or one ran out of attempts. Also PendingUpload, which
// carries the upload in flight between the two.
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "core/testing_hooks.hpp"
#include "core/text.hpp"
#include "ferry/names.hpp"
#include "transfer/diagnosis.hpp"
#include "transfer/upload_state.hpp"

namespace ferry {
namespace detail {

namespace {

constexpr std::array<NamedValue<Path>, 4> kPathNames{{
    {Path::batched, "batched"},
    {Path::per_copy, "per-copy"},
    {Path::staged, "staged"},
    {Path::pageable, "pageable"},
}};

}  // namespace

const char* path_name(Path p) { return name_in<Path>(kPathNames, p).data(); }  // the names are literals

namespace {

// Reads range r's origin through `path` (per_copy/batched: in place; staged:
// a new arena block; pageable: heap). Staging that the arena refuses falls to
// pageable.
Result<Attempt> make_attempt(EngineState& e, UploadState& s, std::uint32_t r, Path path) {
  RangeState& rs = s.rs[r];
  Attempt a;
  a.range = r;
  // Heap origins (staging was refused) are only ever copied as pageable: the
  // copy must not read memory the transfer state frees when it returns.
  a.path = rs.own_heap ? Path::pageable : path;
  if (a.path == Path::staged) {
    auto block = e.arena.allocate(rs.bytes);
    if (block.ok()) {
      std::memcpy(block->data, rs.origin, rs.bytes);
      a.temp_block = *block;
      a.src = block->data;
      a.leased_src = true;
      a.has_units = true;
      a.first_unit = a.last_unit = block->chunk;
      e.count([](IntegrityCounters& c) { ++c.staged; });
      return a;
    }
    if (block.error().code != ErrorCode::out_of_memory) return std::move(block).error();
    a.path = Path::pageable;
  }
  if (a.path == Path::pageable) {
    a.temp_heap = std::make_shared<Bytes>(rs.bytes);
    std::memcpy(a.temp_heap->data(), rs.origin, rs.bytes);
    a.src = a.temp_heap->data();
    e.count([](IntegrityCounters& c) { ++c.pageable; });
    return a;
  }
  // In place: the origin lives in a block or a registered region (or the heap,
  // when staging was refused).
  a.src = rs.origin;
  if (auto info = e.arena.locate(rs.origin, rs.bytes)) {
    if (info->retired) return make_attempt(e, s, r, e.distrusted() ? Path::pageable : Path::staged);
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

// verify: one HashOp per attempt of s.round on s.stream's verify stream, each
// behind a WaitOp for its copy (copy_at[i]; one wait per distinct point). On
// return *last is the last op enqueued there (the hashes run in line, ordered
// by the FIFO, when that verify stream is the upload stream itself).
Result<void> enqueue_hashes(EngineState& e, UploadState& s, const std::vector<StreamPoint>& copy_at,
                            StreamPoint* last) {
  const StreamId vs = e.verify_stream_of(s.stream);
  StreamPoint awaited{};
  for (std::size_t i = 0; i < s.round.size(); ++i) {
    const Attempt& a = s.round[i];
    const TransferRange& tr = s.ranges[a.range];
    if (vs != s.stream && copy_at[i] != awaited && !testing_hooks::dropped(testing_hooks::WaitSite::engine_verify)) {
      auto w = e.submit(vs, [&](StreamPoint point) -> Result<Op> {
        std::lock_guard lock(e.mu);  // a stream's submission lock, then e.mu: never the reverse
        e.verify_waits.emplace_back(point, copy_at[i]);
        return Op{WaitOp{copy_at[i]}};
      });
      if (!w.ok()) return std::move(w).error();
      awaited = copy_at[i];
      *last = *w;
    }
    std::uint64_t* slot = s.results->data() + i;
    // No make_ready(dst, vs): the hash waits for the copy, which the upload
    // stream already ordered after the block's allocation point.
    auto p = e.submit(vs, [&](StreamPoint point) -> Result<Op> {
      auto dst = e.lease_dst(tr.dst, tr.dst_offset, tr.bytes, point);
      if (!dst.ok()) return std::move(dst).error();
      // The copy's verdict is this hash: its source stays unreused until then.
      if (a.leased_src) FERRY_TRY(e.arena.lease_source(a.src, tr.bytes, point));
      return Op{HashOp{*dst, slot}};
    });
    if (!p.ok()) return std::move(p).error();
    *last = *p;
  }
  return {};
}

// Enqueues the copies of s.round on s.stream (one batch when `batch`), then,
// under verify, each attempt's HashOp on the verify stream behind an event wait
// for its copy, so the upload stream never waits for a hash (nor for whatever
// kernel occupies the engine a hash runs on). Each hash leases the destination
// and the source for its own ticket (I2, I6). Attempt-owned staging blocks are
// freed once every op that reads them is leased.
Result<void> enqueue_round(EngineState& e, UploadState& s, bool batch) {
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
    auto dst = e.lease_dst(tr.dst, tr.dst_offset, tr.bytes, p);
    if (!dst.ok()) return std::move(dst).error();
    if (a.leased_src) FERRY_TRY(e.arena.lease_source(a.src, tr.bytes, p));
    return CopyToDeviceOp{*dst, a.src};
  };
  Result<void> result;
  StreamPoint copied = s.copied;
  std::vector<StreamPoint> copy_at;  // the copy point of each attempt of the round
  copy_at.reserve(s.round.size());
  if (batch) {
    auto p = e.submit(stream, [&](StreamPoint point) -> Result<Op> {
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
      e.count([](IntegrityCounters& c) { ++c.batches; });
    } else {
      result = std::move(p).error();
    }
  } else {
    for (const Attempt& a : s.round) {
      auto p = e.submit(stream, [&](StreamPoint point) -> Result<Op> {
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
      e.count([](IntegrityCounters& c) { ++c.per_copy; });
    }
  }
  e.count([&](IntegrityCounters& c) { c.bytes_moved += moved; });
  StreamPoint last = copied;
  if (result.ok() && e.opt.policy == IntegrityPolicy::verify) {
    s.results = std::make_shared<std::vector<std::uint64_t>>(s.round.size(), 0);
    result = enqueue_hashes(e, s, copy_at, &last);
    e.park(last, s.results);  // dropped by prune() once the hashes landed
  }
  // Leased (or never enqueued): the arena keeps each block until the last op
  // that reads it completed.
  for (Attempt& a : s.round) {
    if (a.temp_block) (void)e.arena.free(a.temp_block);
    a.temp_block = {};
  }
  e.park(copied, heaps);
  s.copied = copied;
  s.last = last;
  return result;
}

// verify: blocks (bounded) until the round's copies and hashes completed: the
// copies first (which dispatches them if s.stream is held), then the held
// copies of other transfers that its hashes queue behind, then the hashes.
Result<void> wait_round(EngineState& e, const UploadState& s) {
  FERRY_TRY(e.order.wait(s.copied));
  FERRY_TRY(e.dispatch_awaited_copies(s.last));
  return e.order.wait(s.last);
}

Error corrupt_error(EngineState& e, const UploadState& s, const Attempt& last) {
  const std::uint32_t r = last.range;
  const TransferRange& tr = s.ranges[r];
  const RangeState& rs = s.rs[r];
  std::string msg = "range " + std::to_string(r) + " of " + std::to_string(s.ranges.size()) +
                    ": host " + text::range(reinterpret_cast<std::uintptr_t>(rs.origin), tr.bytes) +
                    " -> device " + text::handle(tr.dst) + " offset " +
                    std::to_string(tr.dst_offset) + ", " + std::to_string(tr.bytes) +
                    " bytes never arrived intact after " + std::to_string(rs.attempts) +
                    " attempts (" + rs.tried + ")";
  if (e.opt.policy == IntegrityPolicy::verify) {
    msg += "; device hash " + text::hex16(last.device_hash) + " != source hash " + text::hex16(rs.hash);
  }
  return make_error(ErrorCode::transfer_corrupt, msg);
}

// Builds the next round from the failed attempts (s.round; empty when none is
// retried), on the paths diagnosis chose given the bad units. Then a failed
// range out of attempts ends the transfer: transfer_corrupt naming it.
Result<void> plan_retries(EngineState& e, UploadState& s, const std::vector<Attempt>& failed,
                          const std::set<PinnedUnitId>& bad) {
  std::vector<Attempt> next;
  for (const Attempt& a : failed) {
    RangeState& rs = s.rs[a.range];
    rs.failed = true;
    if (rs.attempts >= e.opt.max_attempts) continue;
    // The last attempt is always the one that needs no pinned memory at all.
    const Path path =
        rs.attempts + 1 >= e.opt.max_attempts ? Path::pageable : next_path(e, a, a.reads_any(bad));
    auto na = make_attempt(e, s, a.range, path);
    if (!na.ok()) return std::move(na).error();
    e.count([&](IntegrityCounters& c) {
      ++c.retries;
      if (na->path != a.path) ++c.fallbacks;
    });
    ++rs.attempts;
    rs.tried += std::string(", ") + path_name(na->path);
    next.push_back(std::move(*na));
  }
  s.round = std::move(next);
  for (const Attempt& a : failed) {
    if (s.rs[a.range].attempts >= e.opt.max_attempts &&
        std::none_of(s.round.begin(), s.round.end(),
                     [&](const Attempt& n) { return n.range == a.range; })) {
      e.count([](IntegrityCounters& c) { ++c.corrupt; });
      return corrupt_error(e, s, a);
    }
  }
  return {};
}

// Every range of s, before anything is enqueued: its source lies in a live block
// or is a plain host range, its destination in a live device block. Sums s.bytes.
Result<void> check_ranges(EngineState& e, const HostArena& arena, UploadState& s) {
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
      auto info = arena.locate(tr.block.data + tr.block_offset, tr.bytes);
      if (!info || info->kind != HostRangeInfo::Kind::block ||
          info->block.serial != tr.block.serial) {
        return make_error(ErrorCode::stale_handle, what + ": its host block is not live");
      }
    } else if (tr.host == nullptr ||
               reinterpret_cast<std::uintptr_t>(tr.host) > UINTPTR_MAX - tr.bytes) {
      return make_error(ErrorCode::invalid_argument, what + ": null or wrapping host range");
    }
    FERRY_TRY(e.check_dst(what, tr.dst, tr.dst_offset, tr.bytes, s.stream));
    s.bytes += tr.bytes;
  }
  return {};
}

}  // namespace
}  // namespace detail

using detail::Attempt;
using detail::Path;
using detail::RangeState;

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

// The device may still write the hash results: enqueue_round() parked them in
// the engine's keepalive already. ~UploadState returns the staging blocks.
PendingUpload::~PendingUpload() = default;

StreamPoint PendingUpload::point() const noexcept { return state_ ? state_->last : StreamPoint{}; }

Result<PendingUpload> TransferEngine::begin_upload(StreamId stream, const TransferPlan& plan) {
  FERRY_TRY(state_->status);
  detail::EngineState& e = *state_;
  e.prune();
  FERRY_TRY(check_stream(stream, "upload"));
  auto state = std::make_unique<detail::UploadState>();
  detail::UploadState& s = *state;
  s.arena = &arena_;
  s.stream = stream;
  s.ranges.assign(plan.ranges().begin(), plan.ranges().end());
  s.rs.resize(s.ranges.size());
  s.copied = StreamPoint{stream, 0};
  s.last = s.copied;

  // Validate everything before anything is enqueued.
  FERRY_TRY(detail::check_ranges(e, arena_, s));

  const bool verify = options_.policy == IntegrityPolicy::verify;
  const bool pinned_ok = !e.distrusted();
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
        e.count([](IntegrityCounters& c) { ++c.staged; });
      } else if (block.error().code == ErrorCode::out_of_memory) {
        rs.own_heap = std::make_shared<detail::Bytes>(src, src + tr.bytes);
        rs.origin = rs.own_heap->data();
      } else {
        return std::move(block).error();
      }
    }
    if (verify) rs.hash = e.source_hashes.hash(rs.origin, rs.bytes);
  }
  // Round 0.
  for (std::uint32_t r = 0; r < s.ranges.size(); ++r) {
    RangeState& rs = s.rs[r];
    const Path path = !pinned_ok || rs.own_heap ? Path::pageable : batch ? Path::batched : Path::per_copy;
    auto a = detail::make_attempt(e, s, r, path);
    if (!a.ok()) return std::move(a).error();
    a->in_batch = batch;
    rs.attempts = 1;
    rs.tried = batch ? "batched" : detail::path_name(a->path);
    s.round.push_back(std::move(*a));
  }
  // A staged or pageable attempt in a planned batch still rides in the batch:
  // the batch is one operation over whatever sources the round holds.
  e.count([&](IntegrityCounters& c) {
    ++c.transfers;
    c.ranges += s.ranges.size();
    if (!pinned_ok) c.fallbacks += s.ranges.size();
  });
  FERRY_TRY(detail::enqueue_round(e, s, batch));

  if (options_.policy == IntegrityPolicy::probe) {
    // Canaries run now (behind the copies); failed units' copies are redone.
    for (;;) {
      std::set<PinnedUnitId> bad;
      auto failed = detail::probe_round(e, s, &bad);
      if (!failed.ok()) return std::move(failed).error();
      if (failed->empty()) break;
      FERRY_TRY(detail::plan_retries(e, s, *failed, bad));
      if (s.round.empty()) break;
      FERRY_TRY(detail::enqueue_round(e, s, false));
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
  detail::EngineState& e = *state_;
  PendingUpload own(std::move(pending));  // frees the staging blocks on every return
  detail::UploadState& s = *own.state_;
  TransferReceipt receipt;
  receipt.bytes = s.bytes;
  receipt.ranges = static_cast<std::uint32_t>(s.ranges.size());
  receipt.batched = s.batched_first;

  if (options_.policy == IntegrityPolicy::verify) {
    while (!s.round.empty()) {
      FERRY_TRY(detail::wait_round(e, s));
      std::vector<Attempt> failed;
      std::set<PinnedUnitId> suspects;
      std::uint64_t verified = 0;
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
        failed.push_back(a);
        failed.back().device_hash = got;
        if (a.has_units) {
          for (PinnedUnitId u = a.first_unit; u <= a.last_unit; ++u) suspects.insert(u);
        }
      }
      e.count([&](IntegrityCounters& c) {
        c.bytes_verified += verified;
        c.mismatches += failed.size();
      });
      if (failed.empty()) break;
      // Diagnose before choosing the next path: a failing canary convicts the
      // pinned unit, a passing one under a batch convicts the batch.
      auto bad = detail::diagnose(e, suspects, s.stream);
      if (!bad.ok()) return std::move(bad).error();
      FERRY_TRY(detail::plan_retries(e, s, failed, *bad));
      FERRY_TRY(detail::enqueue_round(e, s, false));
    }
    receipt.verified = true;
  }
  for (const RangeState& rs : s.rs) {
    if (rs.failed && options_.policy == IntegrityPolicy::probe) ++receipt.recovered;
  }
  e.count([&](IntegrityCounters& c) { c.recovered += receipt.recovered; });
  receipt.done = s.last;
  return receipt;
}

Result<TransferReceipt> TransferEngine::upload(StreamId stream, const TransferPlan& plan) {
  auto pending = begin_upload(stream, plan);
  if (!pending.ok()) return std::move(pending).error();
  return finish(std::move(*pending));
}

}  // namespace ferry
