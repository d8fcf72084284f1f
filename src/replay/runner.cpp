// The entry points of a replay (replay.hpp): a trace's text or file, parsed (or
// imported from a PyTorch snapshot), run by a Replayer (replay/replayer.hpp) on
// a Runtime made for it.
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

Result<ReplayReport> run(const Trace& trace, const ReplayOptions& options) {
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
