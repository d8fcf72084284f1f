// `ferry replay FILE`: replays an allocation trace (SPEC.md "Trace format").
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "cli/option_values.hpp"
#include "cli/subcommand.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/integrity.hpp"
#include "ferry/replay.hpp"

namespace ferry::cli {
namespace {

struct ReplayArgs {
  std::string file;
  std::string backend = "sim";
  std::string profile = "h200";
  std::string capacity;  // empty: the device's
  std::string seed = "1";
  std::string integrity = "verify";
  std::vector<std::string> inject;  // fault specs, in order (sim only)
  std::string report;    // empty: none; "-": stdout
  bool json = false;
};

// A CLI11 validator from one of our Result-returning parsers.
template <class Parse>
CLI::Validator checked(Parse parse, std::string name) {
  return CLI::Validator(
      [parse](std::string& value) -> std::string {
        auto r = parse(value);
        return r.ok() ? std::string() : r.error().message;
      },
      std::move(name));
}

std::string profile_list() {
  std::string s;
  for (const std::string& n : profile_names()) s += (s.empty() ? "" : "|") + n;
  return s;
}

int run_replay(const ReplayArgs& args, const Io& io) {
  ReplayOptions options;
  options.backend = args.backend;
  options.profile = args.profile;
  // The validators already accepted both values.
  if (!args.capacity.empty()) options.capacity = parse_byte_size(args.capacity).value_or(0);
  options.seed = parse_u64(args.seed).value_or(1);
  options.integrity = parse_integrity_policy(args.integrity).value_or(IntegrityPolicy::verify);
  Result<SimFaults> faults = parse_fault_specs(args.inject);
  if (!faults.ok()) {  // the validator accepted each spec; kept for safety
    io.err << "ferry replay: " << faults.error().message << '\n';
    return kExitUsage;
  }
  options.faults = *faults;
  if (options.backend != "sim" && describe(options.faults) != "none") {
    io.err << "ferry replay: --inject " << describe(options.faults)
           << ": fault injection needs --backend sim (the " << options.backend
           << " backend runs on a real device)\n";
    return kExitUsage;
  }

  // Open the report file first: a path that cannot be written is bad usage,
  // found before anything runs.
  std::ofstream report_file;
  if (!args.report.empty() && args.report != "-") {
    std::error_code ec;
    if (std::filesystem::equivalent(args.report, args.file, ec)) {
      io.err << "ferry replay: --report " << args.report << " would overwrite the trace\n";
      return kExitUsage;
    }
    report_file.open(args.report, std::ios::trunc);
    if (!report_file) {
      io.err << "ferry replay: --report: cannot write " << args.report << '\n';
      return kExitUsage;
    }
  }

  Result<ReplayReport> report = replay_trace_file(args.file, options);
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
  app->add_option("FILE", args->file, "Trace: JSON Lines, one op per line (SPEC.md \"Trace format\")")
      ->required();
  app->add_option("--backend", args->backend, "Device backend: sim|cuda")
      ->check(CLI::IsMember({"sim", "cuda"}))
      ->capture_default_str();
  app->add_option("--profile", args->profile, "Sim device profile: " + profile_list())
      ->check(checked(
          [](const std::string& name) -> Result<void> {
            if (find_profile(name)) return {};
            return make_error(ErrorCode::invalid_argument,
                              "unknown profile \"" + name + "\" (profiles: " + profile_list() + ")");
          },
          "PROFILE"))
      ->capture_default_str();
  app->add_option("--capacity", args->capacity,
                  "Pool capacity: bytes, or with a KiB|MiB|GiB|TiB suffix (default: the device's)")
      ->check(checked([](const std::string& v) { return parse_byte_size(v); }, "BYTES"));
  app->add_option("--seed", args->seed, "Seed of the sim's schedule")
      ->check(checked([](const std::string& v) { return parse_u64(v); }, "UINT"))
      ->capture_default_str();
  app->add_option("--integrity", args->integrity,
                  "Integrity policy of every upload: off (trust the copy), probe (canary\n"
                  "copies out of each pinned chunk), verify (device hash of every upload,\n"
                  "retried through another path on a mismatch)")
      ->check(CLI::IsMember({"off", "probe", "verify"}))
      ->capture_default_str();
  app->add_option("--inject", args->inject,
                  "Sim faults, repeatable or comma-separated: pinned-noop[:P],\n"
                  "batch-broken, batch-missing, fail-map:N, delay:NS, none")
      ->check(checked(
          [](const std::string& v) -> Result<void> {
            // CLI11 names the option already: "--inject: item 'x': ...".
            Result<SimFaults> f = parse_fault_spec(v);
            if (f.ok()) return {};
            Error e = std::move(f).error();
            if (e.message.rfind("--inject ", 0) == 0) e.message.erase(0, 9);
            return e;
          },
          ""))
      ->type_name("SPEC")
      ->allow_extra_args(false);
  app->add_option("--report", args->report, "Also write the JSON report to FILE ('-': stdout)")
      ->type_name("FILE");
  app->add_flag("--json", args->json, "Print the JSON report on stdout instead of the summary");
  app->footer(
      "Blank lines in a trace are ignored. The whole trace is checked before anything runs.\n"
      "Uploads go from the host arena through the transfer engine under --integrity; an upload\n"
      "that never arrives intact is a transfer_corrupt error. --inject works with the sim only.\n"
      "Exit status: 0 every check matched and every error was expected; 1 a check was corrupt,\n"
      "an error was unexpected or an expected error did not happen; 2 malformed trace (FILE:LINE:\n"
      "what is wrong), bad option, or a backend this machine does not have.");
  return {app, [args](const Io& io) { return run_replay(*args, io); }};
}

}  // namespace ferry::cli
