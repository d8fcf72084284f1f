// Diagnosis: after a copy came back wrong (a hash mismatch under verify) or
// before trusting a round (a due canary under probe), working out what failed:
// the pinned unit (its canary comes back wrong: it is retired) or the batch
// (the canary passes under a batched copy: batching is disabled), and so which
// path a failed range is tried on next (report 000's probe, made general).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "transfer/upload_state.hpp"

namespace ferry::detail {

// Copies the unit's canary span to fresh device scratch (pre-filled with a
// different pattern) behind everything already on `stream`, reads it back and
// compares. Blocks (bounded). Returns true when the bytes arrived (or the unit
// was released: nothing reads it any more). Errors: those of the pool's
// allocate, of the enqueues, timeout.
Result<bool> canary(EngineState& e, PinnedUnitId unit, StreamId stream);

// Retires `unit` in the arena; counts it, and distrusts pinned memory after
// EngineOptions::distrust_pinned_after of them.
void retire_unit(EngineState& e, PinnedUnitId unit, const std::string& why);

// Runs the canaries of `units` on `stream`; retires the failing ones. Returns
// the set of bad units (already retired ones included).
Result<std::set<PinnedUnitId>> diagnose(EngineState& e, const std::set<PinnedUnitId>& units,
                                        StreamId stream);

// Chooses how a range is tried next after attempt `a` failed; unit_bad: a unit
// it read failed its canary. A batch whose sources passed disables batching.
Path next_path(EngineState& e, const Attempt& a, bool unit_bad);

// probe: canaries the units of this round that are due, behind its copies.
// Returns the attempts that read a unit whose canary failed; *bad then holds
// the bad units.
Result<std::vector<Attempt>> probe_round(EngineState& e, UploadState& s, std::set<PinnedUnitId>* bad);

}  // namespace ferry::detail
