// `ferry replay FILE`: replays an allocation trace (docs/spec.md §3).
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common_options.hpp"
#include "option_values.hpp"
#include "progress.hpp"
#include "subcommand.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/integrity.hpp"
#include "ferry/replay.hpp"

namespace ferry::cli {
namespace {

struct ReplayArgs {
  std::string file;
  BackendKind backend = BackendKind::sim;
  std::string profile = "h200";
  std::string capacity;  // empty: the device's
  std::string seed = "1";
  std::string integrity = "verify";
  std::vector<std::string> inject;  // fault specs, in order (sim only)
  std::string report;    // empty: none; "-": stdout
  bool json = false;
  bool race_check = false;
  bool strict = false;
  bool quiet = false;
  int device = -1;  // a PyTorch snapshot's device; -1: the one with the most entries
};

int run_replay(const ReplayArgs& args, const Io& io) {
  ReplayOptions options;
  options.backend.kind = args.backend;
  options.backend.profile = args.profile;
  // The validators already accepted both values.
  if (!args.capacity.empty()) options.capacity = parse_byte_size(args.capacity).value_or(0);
  options.backend.seed = parse_u64(args.seed).value_or(1);
  options.integrity = parse_integrity_policy(args.integrity).value_or(IntegrityPolicy::verify);
  Result<SimFaults> faults = parse_fault_specs(args.inject);
  if (!faults.ok()) {  // the validator accepted each spec; kept for safety
    io.err << "ferry replay: " << faults.error().message << '\n';
    return kExitUsage;
  }
  options.backend.faults = *faults;
  options.backend.race_check = args.race_check;
  options.strict = args.strict;
  if (args.device >= 0) options.snapshot_device = args.device;
  if (const std::string why = fault_refusal(args.backend, *faults); !why.empty()) {
    io.err << "ferry replay: --inject " << describe(*faults) << ": " << why << '\n';
    return kExitUsage;
  }

  // Open the report file first: a path that cannot be written is bad usage,
  // found before anything runs.
  std::ofstream report_file;
  if (!args.report.empty() && args.report != "-") {
    if (const std::string why = overwrite_refusal("--report", args.report, args.file, "the trace"); !why.empty()) {
      io.err << "ferry replay: " << why << '\n';
      return kExitUsage;
    }
    report_file.open(args.report, std::ios::trunc);
    if (!report_file) {
      io.err << "ferry replay: --report: cannot write " << args.report << '\n';
      return kExitUsage;
    }
  }

  if (const std::string warning = capacity_clamp_warning(options.capacity, args.backend, args.profile);
      !warning.empty()) {
    io.err << "ferry replay: " << warning << '\n';
  }
  Progress progress(io.err, is_terminal(io.err), "replay", Progress::Lines::none);
  if (!args.quiet) {
    options.on_step = [&progress](const ReplayStep& step) { progress.update("ops", step.index, step.total + 1); };
  }
  Result<ReplayReport> report = replay_trace_file(args.file, options);
  progress.finish();
  if (!report.ok()) {
    const Error& e = report.error();
    if (e.code == ErrorCode::invalid_argument) {
      io.err << e.message << '\n';  // "FILE:LINE: what is wrong" lines, or the bad option
      return kExitUsage;
    }
    io.err << "ferry replay: " << e.message << '\n';
    // A backend this machine lacks is a bad option for this machine.
    return e.code == ErrorCode::unsupported ? kExitUsage : kExitFailed;
  }

  const std::string json = report_json(*report);
  const bool json_on_stdout = args.json || args.report == "-";
  if (json_on_stdout) {
    io.out << json << '\n';
  } else {
    io.out << report_summary(*report);
  }
  if (report_file.is_open()) {
    report_file << json << '\n';
    report_file.flush();
    if (!report_file) {
      io.err << "ferry replay: --report: writing " << args.report << " failed\n";
      return kExitFailed;
    }
  }
  return report->passed() ? kExitOk : kExitFailed;
}

}  // namespace

Subcommand add_replay(CLI::App& parent) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* app = parent.add_subcommand(
      "replay", "Replay an allocation trace against the device pool and check every byte");
  add_trace_argument(*app, "FILE", args->file);
  add_backend_option(*app, args->backend);
  add_profile_option(*app, args->profile);
  add_capacity_option(*app, args->capacity, "the trace's meta capacity, else the device's");
  add_seed_option(*app, args->seed, "Seed of the sim's schedule");
  app->add_option("--integrity", args->integrity,
                  "Integrity policy of every upload: off (trust the copy), probe (canary\n"
                  "copies out of each pinned chunk), verify (device hash of every upload,\n"
                  "retried through another path on a mismatch)")
      ->check(CLI::IsMember({"off", "probe", "verify"}))
      ->capture_default_str();
  add_inject_option(*app, args->inject);
  app->add_flag("--race-check", args->race_check,
                "Report every pair of unordered conflicting accesses from different streams\n"
                "(sim only; docs/spec.md section 9): exit 1 when one is found");
  app->add_flag("--strict", args->strict,
                "Insert no cross-stream wait: only the trace's own `wait` ops order streams,\n"
                "so a recorded program's ordering bug shows (as a race under --race-check; with\n"
                "verify or probe the races are also sought with uploads asynchronous, as on a GPU)");
  add_report_options(*app, args->report, args->json);
  app->add_flag("--quiet", args->quiet, "No progress bar on a terminal's stderr");
  app->add_option("--device", args->device,
                  "FILE is a PyTorch memory snapshot: replay this device's history\n"
                  "(default: the device with the most entries)")
      ->check(CLI::Range(0, 1 << 20));
  app->footer(
      "FILE may be a PyTorch memory snapshot (recognised by its content, a pickle): its history is\n"
      "imported (`ferry import torch-snapshot`) and the report's `source` says what PyTorch saw.\n"
      "Blank lines in a trace are ignored. The whole trace is checked before anything runs;\n"
      "a trace with no ops (blank lines and a meta line are not ops) is refused: it checks nothing.\n"
      "A trace is a regular file of at most 1 GiB, each line at most 1 MiB; an optional first\n"
      "line {\"op\":\"meta\",\"capacity\":N} gives the capacity used when --capacity is not;\n"
      "its \"devices\":N (and \"links\") replay the trace on N sim devices, each op on its \"device\"\n"
      "(docs/spec.md section 3; `ferry snapshot` draws device 0's pool).\n"
      "On a terminal a progress bar goes to stderr (not with --quiet).\n"
      "Uploads go from the host arena through the transfer engine under --integrity; an upload\n"
      "that never arrives intact is a transfer_corrupt error. --inject works with the sim only.\n"
      "Exit status: 0 every check matched and every error was expected; 1 a check was corrupt,\n"
      "an error was unexpected, an expected error did not happen or (--race-check) a race was\n"
      "found; 2 malformed trace (FILE:LINE:\n"
      "what is wrong) or one with no ops, bad option, or a backend this machine does not have.");
  return {app, [args](const Io& io) { return run_replay(*args, io); }};
}

}  // namespace ferry::cli
