// `ferry doctor`: what device and backend ferry sees, what it can do, and report
// 000's pinned-churn probe run for real on it, with a plain verdict.
#include <cstdio>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "common_options.hpp"
#include "option_values.hpp"
#include "subcommand.hpp"
#include "ferry/churn_probe.hpp"
#include "ferry/content.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/gemm.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"

namespace ferry::cli {
namespace {

struct DoctorArgs {
  BackendKind backend = BackendKind::sim;
  // Given or not: without --backend the default is chosen at run time.
  const CLI::Option* backend_option = nullptr;
  const CLI::Option* profile_option = nullptr;
  std::string profile = "h200";
  std::string seed = "1";
  std::vector<std::string> inject;
  bool json = false;
};


const char* yes_no(bool b) { return b ? "yes" : "no"; }

// After the churn, one verified upload out of the arena: what ferry's own guard
// does on this machine when the raw path misbehaves.
struct GuardResult {
  bool ran = false;
  bool arrived = false;  // the bytes on the device match (verified)
  std::string error;     // the upload's error, if any
  IntegrityCounters counters;
};

constexpr std::uint64_t kGuardBytes = std::uint64_t{1} << 20;

GuardResult run_guard(DevicePool& pool, HostArena& arena, TransferEngine& engine) {
  GuardResult g;
  auto dst = pool.allocate(kGuardBytes, 0);
  if (!dst.ok()) {
    g.error = dst.error().message;
    return g;
  }
  auto block = arena.allocate(kGuardBytes);
  if (!block.ok()) {
    (void)pool.free(*dst);
    g.error = block.error().message;
    return g;
  }
  fill_pattern(0x6d0c7012ull, 0, block->span());
  TransferPlan plan;
  plan.add(*block, *dst);
  auto receipt = engine.upload(0, plan);
  (void)arena.free(*block);  // leased by the engine until its copies completed
  (void)pool.free(*dst);     // stream-ordered
  g.ran = true;
  if (receipt.ok()) {
    g.arrived = receipt->verified;
  } else {
    g.error = std::string(to_string(receipt.error().code)) + ": " + receipt.error().message;
  }
  g.counters = engine.counters();
  return g;
}

int run_doctor(const DoctorArgs& args, const Io& io) {
  const char* me = "ferry doctor: ";
  Result<SimFaults> faults = parse_fault_specs(args.inject);
  if (!faults.ok()) {  // the validator accepted each spec; kept for safety
    io.err << me << faults.error().message << '\n';
    return kExitUsage;
  }
  const std::string injected = describe(*faults);
  if (const std::string why = fault_refusal(args.backend, *faults); !why.empty()) {
    io.err << me << "--inject " << injected << ": " << why << '\n';
    return kExitUsage;
  }
  const std::uint64_t seed = parse_u64(args.seed).value_or(1);

  // Declared in construction order: destroyed engine first, backend last.
  BackendSpec spec;
  spec.kind = args.backend;
  spec.profile = args.profile;
  spec.seed = seed;
  spec.faults = *faults;
  // Without --backend: the machine's GPU when it has one (that is what a doctor is
  // asked about), else the sim; injected faults and profiles are the sim's alone.
  const bool chosen = args.backend_option == nullptr || args.backend_option->count() == 0;
  std::string why_this_backend = "--backend " + std::string(to_string(spec.kind));
  Result<std::unique_ptr<Backend>> made = make_error(ErrorCode::unsupported, "not tried");
  const bool sim_asked = injected != "none" || (args.profile_option != nullptr && args.profile_option->count() > 0);
  if (chosen && !sim_asked) {
    BackendSpec cuda = spec;
    cuda.kind = BackendKind::cuda;
    made = make_backend(cuda);
    if (made.ok()) {
      spec = cuda;
      why_this_backend = "cuda (the default: this machine has a CUDA device)";
    } else if (made.error().code == ErrorCode::unsupported) {
      why_this_backend = "sim (the default: no usable CUDA here: " + made.error().message +
                         "; --backend cuda to insist)";
      made = make_backend(spec);
    } else {  // a device is there and its backend failed: that is the finding
      spec = cuda;
    }
  } else {
    if (chosen) why_this_backend = "sim (the default with --inject or --profile: they are the sim's)";
    made = make_backend(spec);
  }
  if (!made.ok()) {
    io.err << me << "the " << to_string(spec.kind) << " backend is not available: " << made.error().message << '\n';
    return kExitUsage;
  }
  std::unique_ptr<Backend> backend = std::move(made).value();
  const DeviceInfo& info = backend->info();
  StreamOrder order(*backend);
  DevicePool pool(order);
  if (!pool.status().ok()) {
    io.err << me << "the device pool could not be set up: " << pool.status().error().message << '\n';
    return kExitUsage;
  }
  HostArena arena(order);
  // Runs the batched-copy start-up probe (a capability check).
  TransferEngine engine(pool, arena);
  if (!engine.status().ok()) {
    io.err << me << "the transfer engine could not be set up: " << engine.status().error().message << '\n';
    return kExitFailed;
  }
  const BatchProbeReport probe = engine.startup_probe();

  const ChurnProbeOptions churn_options;
  Result<ChurnVerdict> churn = run_churn_probe(pool, churn_options);
  GuardResult guard;
  if (churn.ok()) guard = run_guard(pool, arena, engine);

  // A copy the guard caught is a silent failure seen too, recovered or not.
  const bool guard_failed = !guard.error.empty() || (guard.ran && !guard.arrived);
  const std::uint64_t guard_caught = guard.counters.mismatches;
  const bool healthy = churn.ok() && churn->healthy && !guard_failed && guard_caught == 0;
  std::string verdict;
  if (!churn.ok()) {
    verdict = "UNKNOWN: the churn probe could not run: " + churn.error().message;
  } else if (guard_failed) {
    verdict = "FAILING: a verified upload through ferry's engine never arrived intact (" +
              guard.error + ")";
  } else if (!churn->healthy) {
    verdict = churn->verdict;
  } else if (guard_caught > 0) {
    verdict = "FAILING: the probe's copies arrived, but a verified upload out of a pinned arena "
              "chunk came back wrong " + std::to_string(guard_caught) +
              " time(s) and was recovered through another path (report 000: silent pinned-copy "
              "failure); run transfers with --integrity verify";
  } else {
    verdict = churn->verdict;
  }
  const ArenaStats arena_stats = arena.stats();
  const std::string batch_state = !info.batched_copy ? "absent"
                                  : !probe.ran       ? "probe could not run"
                                  : probe.passed     ? "probe passed"
                                                     : "probe FAILED, disabled";

  if (args.json) {
    using nlohmann::ordered_json;
    ordered_json j;
    j["backend"] = to_string(info.backend);
    j["backend_choice"] = why_this_backend;
    j["gemm"] = gemm_library(*backend);
    j["device"] = info.device;
    if (info.modeled_time) {
      j["seed"] = seed;
      j["faults"] = injected;
    }
    j["capacity"] = info.capacity;
    j["granularity"] = info.granularity;
    j["h2d_bytes_per_s"] = info.h2d_bytes_per_s;
    j["mem_bytes_per_s"] = info.mem_bytes_per_s;
    j["capabilities"] = {
        {"virtual_memory", info.virtual_memory},
        {"batched_copy", info.batched_copy},
        {"batched_copy_probe", {{"ran", probe.ran}, {"passed", probe.passed}, {"detail", probe.detail}}},
        {"batching_enabled", engine.batching_enabled()},
        {"host_register", info.host_register}};
    j["arena"] = {{"budget_bytes", arena.options().budget_bytes},
                  {"chunk_bytes", arena.options().chunk_bytes},
                  {"reserved_bytes", arena_stats.reserved_bytes}};
    if (churn.ok()) {
      j["churn_probe"] = {{"copies", churn->copies},
                          {"failures", churn->failures},
                          {"arrived", churn->arrived},
                          {"churn_pins", churn->churn_pins},
                          {"simulated_delays", churn->simulated_delays},
                          {"healthy", churn->healthy},
                          {"verdict", churn->verdict}};
    } else {
      j["churn_probe"] = {{"error", churn.error().message}};
    }
    if (guard.ran || !guard.error.empty()) {
      j["verified_upload"] = {{"bytes", kGuardBytes},
                              {"arrived", guard.arrived},
                              {"mismatches", guard.counters.mismatches},
                              {"retries", guard.counters.retries},
                              {"fallbacks", guard.counters.fallbacks},
                              {"recovered", guard.counters.recovered},
                              {"error", guard.error}};
    }
    j["healthy"] = healthy;
    j["verdict"] = verdict;
    io.out << j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) << '\n';
  } else {
    std::string s;
    auto line = [&](const std::string& label, const std::string& value) {
      s += "  " + label;
      s.append(label.size() < 15 ? 15 - label.size() : 1, ' ');
      s += value + '\n';
    };
    s += "ferry doctor\n";
    line("backend", why_this_backend);
    std::string device = std::string(to_string(info.backend)) + " " + info.device;
    if (info.modeled_time) {
      device += " (simulated, seed " + std::to_string(seed) + ")";
      if (injected != "none") device += ", injecting " + injected;
    }
    line("device", device);
    line("memory", text::human_bytes(info.capacity) + ", granularity " + text::human_bytes(info.granularity));
    if (info.h2d_bytes_per_s > 0 || info.mem_bytes_per_s > 0) {
      line("bandwidth", "host->device " + text::rate(info.h2d_bytes_per_s) + ", device memory " +
                            text::rate(info.mem_bytes_per_s) + " (nominal)");
    }
    line("virtual memory", yes_no(info.virtual_memory));
    line("batched copy", std::string(yes_no(info.batched_copy)) +
                             (info.batched_copy ? " (" + batch_state + ")" : "") +
                             (probe.detail.empty() ? "" : ": " + probe.detail));
    line("host register", yes_no(info.host_register));
    line("gemm", gemm_library(*backend));
    line("pinned arena", text::human_bytes(arena.options().budget_bytes) + " budget in " +
                             text::human_bytes(arena.options().chunk_bytes) + " chunks");
    if (churn.ok()) {
      std::string arrived;
      for (bool a : churn->arrived) arrived += a ? '+' : 'x';
      line("churn probe", std::to_string(churn->churn_pins) + " pinned allocations, then " +
                              std::to_string(churn->copies) + " copies after growing delays" +
                              (churn->simulated_delays ? " (virtual time)" : "") + ": " + arrived);
    } else {
      line("churn probe", "could not run: " + churn.error().message);
    }
    if (guard.ran) {
      std::string g = std::string(guard.arrived ? "arrived intact" : "FAILED") + " (" +
                      std::to_string(guard.counters.mismatches) + " mismatches caught, " +
                      std::to_string(guard.counters.recovered) + " recovered)";
      if (!guard.error.empty()) g += ": " + guard.error;
      line("verified copy", text::human_bytes(kGuardBytes) + " through ferry's arena and engine: " + g);
    } else if (!guard.error.empty()) {
      line("verified copy", "could not run: " + guard.error);
    }
    s += "verdict: " + verdict + "\n";
    io.out << s;
  }
  return healthy ? kExitOk : kExitFailed;
}

}  // namespace

