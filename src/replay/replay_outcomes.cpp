// What a replay reports: errors and problems, races named by trace line,
// integrity counters; and the end of a run.
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

Replayer::Submitted Replayer::submitted() const {
  Submitted out;
  if (!racing_) return out;
  out.resize(runtime_.device_count());
  for (std::uint32_t d = 0; d < out.size(); ++d) {
    for (StreamId s = 0; s < kMaxStreams; ++s) out[d][s] = runtime_.device(d).backend().submitted(s);
  }
  return out;
}

void Replayer::note_work(const Submitted& before, const TraceOp& op) {
  if (!racing_) return;
  const Submitted after = submitted();
  for (std::uint32_t d = 0; d < after.size(); ++d) {
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      if (after[d][s] > before[d][s]) work_[d][s].push_back({before[d][s] + 1, &op});
    }
  }
}

const TraceOp* Replayer::op_of(std::uint32_t device, StreamPoint p) const {
  if (device >= work_.size()) return nullptr;
  const auto& runs = work_[device][p.stream];
  auto it = std::upper_bound(runs.begin(), runs.end(), p.ticket,
                             [](Ticket t, const WorkRun& r) { return t < r.first; });
  if (it == runs.begin()) return nullptr;
  return std::prev(it)->op;
}

void Replayer::fill_races() {
  const std::shared_ptr<const RaceLog> log = backend_->race_log();
  if (!log) return;
  report_.race_checked = true;
  report_.races = log->count;
  for (const Race& r : log->kept) {
    ReplayRace rr;
    rr.addr = r.addr;
    rr.bytes = r.bytes;
    rr.reuse = r.reuse;
    for (auto [side, out] : {std::pair{&r.earlier, &rr.earlier}, std::pair{&r.later, &rr.later}}) {
      const TraceOp* op = op_of(side->device, side->op);
      out->line = op != nullptr ? op->line : 0;
      out->op = op != nullptr ? std::string(replay::to_string(op->kind)) : "end";
      out->kind = std::string(side->kind);
      out->access = std::string(to_string(side->access));
      out->point = side->op;
      out->id = side->block.tag;  // the trace's id (alloc() tags each block with it)
      out->device = side->device;
    }
    report_.race_list.push_back(std::move(rr));
  }
  if (report_.races > 0) {
    const ReplayRace& first = report_.race_list.front();
    add_problem(first.later.line, first.later.op, "race",
                text::count(report_.races, "unordered conflicting access", "unordered conflicting accesses") +
                    "; the first: line " +
                    std::to_string(first.earlier.line) + " and line " + std::to_string(first.later.line));
  }
}

std::vector<ReplayLiveId> Replayer::live_ids() const {
  std::vector<ReplayLiveId> out;
  for (std::size_t i = 0; i < buffers_.size(); ++i) {
    if (buffers_[i].allocated) out.push_back({trace_.ids[i], buffers_[i].handle});
  }
  return out;
}

void Replayer::record(const TraceOp& op, const Error& e) {
  const std::string code(to_string(e.code));
  ++report_.errors[code];
  if (e.code == ErrorCode::out_of_memory && report_.first_oom.line == 0) {
    report_.first_oom = {op.line, std::string(replay::to_string(op.kind)), code, e.message};
  }
  if (op.expect == e.code) {
    ++report_.expected_errors;
    return;
  }
  ++report_.unexpected_errors;
  add_problem(op.line, op, code, e.message);
}

void Replayer::expect_success(const TraceOp& op) {
  if (!op.expect) return;
  ++report_.unexpected_successes;
  add_problem(op.line, op, "unexpected_success",
              "expected " + std::string(to_string(*op.expect)) + " but the op succeeded");
}

void Replayer::add_problem(std::size_t line, const TraceOp& op, std::string what, std::string message) {
  add_problem(line, std::string(replay::to_string(op.kind)), std::move(what), std::move(message));
}

void Replayer::add_problem(std::size_t line, std::string op, std::string what, std::string message) {
  if (report_.problems.size() >= ReplayReport::kMaxProblems) return;
  report_.problems.push_back({line, std::move(op), std::move(what), std::move(message)});
}

void Replayer::fill_integrity() {
  IntegrityCounters c = engine_->counters();  // device 0's, plus the other devices' counts
  for (std::uint32_t d = 1; d < runtime_.device_count(); ++d) {
    const IntegrityCounters o = runtime_.device(d).engine().counters();
    c.bytes_moved += o.bytes_moved;
    c.bytes_verified += o.bytes_verified;
    c.mismatches += o.mismatches;
    c.retries += o.retries;
    c.fallbacks += o.fallbacks;
    c.recovered += o.recovered;
    c.corrupt += o.corrupt;
    c.units_retired += o.units_retired;
  }
  ReplayIntegrity& i = report_.integrity;
  i.policy = engine_->policy();
  i.bytes_moved = c.bytes_moved;
  i.bytes_verified = c.bytes_verified;
  i.mismatches = c.mismatches;
  i.retries = c.retries;
  i.fallbacks = c.fallbacks;
  i.recovered = c.recovered;
  i.corrupt = c.corrupt;
  i.units_retired = c.units_retired;
  i.batched_disabled = c.batched_disabled;
  const BatchProbeReport probe = engine_->startup_probe();
  i.batch_probe = !probe.ran ? "not run" : probe.passed ? "passed" : "failed";
  i.batching_note = c.batched_disabled ? engine_->batching_disabled_reason() : probe.detail;
}

void Replayer::finish() {
  use_device(0);
  close_graphs();
  bool synchronized = true;
  for (std::uint32_t d = 0; d < runtime_.device_count(); ++d) {
    Backend& backend = runtime_.device(d).backend();
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      if (backend.held(s)) backend.set_hold(s, false);
    }
  }
  for (std::uint32_t d = 0; d < runtime_.device_count() && synchronized; ++d) {
    if (Result<void> r = runtime_.device(d).backend().synchronize(); !r.ok()) {
      synchronized = false;
      ++report_.errors[std::string(to_string(r.error().code))];
      ++report_.unexpected_errors;
      add_problem(0, "end", std::string(to_string(r.error().code)),
                  "synchronizing at the end of the trace: " + r.error().message);
    }
  }
  if (synchronized) compare_pending_checks(std::nullopt);
  for (Buffer& b : buffers_) {
    if (b.allocated) (void)runtime_.device(b.device).pool().free(b.handle);
    b.allocated = false;
  }
  copy_targets_.clear();
}

void Replayer::name_owner(std::uint64_t start, std::uint64_t end, IdIndex id) {
  auto it = owners_.lower_bound(start);
  if (it != owners_.begin()) {
    auto before = std::prev(it);
    if (before->second.first > start) {  // an older range reaching into [start, end): keep its ends
      const auto [old_end, old_id] = before->second;
      before->second.first = start;
      if (old_end > end) owners_[end] = {old_end, old_id};
    }
  }
  for (it = owners_.lower_bound(start); it != owners_.end() && it->first < end;) {
    const auto [old_end, old_id] = it->second;
    it = owners_.erase(it);
    if (old_end > end) {
      owners_[end] = {old_end, old_id};
      break;
    }
  }
  owners_[start] = {end, id};
}

}  // namespace ferry::replay_runner
