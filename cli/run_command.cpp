// `ferry run NAME`: runs one of the seed workloads end to end and checks its
// output against the host reference (docs/spec.md §7).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common_options.hpp"
#include "option_values.hpp"
#include "progress.hpp"
#include "subcommand.hpp"
#include "ferry/devices.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/integrity.hpp"
#include "ferry/workload.hpp"

namespace ferry::cli {
namespace {

struct RunArgs {
  std::string workload;
  BackendKind backend = BackendKind::sim;
  std::string profile = "h200";
  double scale = 0;
  std::string capacity;
  double pressure = 0.83;
  std::string integrity = "verify";
  std::vector<std::string> inject;
  std::uint32_t devices = 1;
  std::uint32_t inject_device = 0;
  std::string links = "auto";
  std::string policy = "lru";
  std::string prefetch = "on";
  bool host_exec = false;
  bool race_check = false;
  std::string matmul = "auto";
  std::uint32_t slots = 0;
  std::string weights;
  std::string save_weights;
  std::string bank = "registered";
  std::string seed = "1";
  std::string report;
  bool json = false;
  bool quiet = false;
  // Options given on the command line (not defaulted), set after parsing.
  std::vector<std::string> given;
  bool was_given(const std::string& option) const {
    return std::find(given.begin(), given.end(), option) != given.end();
  }
};

// The options only one workload reads, and it.
struct WorkloadOnlyOption {
  const char* option;
  WorkloadKind workload;
};
constexpr WorkloadOnlyOption kWorkloadOnly[] = {
    {"--policy", WorkloadKind::moe_offload},
    {"--slots", WorkloadKind::moe_offload},
    {"--host-exec", WorkloadKind::moe_offload},
};

int run_run(const RunArgs& args, const Io& io) {
  const std::string me = "ferry run: ";
  Result<WorkloadKind> kind = parse_workload(args.workload);
  if (!kind.ok()) {
    io.err << me << kind.error().message << '\n';
    return kExitUsage;
  }
  WorkloadOptions o;
  o.backend = args.backend;
  o.profile = args.profile;
  o.scale = args.scale;
  o.target_pressure = args.pressure;
  // The validators already accepted these values.
  if (!args.capacity.empty()) o.capacity = parse_byte_size(args.capacity).value_or(0);
  o.integrity = parse_integrity_policy(args.integrity).value_or(IntegrityPolicy::verify);
  o.policy = parse_eviction_policy(args.policy).value_or(EvictionPolicy::lru);
  o.prefetch = args.prefetch == "on";
  o.host_exec = args.host_exec;
  o.race_check = args.race_check;
  o.matmul = parse_matmul_kind(args.matmul).value_or(MatmulKind::automatic);
  o.cache_slots = args.slots;
  o.weights_path = args.weights;
  o.placement = parse_bank_placement(args.bank).value_or(BankPlacement::registered);
  o.seed = parse_u64(args.seed).value_or(1);
  Result<SimFaults> faults = parse_fault_specs(args.inject);
  if (!faults.ok()) {  // the validator accepted each spec; kept for safety
    io.err << me << faults.error().message << '\n';
    return kExitUsage;
  }
  o.faults = *faults;
  o.devices = args.devices;
  if (args.was_given("--inject-device")) {
    if (args.inject.empty()) {
      io.err << me << "--inject-device says which device --inject's faults go on; give --inject too\n";
      return kExitUsage;
    }
    if (args.inject_device >= args.devices) {
      io.err << me << "--inject-device " << args.inject_device << ": the run has devices 0 to " << args.devices - 1
             << " (--devices " << args.devices << ")\n";
      return kExitUsage;
    }
    o.fault_device = args.inject_device;
  }
  if (args.links != "auto") {
    // The validator accepted it: "none" or pairs.
    o.links = args.links == "none" ? std::vector<PeerLinkSpec>{}
                                   : parse_peer_links(args.links).value_or(std::vector<PeerLinkSpec>{});
  }
  if (const std::string why = fault_refusal(args.backend, *faults); !why.empty()) {
    io.err << me << "--inject " << describe(*faults) << ": " << why << '\n';
    return kExitUsage;
  }
  // An option the workload does not read is refused, never silently ignored.
  for (const WorkloadOnlyOption& only : kWorkloadOnly) {
    if (args.was_given(only.option) && *kind != only.workload) {
      io.err << me << only.option << " applies to " << to_string(only.workload) << " only\n";
      return kExitUsage;
    }
  }
  if (args.was_given("--pressure") && !args.capacity.empty()) {
    io.err << me << "--pressure sizes the pool when --capacity is not given; give one of them\n";
    return kExitUsage;
  }
  if (!args.save_weights.empty() && !args.weights.empty()) {
    io.err << me << "--save-weights writes the synthetic bank; it cannot be combined with --weights\n";
    return kExitUsage;
  }
  if (const std::string why = overwrite_refusal("--report", args.report, args.weights, "the --weights file");
      !why.empty()) {
    io.err << me << why << '\n';
    return kExitUsage;
  }
  if (!backend_built(args.backend)) {
    io.err << me << "the " << to_string(args.backend) << " backend is not available: this ferry was built without it\n";
    return kExitUsage;
  }

  if (!args.save_weights.empty()) {
    Result<void> w = write_workload_weights(*kind, o, args.save_weights);
    if (!w.ok()) {
      io.err << me << w.error().message << '\n';
      return kExitUsage;
    }
    io.out << "wrote the " << args.workload << " weights (scale "
           << (o.scale == 0 ? default_scale(*kind) : o.scale) << ", seed " << o.seed << ") to "
           << args.save_weights << '\n';
    return kExitOk;
  }

  std::ofstream report_file;
  if (!args.report.empty() && args.report != "-") {
    report_file.open(args.report, std::ios::trunc);
    if (!report_file) {
      io.err << me << "--report: cannot write " << args.report << '\n';
      return kExitUsage;
    }
  }

  if (const std::string warning = capacity_clamp_warning(o.capacity, args.backend, args.profile); !warning.empty()) {
    io.err << me << warning << '\n';
  }
  auto progress = std::make_shared<Progress>(io.err, is_terminal(io.err), args.workload);
  if (!args.quiet) o.progress = [progress](const WorkloadProgress& p) { progress->update(p.phase, p.done, p.total); };

  Result<WorkloadReport> report = run_workload(*kind, o);
  progress->finish();
  if (!report.ok()) {
    const Error& e = report.error();
    io.err << me << e.message << '\n';
    // Bad options, a malformed weights file, or a backend this machine lacks.
    return e.code == ErrorCode::invalid_argument || e.code == ErrorCode::unsupported ? kExitUsage : kExitFailed;
  }
  const std::string json = workload_report_json(*report);
  if (args.json || args.report == "-") {
    io.out << json << '\n';
  } else {
    io.out << workload_report_summary(*report);
  }
  if (report_file.is_open()) {
    report_file << json << '\n';
    report_file.flush();
    if (!report_file) {
      io.err << me << "--report: writing " << args.report << " failed\n";
      return kExitFailed;
    }
  }
  return report->matched ? kExitOk : kExitFailed;
}

// "dense-stream 0.0625, moe-offload 0.125, ...": `scale` of each workload.
std::string scales_text(double (*scale)(WorkloadKind) noexcept) {
  std::string s;
  for (const std::string& name : workload_names()) {
    char value[32];
    std::snprintf(value, sizeof value, "%g", scale(parse_workload(name).value_or(WorkloadKind::dense_stream)));
    s += (s.empty() ? "" : ", ") + name + " " + value;
  }
  return s;
}

}  // namespace

Subcommand add_run(CLI::App& parent) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* app = parent.add_subcommand(
      "run", "Run a seed workload (dense-stream, moe-offload, dequant-train) and check its output");
  app->add_option("NAME", args->workload, "Workload: " + bar_separated(workload_names()))
      ->required()
      ->check(CLI::IsMember(workload_names()));
  add_backend_option(*app, args->backend);
  add_profile_option(*app, args->profile);
  app->add_option("--scale", args->scale,
                  "Shrink every width and token count by S in (0, 1], keeping counts, allocation pattern\n"
                  "and pressure (default: " + scales_text(default_scale) + ";\n"
                  "smallest: " + scales_text(min_scale) + ")")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const double d = std::strtod(v.c_str(), &end);
            if (v.empty() || end == nullptr || *end != '\0' || !(d > 0 && d <= 1)) {
              return "scale \"" + v + "\" must be a number in (0, 1]";
            }
            return {};
          },
          ""))
      ->type_name("S");
  add_capacity_option(*app, args->capacity, "the schedule's planned peak live / --pressure");
  app->add_option("--pressure", args->pressure,
                  "Target peak-live / capacity: sizes the pool when --capacity is not given")
      ->check(CLI::Range(0.05, 1.0))
      ->capture_default_str();
  app->add_option("--integrity", args->integrity, "Transfer integrity policy: off|probe|verify")
      ->check(CLI::IsMember({"off", "probe", "verify"}))
      ->capture_default_str();
  add_inject_option(*app, args->inject);
  app->add_option("--devices", args->devices,
                  "Run on N simulated devices, 1 to " + std::to_string(kMaxWorkloadDevices) +
                      " (moe-offload: one expert cache over them,\n"
                      "expert e of layer l placed on device (16 l + e) mod N, a layer's excess moved to the\n"
                      "least loaded device; dense-stream: layers in contiguous runs, a pipeline;\n"
                      "dequant-train: 1 only). The JSON report then has a \"devices\" entry per device")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
            if (v.empty() || v[0] == '-' || end == nullptr || *end != '\0' || n < 1 || n > kMaxWorkloadDevices) {
              return "--devices \"" + v + "\": a workload runs on 1 to " + std::to_string(kMaxWorkloadDevices) +
                     " devices";
            }
            return {};
          },
          ""))
      ->type_name("N")
      ->capture_default_str();
  app->add_option("--inject-device", args->inject_device,
                  "Inject --inject's faults on device K only (0-based; default: on every device)")
      ->type_name("K");
  app->add_option("--links", args->links,
                  "Peer links between the devices (sim): auto (every pair NVLink when --profile has it,\n"
                  "as on an HGX board's NVSwitch: h200, rtx3090, tiny; none on rtx4090), none (every copy\n"
                  "between devices staged through pinned host memory), or pairs A-B:nvlink|pcie separated\n"
                  "by commas, e.g. 0-1:nvlink,2-3:pcie (a pair not listed has no link)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            if (v == "auto" || v == "none") return {};
            Result<std::vector<PeerLinkSpec>> parsed = parse_peer_links(v);
            return parsed.ok() ? std::string() : "--links: " + parsed.error().message;
          },
          ""))
      ->type_name("LINKS")
      ->capture_default_str();
  app->add_option("--policy", args->policy, "Expert-cache eviction (moe-offload): lru|lfu|optimal")
      ->check(CLI::IsMember({"lru", "lfu", "optimal"}))
      ->capture_default_str();
  app->add_option("--prefetch", args->prefetch,
                  "Prefetch the next layer / weight / predicted experts: on|off")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app->add_option("--matmul", args->matmul,
                  "What a weight matmul is: gemm (a real bf16 GEMM: cuBLAS on cuda, the host\n"
                  "definition on sim; a --weights file's bf16 values must be integers in [-2, 2]), mix\n"
                  "(a kernel charged the matmul's cost), auto (gemm on cuda, mix on sim)")
      ->check(CLI::IsMember({"auto", "mix", "gemm"}))
      ->capture_default_str();
  app->add_flag("--host-exec", args->host_exec,
                "moe-offload: run cache misses on the host instead of fetching them");
  app->add_flag("--race-check", args->race_check,
                "Report unordered conflicting accesses from different streams (sim only):\n"
                "a race fails the run (exit 1)");
  app->add_option("--slots", args->slots,
                  "moe-offload: expert cache slots (default 32 of 64 experts; at least as many\n"
                  "as one layer routes to at once, up to 16)")
      ->check(CLI::Range(1u, 4096u));
  app->add_option("--weights", args->weights,
                  "Weights from a safetensors file instead of the synthetic bank\n"
                  "(tensor names, dtypes and shapes as --save-weights writes them)")
      ->type_name("FILE");
  app->add_option("--save-weights", args->save_weights,
                  "Write the synthetic bank for this workload, --scale and --seed to FILE and exit")
      ->type_name("FILE");
  app->add_option("--bank", args->bank,
                  "Weight bank placement: registered (in place, hashed once) | arena (copied)")
      ->check(CLI::IsMember({"registered", "arena"}))
      ->capture_default_str();
  add_seed_option(*app, args->seed, "Seed of the weights, the routing trace and the sim's schedule");
  add_report_options(*app, args->report, args->json);
  app->add_flag("--quiet", args->quiet, "No progress on stderr");
  app->footer(
      "Throughput and overlap are modeled on the sim's virtual clock (measured on cuda); throughput\n"
      "is reported at full shape. Progress goes to stderr: a bar on a terminal, a line per tenth\n"
      "otherwise.\n"
      "Exit status: 0 the output matched the host reference; 1 it did not, or the run failed;\n"
      "2 bad usage, a malformed --weights file, or a backend this machine does not have.");
  return {app, [app, args](const Io& io) {
            for (const CLI::Option* opt : app->get_options()) {
              if (opt->count() > 0) args->given.push_back(opt->get_name());
            }
            return run_run(*args, io);
          }};
}

}  // namespace ferry::cli