Subcommand add_doctor(CLI::App& parent) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* app = parent.add_subcommand(
      "doctor", "Show the device and backend ferry sees, and run report 000's pinned-churn probe on it");
  args->backend_option = add_backend_option(*app, args->backend);
  args->profile_option = add_profile_option(*app, args->profile);
  add_seed_option(*app, args->seed, "Seed of the sim's schedule and faults");
  add_inject_option(*app, args->inject);
  app->add_flag("--json", args->json, "Print one JSON object instead of the summary");
  app->footer(
      "The churn probe pins and frees buffers of a few MiB 20 times, then copies a freshly\n"
      "pinned buffer to the device 8 times after growing delays and compares the bytes\n"
      "(report 000: copies that report success and change nothing). On cuda the delays are\n"
      "real sleeps (about 0.2 s in all). Then one verified upload goes through ferry's own\n"
      "arena and transfer engine.\n"
      "Exit status: 0 healthy; 1 silent copy failures seen (or the probe could not run);\n"
      "2 bad usage, or a backend this machine does not have.\n"
      "Without --backend: cuda when this machine has a CUDA device, else sim (always sim\n"
      "with --inject or --profile); the line `backend` says which was checked and why.");
  return {app, [args](const Io& io) { return run_doctor(*args, io); }};
}

}  // namespace ferry::cli
