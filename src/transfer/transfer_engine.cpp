// TransferEngine itself: the constructor's checks of its options and its
// start-up probe, the destructor's wait for what the device still touches,
// and the queries of its state. The jobs live in their own files:
// transfer_plan.cpp, upload_rounds.cpp (the upload path), diagnosis.cpp,
// batch_probe.cpp (the start-up probe), verified_copy.cpp (download and
// device-to-device copy), source_hash_cache.cpp.
#include "ferry/transfer_engine.hpp"

#include <string>
#include <utility>
#include <vector>

#include "transfer/batch_probe.hpp"
#include "transfer/engine_state.hpp"

namespace ferry {

TransferEngine::TransferEngine(DevicePool& pool, HostArena& arena, EngineOptions options)
    : pool_(pool), arena_(arena), options_(options),
      state_(std::make_unique<detail::EngineState>(pool, arena, options_)) {
  detail::EngineState& e = *state_;
  if (&arena.order() != &pool.order()) {
    e.status = make_error(ErrorCode::invalid_argument,
                          "transfer engine: the pool and the arena use different StreamOrders");
    return;
  }
  if (options_.max_attempts == 0) options_.max_attempts = 1;
  if (options_.probe_every_transfers == 0) options_.probe_every_transfers = 1;
  if (Result<void> s = check_stream(options_.probe_stream, "transfer engine: probe_stream"); !s.ok()) {
    e.status = std::move(s).error();
    return;
  }
  if (options_.verify_streams == 0) options_.verify_streams = 1;
  if (options_.verify_stream >= kMaxStreams ||
      options_.verify_streams > options_.verify_stream + 1) {
    e.status = make_error(
        ErrorCode::invalid_argument,
        "transfer engine: verify streams " + std::to_string(options_.verify_stream) + " down to " +
            std::to_string(std::int64_t{options_.verify_stream} - options_.verify_streams + 1) +
            " (verify_stream " + std::to_string(options_.verify_stream) + ", verify_streams " +
            std::to_string(options_.verify_streams) + ") are out of range (streams are 0.." +
            std::to_string(kMaxStreams - 1) + ")");
    return;
  }
  detail::decide_batching(e);
}

TransferEngine::~TransferEngine() {
  // Wait for what the device may still write into (hash results, bounce buffers).
  std::vector<std::pair<StreamPoint, std::shared_ptr<void>>> keep;
  {
    std::lock_guard lock(state_->mu);
    keep = std::move(state_->keepalive);
  }
  for (auto& [point, what] : keep) {
    if (!state_->dispatch_awaited_copies(point).ok() || !state_->order.wait(point).ok()) {
      // Never completes: leaking beats freeing memory the device still writes.
      new std::shared_ptr<void>(std::move(what));  // NOLINT: deliberate leak
    }
  }
}

const Result<void>& TransferEngine::status() const noexcept { return state_->status; }

bool TransferEngine::batching_enabled() const noexcept { return state_->batching.load(); }

std::string TransferEngine::batching_disabled_reason() const {
  std::lock_guard lock(state_->mu);
  return state_->batching.load() ? std::string{} : state_->batch_reason;
}

BatchProbeReport TransferEngine::startup_probe() const {
  std::lock_guard lock(state_->mu);
  return state_->probe_report;
}

IntegrityCounters TransferEngine::counters() const {
  std::lock_guard lock(state_->mu);
  IntegrityCounters c = state_->counters;
  c.batched_disabled = !state_->batching.load();
  return c;
}

}  // namespace ferry
