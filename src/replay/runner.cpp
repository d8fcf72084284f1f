// The entry points of a replay (replay.hpp): a trace's text or file, parsed (or
// imported from a PyTorch snapshot), run by a Replayer (replay/replayer.hpp) on
// a Runtime made for it.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "core/input_file.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/replay.hpp"
#include "ferry/runtime.hpp"
#include "ferry/torch_snapshot.hpp"
#include "replay/replayer.hpp"
#include "replay/trace.hpp"

namespace ferry {
namespace {

using replay::Trace;
using replay_runner::Replayer;

Result<ReplayReport> replay_once(const Trace& trace, const ReplayOptions& options);

bool same_race(const ReplayRace& a, const ReplayRace& b) {
  return a.earlier.line == b.earlier.line && a.later.line == b.later.line && a.addr == b.addr &&
         a.earlier.device == b.earlier.device && a.later.device == b.later.device;
}

// --strict --race-check is "races by stream order alone", but a verified upload
// blocks the host until its hash matched, which orders whatever the host issues
// next. So under a checking policy the trace is raced once more with uploads
// asynchronous (integrity off, no faults: only the order is under test), and the
// races only that run has are added, marked as ordered by verification.
Result<ReplayReport> run(const Trace& trace, const ReplayOptions& options) {
  Result<ReplayReport> report = replay_once(trace, options);
  if (!report.ok() || !options.strict || !options.backend.race_check || options.integrity == IntegrityPolicy::off) {
    return report;
  }
  ReplayOptions by_order = options;
  by_order.integrity = IntegrityPolicy::off;
  by_order.backend.faults = {};
  by_order.on_step = nullptr;
  Result<ReplayReport> unverified = replay_once(trace, by_order);
  if (!unverified.ok()) return report;  // it set up once: a second set-up failing says nothing about order
  std::uint64_t added = 0;
  for (ReplayRace& race : unverified->race_list) {
    const auto known = [&](const ReplayRace& r) { return same_race(r, race); };
    if (std::any_of(report->race_list.begin(), report->race_list.end(), known)) continue;
    race.ordered_by_verification = true;
    report->race_list.push_back(std::move(race));
    ++added;
  }
  if (added > 0) {
    const bool had = report->races > 0;
    report->races += added;
    report->race_checked = true;
    if (!had && report->problems.size() < ReplayReport::kMaxProblems) {
      const ReplayRace& first = report->race_list.front();
      // Problems are in trace order (the end, line 0, last).
      const auto after = std::find_if(report->problems.begin(), report->problems.end(), [&](const ReplayProblem& p) {
        return p.line == 0 || (first.later.line != 0 && p.line > first.later.line);
      });
      report->problems.insert(after, {first.later.line, first.later.op, "race",
                                  std::to_string(added) + " unordered conflicting access" + (added == 1 ? "" : "es") +
                                      " that only a verified upload's host wait ordered; the first: line " +
                                      std::to_string(first.earlier.line) + " and line " +
                                      std::to_string(first.later.line)});
    }
  }
  return report;
}

Result<ReplayReport> replay_once(const Trace& trace, const ReplayOptions& options) {
  ReplayReport report;
  report.trace = trace.name;
  report.seed = options.backend.seed;
  report.faults = describe(options.backend.faults);

  RuntimeOptions ro;
  ro.backend = options.backend;
  ro.pool.capacity = options.capacity != 0 || !options.trace_capacity ? options.capacity : trace.capacity.value_or(0);
  ro.engine.policy = options.integrity;  // the engine's start-up probe runs under every policy
  ro.devices.count = trace.devices;  // each with the options' profile (sim) and pool capacity
  ro.devices.links = trace.links;
  Result<std::unique_ptr<Runtime>> made = Runtime::create(std::move(ro));
  if (!made.ok()) return std::move(made).error();
  Runtime& runtime = **made;
  const DeviceInfo& info = runtime.backend().info();
  report.backend = std::string(to_string(info.backend));
  report.modeled_time = info.modeled_time;
  report.device = info.device;
  report.devices = runtime.device_count();
  Replayer(trace, runtime, report, options.strict).run(options.on_step);
  return report;
}

}  // namespace

Result<ReplayReport> replay_trace_text(std::string_view text, std::string_view name,
                                       const ReplayOptions& options) {
  try {
    FERRY_TRY(check_spec(options.backend));  // before anything is parsed or run
    if (is_torch_snapshot(text)) {
      Result<TorchSnapshotImport> imported = import_torch_snapshot(text, name, options.snapshot_device);
      if (!imported.ok()) return std::move(imported).error();
      Result<Trace> trace = replay::parse_trace(imported->trace, name);
      if (!trace.ok()) return std::move(trace).error();
      Result<ReplayReport> report = run(*trace, options);
      if (report.ok()) report->source = imported->source;
      return report;
    }
    Result<Trace> trace = replay::parse_trace(text, name);
    if (!trace.ok()) return std::move(trace).error();
    return run(*trace, options);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::backend_error, std::string("replay failed: ") + e.what());
  }
}

Result<std::string> read_trace_file(const std::string& path) {
  return read_input_file(path, kMaxTraceBytes, "a trace");
}

Result<ReplayReport> replay_trace_file(const std::string& path, const ReplayOptions& options) {
  try {
    FERRY_TRY(check_spec(options.backend));  // before anything is parsed or run
    Result<std::string> text = read_trace_file(path);
    if (!text.ok()) return std::move(text).error();
    return replay_trace_text(*text, path, options);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::backend_error, std::string("replay failed: ") + e.what());
  }
}

}  // namespace ferry
