// The start-up probe of the batched copy, run by the engine's constructor on
// every policy (a capability check): a canary batch copied twice from an arena
// block into device scratch and read back, since some drivers honour only the
// first batch. Its verdict turns batching on or off for the engine's life
// (a later failed batch can still turn it off: diagnosis.hpp).
#pragma once

#include "transfer/engine_state.hpp"

namespace ferry::detail {

// Decides whether the engine batches: off when EngineOptions::allow_batching
// is false or the backend has no native batched copy; else on only when the
// probe (on EngineOptions::probe_stream; once more on a fresh chunk if it could
// not run) passed. Sets e.batching, e.batch_reason, e.probe_report and
// counters.batched_disabled. Blocks (bounded). A probe that cannot run is no
// error: batching is just off.
void decide_batching(EngineState& e);

}  // namespace ferry::detail
