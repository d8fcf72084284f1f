// Diagnosis (diagnosis.hpp): the per-unit canary copy, retiring a unit that
// fails it, the verdict on a failed copy (the unit or the batch) and the path
// it takes next, and the probe policy's schedule of canaries.
#include "transfer/diagnosis.hpp"

#include <cstring>

#include "ferry/content.hpp"

namespace ferry::detail {

Result<bool> canary(EngineState& e, PinnedUnitId unit, StreamId stream) {
  auto span = e.arena.canary(unit);
  if (!span) return true;  // released: nothing reads it any more
  auto scratch = e.pool.allocate_internal(span->bytes, stream);
  if (!scratch.ok()) return std::move(scratch).error();
  // A seed whose pattern differs from the canary bytes, so a dropped copy shows.
  std::uint64_t seed = 0;
  {
    std::lock_guard lock(e.mu);
    seed = e.canary_seed = splitmix64(e.canary_seed);
  }
  Bytes fill(span->bytes);
  for (;; ++seed) {
    fill_pattern(seed, 0, fill);
    if (std::memcmp(fill.data(), span->expected.data(), span->bytes) != 0) break;
  }
  auto readback = std::make_shared<Bytes>(span->bytes);
  auto finish = [&](Result<bool> r) -> Result<bool> {
    (void)e.pool.free(*scratch);  // stream-ordered: legal with the work in flight
    return r;
  };
  if (auto f = enqueue_fill(e.pool, stream, *scratch, seed); !f.ok()) {
    return finish(std::move(f).error());
  }
  auto copy = e.submit(stream, [&](StreamPoint p) -> Result<Op> {
    auto dst = e.lease_dst(*scratch, 0, span->bytes, p);
    if (!dst.ok()) return std::move(dst).error();
    FERRY_TRY(e.arena.lease_unit(unit, p));
    return Op{CopyToDeviceOp{*dst, span->data}};
  });
  if (!copy.ok()) return finish(std::move(copy).error());
  auto back = enqueue_copy_to_host(e.pool, stream, *scratch, *readback);
  if (!back.ok()) return finish(std::move(back).error());
  const StreamPoint point{stream, *back};
  if (auto w = e.order.wait(point); !w.ok()) {
    e.park(point, readback);
    return finish(std::move(w).error());
  }
  const bool ok = std::memcmp(readback->data(), span->expected.data(), span->bytes) == 0;
  e.count([&](IntegrityCounters& c) {
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
    std::lock_guard lock(e.mu);
    auto& up = e.unit_probe[unit];
    up.probed = true;
    up.transfers = 0;
    up.bytes = 0;
  }
  return finish(ok);
}

void retire_unit(EngineState& e, PinnedUnitId unit, const std::string& why) {
  auto r = e.arena.retire(unit, why);
  if (r.ok() && *r) {
    std::lock_guard lock(e.mu);
    ++e.counters.units_retired;
    if (e.counters.units_retired >= e.opt.distrust_pinned_after) e.counters.pinned_distrusted = true;
  }
}

Result<std::set<PinnedUnitId>> diagnose(EngineState& e, const std::set<PinnedUnitId>& units,
                                        StreamId stream) {
  std::set<PinnedUnitId> bad;
  for (PinnedUnitId u : units) {
    if (e.arena.retired(u)) {
      bad.insert(u);
      continue;
    }
    auto ok = canary(e, u, stream);
    if (!ok.ok()) return std::move(ok).error();
    if (!*ok) {
      bad.insert(u);
      retire_unit(e, u, "canary copy came back wrong (report 000: pinned copy silently dropped)");
    }
  }
  return bad;
}

Path next_path(EngineState& e, const Attempt& a, bool unit_bad) {
  if (unit_bad) return e.distrusted() ? Path::pageable : Path::staged;
  if (a.in_batch) {
    e.disable_batching("a batched copy failed verification while its source's canary passed");
    return a.path == Path::pageable ? Path::pageable : Path::per_copy;
  }
  return Path::pageable;
}

Result<std::vector<Attempt>> probe_round(EngineState& e, UploadState& s, std::set<PinnedUnitId>* bad) {
  std::set<PinnedUnitId> due;
  {
    std::lock_guard lock(e.mu);
    std::set<PinnedUnitId> touched;
    for (const Attempt& a : s.round) {
      if (!a.has_units) continue;
      for (PinnedUnitId u = a.first_unit; u <= a.last_unit; ++u) {
        auto& up = e.unit_probe[u];
        up.bytes += s.rs[a.range].bytes;
        if (touched.insert(u).second) ++up.transfers;
        // A redone copy is always checked: it replaces one that was lost.
        if (s.rs[a.range].failed) due.insert(u);
      }
    }
    for (PinnedUnitId u : touched) {
      const auto& up = e.unit_probe[u];
      if (e.counters.probe_escalated || !up.probed || up.transfers >= e.opt.probe_every_transfers ||
          up.bytes >= e.opt.probe_every_bytes) {
        due.insert(u);
      }
    }
  }
  std::vector<Attempt> failed;
  if (due.empty()) return failed;
  auto diag = diagnose(e, due, s.stream);
  if (!diag.ok()) return std::move(diag).error();
  *bad = std::move(*diag);
  if (bad->empty()) return failed;
  for (const Attempt& a : s.round) {
    if (a.reads_any(*bad)) failed.push_back(a);
  }
  e.count([&](IntegrityCounters& c) { c.mismatches += failed.size(); });
  return failed;
}

}  // namespace ferry::detail
