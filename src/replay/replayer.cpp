// The run of a trace: every op in order, an observer after each, the report's totals.
#include "replay/replayer.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "core/input_file.hpp"
#include "core/testing_hooks.hpp"
#include "core/text.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/replay.hpp"
#include "ferry/runtime.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/user_op.hpp"
#include "replay/reference.hpp"
#include "replay/trace.hpp"

namespace ferry::replay_runner {

void Replayer::run(const std::function<void(const ReplayStep&)>& on_step) {
  const std::uint64_t start_ns = backend_->now_ns();
  ReplayStep step;
  step.total = trace_.ops.size();
  step.pool = pool_;
  if (on_step) {
    step.live_ids = [this] { return live_ids(); };
    step.owner_at = [this](std::uint64_t addr) -> std::string_view {
      auto it = owners_.upper_bound(addr);
      if (it == owners_.begin() || (--it)->second.first <= addr) return {};
      return trace_.ids[it->second.second];
    };
    naming_owners_ = true;
  }
  bool observing = static_cast<bool>(on_step);
  auto observe = [&](std::size_t line, std::string_view name) {
    if (!observing) return;
    step.line = line;
    step.op = name;
    step.now_ns = backend_->now_ns();
    if (!graphs_.empty()) {
      step.graph_pool_reserved_bytes = step.graph_pool_allocated_bytes = 0;
      for (const GraphPoolStats& p : GraphPool::all(runtime_)) {
        step.graph_pool_reserved_bytes += p.reserved_bytes;
        step.graph_pool_allocated_bytes += p.allocated_bytes;
      }
    }
    try {
      on_step(step);
    } catch (const std::exception& e) {
      // The replay itself goes on (and still cleans up); the observer stops.
      observing = false;
      ++report_.errors[std::string(to_string(ErrorCode::backend_error))];
      ++report_.unexpected_errors;
      add_problem(line, std::string(name), "backend_error",
                  std::string("the replay's observer failed: ") + e.what());
    }
    ++step.index;
  };
  observe(0, "start");
  for (const TraceOp& op : trace_.ops) {
    ++report_.ops;
    const Submitted before = submitted();
    try {
      execute(op);
    } catch (const std::bad_alloc&) {
      record(op, make_error(ErrorCode::out_of_memory, "the host's memory is exhausted: this op's host "
                                                      "buffers could not be allocated"));
    } catch (const std::exception& e) {
      record(op, make_error(ErrorCode::backend_error, std::string("internal error: ") + e.what()));
    }
    note_work(before, op);
    observe(op.line, replay::to_string(op.kind));
  }
  finish();
  fill_races();
  observe(0, "end");
  use_device(0);
  report_.device_time_ns = backend_->now_ns() - start_ns;
  // With several devices, the figures of all their pools together (total_pool_stats).
  const PoolStats st = runtime_.device_count() == 1 ? pool_->stats() : runtime_.total_pool_stats();
  report_.capacity = 0;
  for (std::uint32_t d = 0; d < runtime_.device_count(); ++d) report_.capacity += runtime_.device(d).pool().capacity();
  report_.peak_live_bytes = st.peak_requested_bytes;
  report_.peak_allocated_bytes = st.peak_allocated_bytes;
  report_.peak_reserved_bytes = st.peak_reserved_bytes;
  report_.ooms = st.ooms;
  report_.reclaims = st.reclaims;
  report_.ooms_survived = st.ooms_survived;
  fill_integrity();
  report_.illegal_accesses = 0;
  for (std::uint32_t d = 0; d < runtime_.device_count(); ++d) {
    report_.illegal_accesses += runtime_.device(d).backend().fault_counters().illegal_accesses;
  }
  if (report_.illegal_accesses > 0) {
    add_problem(0, "end", "illegal_access",
                std::to_string(report_.illegal_accesses) +
                    " device operations touched unmapped memory");
  }
}

}  // namespace ferry::replay_runner
