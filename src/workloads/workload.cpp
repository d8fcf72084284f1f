// run_workload: bank, dry run (planned peak), reference, the run, the report.
#include "ferry/workload.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/names.hpp"
#include "core/align.hpp"
#include "core/text.hpp"
#include "workloads/device_report.hpp"
#include "workloads/exec.hpp"

namespace ferry {
namespace {

using workloads::Exec;
using workloads::Workload;

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

std::unique_ptr<Workload> make(WorkloadKind kind, const WorkloadOptions& options, double scale) {
  switch (kind) {
    case WorkloadKind::dense_stream: return workloads::make_dense_stream(options, scale);
    case WorkloadKind::moe_offload: return workloads::make_moe_offload(options, scale);
    case WorkloadKind::dequant_train: return workloads::make_dequant_train(options, scale);
  }
  return nullptr;
}

Result<double> effective_scale(WorkloadKind kind, const WorkloadOptions& options) {
  const double s = options.scale == 0 ? default_scale(kind) : options.scale;
  if (!(s > 0 && s <= 1)) {
    return make_error(ErrorCode::invalid_argument,
                      "scale " + std::to_string(options.scale) + " is outside (0, 1]");
  }
  if (s < min_scale(kind)) {
    return make_error(ErrorCode::invalid_argument,
                      "scale " + text::fixed(s, 6) + " is below " + std::string(to_string(kind)) +
                          "'s smallest, " + text::fixed(min_scale(kind), 6) +
                          ": below it the sim's 4 KiB mapping granule stops shrinking with the buffers "
                          "and the planned pool cannot hold them");
  }
  return s;
}

using text::fixed;

std::string bytes_text(std::uint64_t b) { return text::human_bytes(b, 2); }

// The unit a run stopped in, from the last progress it reported: "layers 5/36".
std::string stopped_at(const WorkloadProgress& last, const Workload& w) {
  if (last.total == 0) return w.unit_name() + " 1/" + std::to_string(w.units());
  const std::string at = std::string(last.phase) + " ";
  if (last.done >= last.total) return "after " + at + std::to_string(last.done) + "/" + std::to_string(last.total);
  return at + std::to_string(last.done + 1) + "/" + std::to_string(last.total);
}
std::string time_text(std::uint64_t ns) { return text::human_ns(ns, 3); }

// The run's closing sentence: what was injected, how much of it the integrity
// policy caught and how, and what the output says; empty without injected faults.
// Every swallowed copy is either a transfer's (a hash mismatch under verify) or a
// canary's (a failed canary copy), so the two counts reconcile with the fault's.
std::string conclusion(const WorkloadReport& r) {
  if (r.faults == "none" || r.faults.empty()) return {};
  const IntegrityCounters& c = r.integrity;
  const std::string outcome = !r.completed ? "the run stopped before its output could be compared"
                              : r.matched  ? "the output still matched the host reference"
                                           : "the output did not match the host reference";
  if (r.swallowed_copies == 0) {
    return r.faults + " was injected but swallowed no copy in this run; " + outcome + ".";
  }
  const std::string swallowed = r.faults + " swallowed " + std::to_string(r.swallowed_copies) + " copies";
  if (r.integrity_policy != "verify") {
    const std::string checks = r.integrity_policy == "off" ? "which checks nothing" : "which checks only canaried transfers";
    return swallowed + " under integrity " + r.integrity_policy + ", " + checks + ": " +
           std::to_string(c.mismatches + c.canary_failures) + " were caught; " + outcome +
           ". Run it with --integrity verify to have every transfer hashed.";
  }
  const std::uint64_t caught = c.mismatches + c.canary_failures;
  std::string s = swallowed + "; verification caught " +
                  (caught == r.swallowed_copies ? std::string("every one")
                                                : std::to_string(caught) + " of them") +
                  " (" + std::to_string(c.mismatches) + " as hash mismatches of transfers, " +
                  std::to_string(c.canary_failures) + " as failed canary copies), re-sent " +
                  std::to_string(c.retries) + " of them (" + std::to_string(c.fallbacks) + " fallbacks to another path" +
                  (c.pinned_distrusted ? ", pinned memory distrusted after " + std::to_string(c.units_retired) +
                                             " units retired"
                                       : std::string()) +
                  ") and returned " + std::to_string(c.corrupt) + " as corrupt; " + outcome + ".";
  if (r.matched) s += " Without verification the same faults go unseen: run it with --integrity off.";
  return s;
}

}  // namespace

constexpr std::array<NamedValue<WorkloadKind>, 3> kWorkloads{{
    {WorkloadKind::dense_stream, "dense-stream"},
    {WorkloadKind::moe_offload, "moe-offload"},
    {WorkloadKind::dequant_train, "dequant-train"},
}};

constexpr std::array<NamedValue<MatmulKind>, 3> kMatmuls{{
    {MatmulKind::automatic, "auto"},
    {MatmulKind::mix, "mix"},
    {MatmulKind::gemm, "gemm"},
}};

std::string_view to_string(WorkloadKind kind) noexcept { return name_in<WorkloadKind>(kWorkloads, kind); }

std::vector<std::string> workload_names() {
  std::vector<std::string> names;
  for (const NamedValue<WorkloadKind>& n : kWorkloads) names.emplace_back(n.name);
  return names;
}

Result<WorkloadKind> parse_workload(std::string_view text) {
  return value_in<WorkloadKind>(kWorkloads, text, "workload");
}

std::string_view to_string(MatmulKind kind) noexcept { return name_in<MatmulKind>(kMatmuls, kind); }

Result<MatmulKind> parse_matmul_kind(std::string_view text) { return value_in<MatmulKind>(kMatmuls, text, "matmul"); }

// Chosen so that each runs in a few seconds under the sanitized debug build on
// a 2-core machine (see docs/workloads.md).
double default_scale(WorkloadKind kind) noexcept {
  switch (kind) {
    case WorkloadKind::dense_stream: return 0.0625;
    case WorkloadKind::moe_offload: return 0.125;
    case WorkloadKind::dequant_train: return 0.0625;
  }
  return 0.0625;
}

// Found by running each workload at decreasing scales on the h200 profile with
// default options (docs/workloads.md): the smallest at and above which every
// scale tried matched.
double min_scale(WorkloadKind kind) noexcept {
  switch (kind) {
    case WorkloadKind::dense_stream: return 1.0 / 128;
    case WorkloadKind::moe_offload: return 1.0 / 64;
    case WorkloadKind::dequant_train: return 1.0 / 64;
  }
  return 1.0 / 64;
}

Result<void> write_workload_weights(WorkloadKind kind, const WorkloadOptions& options, const std::string& path) {
  Result<double> s = effective_scale(kind, options);
  if (!s.ok()) return std::move(s).error();
  auto w = make(kind, options, *s);
  Result<WeightBank> bank = WeightBank::synthetic(w->tensors(), std::string(to_string(kind)));
  if (!bank.ok()) return std::move(bank).error();
  return write_safetensors(path, *bank);
}

namespace {

// What the report says of the run before it starts: the workload, the device, the options.
WorkloadReport report_head(WorkloadKind kind, const WorkloadOptions& options, workloads::Env& env, const Workload& w,
                           const WeightBank& bank) {
  WorkloadReport r;
  r.workload = std::string(to_string(kind));
  r.backend = std::string(to_string(options.backend));
  const workloads::DeviceEnv& d0 = env.at(0);
  r.modeled_time = d0.backend->info().modeled_time;
  r.device = d0.backend->info().device;
  if (options.devices > 1) r.device = std::to_string(options.devices) + " x " + r.device;
  r.shape = w.shape();
  r.weights = bank.source();
  r.seed = options.seed;
  r.integrity_policy = std::string(to_string(options.integrity));
  r.eviction_policy = std::string(to_string(options.policy));
  r.faults = describe(options.faults);
  if (options.devices > 1 && options.fault_device && r.faults != "none") {
    r.faults += " on device " + std::to_string(*options.fault_device);
  }
  r.prefetch = options.prefetch;
  r.host_exec = options.host_exec;
  r.matmul = workloads::uses_gemm(options) ? "gemm" : "mix";
  r.capacity = d0.pool->capacity();
  return r;
}

// What the pool, the engine, the device and the workload counted during the run.
void record_stats(WorkloadReport& r, workloads::DeviceEnv& env, const Workload& w) {
  const PoolStats ps = env.pool->stats();
  r.peak_live_bytes = ps.peak_requested_bytes;
  r.peak_reserved_bytes = ps.peak_reserved_bytes;
  r.fragmentation_ratio = r.peak_live_bytes == 0 ? 0 : double(r.peak_reserved_bytes) / double(r.peak_live_bytes);
  r.pressure = r.capacity == 0 ? 0 : double(r.peak_live_bytes) / double(r.capacity);
  r.ooms = ps.ooms;
  r.ooms_survived = ps.ooms_survived;
  r.reclaims = ps.reclaims;
  r.prefetch_skipped = w.prefetch_skipped;
  r.integrity = env.engine->counters();
  const FaultCounters faults = env.backend->fault_counters();
  r.swallowed_copies = faults.swallowed_copies;
  r.failed_maps = faults.failed_maps;
  r.illegal_accesses = faults.illegal_accesses;
  if (const auto races = env.backend->race_log()) {
    r.race_checked = true;
    r.races = races->count;
    r.race_list = races->kept;
  }
  if (w.cache_stats) {
    r.has_cache = true;
    r.cache = *w.cache_stats;
    r.cache_slots = w.cache_slots;
  }
  r.host_executed = w.host_executed;
}

// The run's clock and busy figures, and its throughput at full scale.
void record_timing(WorkloadReport& r, workloads::DeviceEnv& env, const Exec& live, const Workload& w, double s,
                   std::uint64_t wall_ns, bool completed) {
  r.wall_ns = wall_ns;
  r.transfer_busy_ns = env.meter->transfer_ns();
  r.compute_busy_ns = env.meter->compute_ns();
  r.host_busy_ns = live.host_busy_ns();
  r.overlap_efficiency =
      r.wall_ns == 0 ? 0 : double(std::max(r.transfer_busy_ns, r.compute_busy_ns)) / double(r.wall_ns);
  r.tokens = w.nominal_tokens();
  r.units = w.units();
  r.unit_name = w.unit_name();
  r.completed = completed;
  // A run that stopped part-way did not process its tokens: it has no throughput.
  r.tokens_per_s =
      r.wall_ns == 0 || !r.completed ? 0 : double(r.tokens) / (double(r.wall_ns) / 1e9 / (s * s));
  if (!r.completed) r.stopped_at = stopped_at(live.last_progress(), w);
}

void record_bank(WorkloadReport& r, const WeightBank& bank) {
  const BankStats bs = bank.stats();
  r.weights_bytes = bs.data_bytes;
  r.weights_peak_host_bytes = bs.peak_resident_bytes;
  r.weights_storage = bank.from_file() ? "file" : bank.lazy() ? "lazy" : "resident";
}

// Whether the run's digest matched the host reference's, and what went wrong if not.
void record_verdict(WorkloadReport& r, const Result<std::vector<std::byte>>& got, std::uint64_t expected_seed,
                    const workloads::Reference& reference) {
  std::vector<std::byte> expected(workloads::kDigestBytes);
  fill_with(workloads::kPattern, expected_seed, 0, expected);
  r.expected_digest = text::hex16(content_hash(expected));
  if (got.ok()) {
    r.actual_digest = text::hex16(content_hash(*got));
    r.matched = *got == expected && r.illegal_accesses == 0 && r.races == 0;
    if (r.illegal_accesses != 0) r.error = "the device touched unmapped memory";
    if (r.races != 0 && r.error.empty()) r.error = std::to_string(r.races) + " stream races (race.hpp)";
  } else {
    r.stopped_by = got.error().code;
    r.error = std::string(to_string(got.error().code)) + ": " + got.error().message;
  }
  if (!reference.error().empty()) {
    r.matched = false;
    if (r.error.empty()) r.error = "the host reference's GEMM failed: " + reference.error();
  }
}

// Refuses a device count or fault device the workload cannot run with.
Result<void> check_devices(WorkloadKind kind, const WorkloadOptions& o) {
  if (o.devices == 0 || o.devices > kMaxWorkloadDevices) {
    return make_error(ErrorCode::invalid_argument, "devices " + std::to_string(o.devices) +
                                                       ": a workload runs on 1 to " +
                                                       std::to_string(kMaxWorkloadDevices) + " devices");
  }
  if (o.fault_device && *o.fault_device >= o.devices) {
    return make_error(ErrorCode::invalid_argument, "fault device " + std::to_string(*o.fault_device) +
                                                       ": the run has devices 0 to " + std::to_string(o.devices - 1));
  }
  if (o.devices == 1) return {};
  if (kind == WorkloadKind::dequant_train) {
    return make_error(ErrorCode::invalid_argument,
                      "dequant-train runs on one device only (splitting it over several is not done); "
                      "devices must be 1");
  }
  if (o.placement == BankPlacement::arena) {
    return make_error(ErrorCode::invalid_argument,
                      "bank placement arena copies the weights into one device's pinned arena; with " +
                          std::to_string(o.devices) + " devices use registered (every device registers the bank)");
  }
  return {};
}

}  // namespace

Result<WorkloadReport> run_workload(WorkloadKind kind, const WorkloadOptions& options) {
  Result<double> scale = effective_scale(kind, options);
  if (!scale.ok()) return std::move(scale).error();
  const double s = *scale;
  if (!(options.target_pressure > 0 && options.target_pressure <= 1)) {
    return make_error(ErrorCode::invalid_argument, "target pressure must lie in (0, 1]");
  }
  BackendSpec named;
  named.profile = options.profile;
  Result<DeviceProfile> profile = spec_profile(named);
  const DeviceInfo can = capabilities_of(options.backend);
  if (can.profiled && !profile.ok()) return std::move(profile).error();
  if (!(options.host_flops_per_s > 0) || !(options.host_bytes_per_s > 0)) {
    return make_error(ErrorCode::invalid_argument, "host model rates must be > 0");
  }
  FERRY_TRY(check_devices(kind, options));

  // The env outlives nothing that uses it: declared first, destroyed last, and
  // the bank is unplaced explicitly before it goes.
  std::unique_ptr<workloads::Env> env;
  std::unique_ptr<Workload> w = make(kind, options, s);
  FERRY_TRY(w->check_options());
  // Lazy where registered ranges may stay unbacked (the sim: its device is larger
  // than the host), and a workload that stages every weight needs no tensor held
  // longer than its upload.
  // A lazy bank's stagings are ordered on one device's streams: several devices read a resident one.
  const SyntheticStorage storage = can.lazy_host_ranges && w->stages_weights() && options.devices == 1
                                       ? SyntheticStorage::lazy
                                       : SyntheticStorage::resident;
  Result<WeightBank> opened =
      options.weights_path.empty()
          ? WeightBank::synthetic(w->tensors(), "synthetic (seed " + std::to_string(options.seed) + ")", storage)
          : WeightBank::open_safetensors(options.weights_path);
  if (!opened.ok()) return std::move(opened).error();
  WeightBank bank = std::move(opened).value();
  FERRY_TRY(w->bind(bank));

  // The dry run: the schedule's exact peak of live bytes, before any pool exists.
  Exec dry(options);
  {
    Result<std::vector<std::byte>> d = w->execute(dry, bank);
    if (!d.ok()) return std::move(d).error();
  }
  // With several devices each pool is sized for the device that needs most.
  const std::uint64_t planned = dry.dry_peak();
  std::uint64_t capacity = options.capacity;
  if (capacity == 0) {
    // Rounded up to whole granules (the pool rounds down).
    const std::uint64_t granule =
        can.profiled ? workloads::scaled_profile(*profile, s).granularity : 1;
    capacity = static_cast<std::uint64_t>(std::ceil(double(planned) / options.target_pressure));
    capacity = detail::align_up(capacity, granule);
  }
  w->prefetch_skipped = 0;
  w->host_executed = 0;

  const bool gemm = workloads::uses_gemm(options);
  workloads::Reference reference(gemm);
  const std::uint64_t expected_seed = w->reference(reference, bank);

  std::uint64_t arena_budget = kGiB;
  if (options.placement == BankPlacement::arena) arena_budget += bank.data_bytes() + bank.data_bytes() / 8;
  Result<std::unique_ptr<workloads::Env>> made = workloads::make_env(options, s, capacity, arena_budget);
  if (!made.ok()) return std::move(made).error();
  env = std::move(made).value();
  if (Result<void> placed = bank.place(*env->at(0).engine, options.placement); !placed.ok()) return placed.error();
  for (std::uint32_t d = 1; d < options.devices; ++d) {
    if (Result<void> placed = bank.place_also(*env->at(d).engine); !placed.ok()) return placed.error();
  }

  WorkloadReport r = report_head(kind, options, *env, *w, bank);
  r.scale = s;
  r.planned_peak_live = planned;

  // The engines' start-up probes are not the workload's.
  for (workloads::DeviceEnv& d : env->devices) d.pool->reset_peak_stats();
  Exec live(options, *env);
  const auto host_now = [&] { return env->clock ? env->clock->now() : env->at(0).backend->now_ns(); };
  const std::uint64_t t0 = host_now();
  for (workloads::DeviceEnv& d : env->devices) d.meter->reset();
  Result<std::vector<std::byte>> got = w->execute(live, bank);
  // After a successful run the digest's download has waited for everything;
  // after a failed one, work may still be queued: either way nothing is left
  // running when the stats are read and the pool goes away.
  for (workloads::DeviceEnv& d : env->devices) {
    if (Result<void> sync = d.backend->synchronize(); !sync.ok() && got.ok()) got = sync.error();
  }
  const std::uint64_t t1 = host_now();

  record_timing(r, env->at(0), live, *w, s, t1 - t0, got.ok());
  record_stats(r, env->at(0), *w);
  if (options.devices > 1) workloads::record_devices(r, *env, live, *w, dry.dry_peaks(), s, t0);
  record_verdict(r, got, expected_seed, reference);
  record_bank(r, bank);
  if (Result<void> un = bank.unplace(); !un.ok() && r.error.empty()) {
    r.error = "unplacing the weight bank: " + un.error().message;
    r.matched = false;
  }
  return r;
}

std::string workload_report_json(const WorkloadReport& r) {
  nlohmann::ordered_json j;
  j["workload"] = r.workload;
  j["matched"] = r.matched;
  j["backend"] = r.backend;
  j["device"] = r.device;
  j["scale"] = r.scale;
  j["shape"] = r.shape;
  j["weights"] = r.weights;
  j["weights_storage"] = r.weights_storage;
  j["seed"] = r.seed;
  j["integrity_policy"] = r.integrity_policy;
  j["faults"] = r.faults;
  j["prefetch"] = r.prefetch;
  j["matmul"] = r.matmul;
  j["throughput"] = {{"tokens", r.tokens},
                     {"tokens_per_s", r.completed ? nlohmann::ordered_json(r.tokens_per_s) : nlohmann::ordered_json()},
                     {"units", r.units},
                     {"unit", r.unit_name},
                     {"modeled", r.modeled_time},
                     {"at", "full shape (virtual wall / scale^2)"}};
  j["time"] = {{"wall_ns", r.wall_ns},
               {"transfer_busy_ns", r.transfer_busy_ns},
               {"compute_busy_ns", r.compute_busy_ns},
               {"host_busy_ns", r.host_busy_ns},
               {"overlap_efficiency", r.overlap_efficiency}};
  j["memory"] = {{"capacity_bytes", r.capacity},
                 {"planned_peak_live_bytes", r.planned_peak_live},
                 {"peak_live_bytes", r.peak_live_bytes},
                 {"peak_reserved_bytes", r.peak_reserved_bytes},
                 {"fragmentation_ratio", r.fragmentation_ratio},
                 {"pressure", r.pressure},
                 {"ooms", r.ooms},
                 {"ooms_survived", r.ooms_survived},
                 {"reclaims", r.reclaims},
                 {"prefetch_skipped", r.prefetch_skipped},
                 {"weights_bytes", r.weights_bytes},
                 {"weights_peak_host_bytes", r.weights_peak_host_bytes}};
  const IntegrityCounters& c = r.integrity;
  j["integrity"] = {{"bytes_moved", c.bytes_moved},   {"bytes_verified", c.bytes_verified},
                    {"mismatches", c.mismatches},     {"retries", c.retries},
                    {"fallbacks", c.fallbacks},       {"recovered", c.recovered},
                    {"corrupt", c.corrupt},           {"units_retired", c.units_retired},
                    {"batched_disabled", c.batched_disabled},
                    {"pinned_distrusted", c.pinned_distrusted},
                    {"swallowed_copies", r.swallowed_copies},
                    {"failed_maps", r.failed_maps},
                    {"canary_failures", c.canary_failures}};
  if (r.has_cache) {
    j["cache"] = {{"policy", r.eviction_policy},
                  {"slots", r.cache_slots},
                  {"hit_rate", r.cache.hit_rate()},
                  {"hits", r.cache.hits},
                  {"misses", r.cache.misses},
                  {"prefetches", r.cache.prefetches},
                  {"prefetch_hits", r.cache.prefetch_hits},
                  {"prefetch_wasted", r.cache.prefetch_wasted},
                  {"prefetch_dropped", r.cache.prefetch_dropped},
                  {"evictions", r.cache.evictions},
                  {"bytes_uploaded", r.cache.bytes_uploaded},
                  {"host_exec", r.host_exec},
                  {"host_executed", r.host_executed}};
  } else {
    j["cache"] = nullptr;
  }
  j["illegal_accesses"] = r.illegal_accesses;
  if (r.race_checked) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Race& race : r.race_list) {
      const auto side = [](const RaceAccess& a) {
        nlohmann::ordered_json block = nullptr;
        if (a.block.handle != DeviceHandle{}) {
          block = {{"pool", a.block.handle.pool}, {"slot", a.block.handle.slot},
                   {"generation", a.block.handle.generation}, {"tag", a.block.tag}};
        }
        return nlohmann::ordered_json{{"device", a.device}, {"stream", a.op.stream}, {"ticket", a.op.ticket},
                                      {"kind", std::string(a.kind)},
                                      {"tag", a.tag}, {"access", std::string(to_string(a.access))},
                                      {"block", std::move(block)}};
      };
      list.push_back({{"earlier", side(race.earlier)}, {"later", side(race.later)}, {"addr", race.addr},
                      {"bytes", race.bytes}, {"reuse", race.reuse}});
    }
    j["races"] = {{"count", r.races}, {"list", std::move(list)}};
  }
  if (!r.devices.empty()) {  // several devices only
    j["links"] = r.links;
    j["devices"] = workloads::devices_json(r.devices);
  }
  j["expected_digest"] = r.expected_digest;
  j["actual_digest"] = r.actual_digest;
  j["error"] = r.error.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.error);
  j["completed"] = r.completed;
  j["stopped_at"] = r.completed ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(r.stopped_at);
  const std::string closing = conclusion(r);
  j["conclusion"] = closing.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(closing);
  return j.dump();
}

std::string workload_report_summary(const WorkloadReport& r) {
  std::string s;
  const auto line = [&](const std::string& key, const std::string& value) {
    s += "  " + key + std::string(key.size() < 12 ? 12 - key.size() : 1, ' ') + value + "\n";
  };
  s += "ferry run " + r.workload + " on " + r.backend + " " + r.device + ", scale " + fixed(r.scale, 4) + "\n";
  line("shape", r.shape + "; matmuls: " + (r.matmul == "gemm" ? (r.modeled_time ? "host GEMM" : "cuBLAS GEMM")
                                                                   : "mix kernels"));
  line("weights", r.weights + ": " + bytes_text(r.weights_bytes) + ", " + r.weights_storage + ", peak " +
                      bytes_text(r.weights_peak_host_bytes) + " in host memory");
  if (!r.completed) {
    line("output", "not compared: the run stopped in " + r.stopped_at + ", before its digest");
  } else {
    line("output", r.matched ? "matched the host reference (digest " + r.actual_digest + ")"
                             : "DID NOT MATCH (expected digest " + r.expected_digest + ", got " +
                                   r.actual_digest + ")");
  }
  if (!r.error.empty()) line("error", r.error);
  if (r.stopped_by == ErrorCode::out_of_memory) {
    line("needs", "capacity >= " + bytes_text(r.planned_peak_live) +
                      " (the schedule's planned peak live); this run had " + bytes_text(r.capacity));
  }
  if (r.race_checked) {
    line("races", text::count(r.races, "unordered conflicting access", "unordered conflicting accesses") +
                      " between streams");
    for (std::size_t i = 0; i < r.race_list.size() && i < 5; ++i) {
      const Race& race = r.race_list[i];
      const auto side = [](const RaceAccess& a) {
        std::string block;
        if (a.block.handle != DeviceHandle{}) {
          block = " of block " + text::handle(a.block.handle);
          if (!a.block.tag.empty()) block += " '" + a.block.tag + "'";
        }
        return std::string(a.kind) + (a.tag.empty() ? "" : " '" + a.tag + "'") + " " + std::string(to_string(a.access)) +
               block + " at " + text::point(a.op);
      };
      line("race", side(race.earlier) + " and " + side(race.later) + ", " + bytes_text(race.bytes) + " at " +
                       text::hex(race.addr) +
                       (race.reuse ? " (allocator reuse: handed out again before the earlier work finished)" : ""));
    }
  }
  // A stopped run's time covers part of the schedule: no throughput, no overlap.
  if (r.completed) {
    line("throughput", fixed(r.tokens_per_s, 0) + " tokens/s " + (r.modeled_time ? "modeled" : "measured") +
                           " at full shape (" + std::to_string(r.tokens) + " tokens, " + std::to_string(r.units) +
                           " " + r.unit_name + " in " + time_text(r.wall_ns) + (r.modeled_time ? " virtual" : "") +
                           " at this scale)");
    const std::string per = r.devices.size() > 1 ? " / (" + std::to_string(r.devices.size()) + " x wall)" : " / wall";
    line("overlap", fixed(r.overlap_efficiency, 3) + " = max(transfer " + time_text(r.transfer_busy_ns) +
                        ", compute " + time_text(r.compute_busy_ns) + ")" + per + "; prefetch " +
                        (r.prefetch ? "on" : "off") +
                        (r.host_busy_ns ? ", host " + time_text(r.host_busy_ns) : std::string()));
  }
  line("memory", "peak live " + bytes_text(r.peak_live_bytes) + ", peak reserved " +
                     bytes_text(r.peak_reserved_bytes) + " (fragmentation ratio " +
                     fixed(r.fragmentation_ratio, 3) + " = reserved / live), capacity " + bytes_text(r.capacity) +
                     " (pressure " + fixed(r.pressure, 2) + ")");
  line("pressure", std::to_string(r.ooms_survived) + " OOMs survived (failed fits a reclaim turned into success), " +
                       std::to_string(r.reclaims) + " reclaims, " + std::to_string(r.ooms) + " OOMs returned, " +
                       std::to_string(r.prefetch_skipped) + " prefetches skipped");
  const IntegrityCounters& c = r.integrity;
  // Only verify hashes every byte: under probe or off, "0 corrupt" says nothing about the bytes.
  const std::string unchecked = r.integrity_policy == "verify" ? ""
                                : r.integrity_policy == "probe" ? " (probe: only canaried transfers are checked)"
                                                                 : " (off: nothing is checked)";
  line("integrity", r.integrity_policy + ": " + bytes_text(c.bytes_moved) + " moved, " +
                        bytes_text(c.bytes_verified) + " verified; " + std::to_string(c.mismatches) +
                        " mismatches, " + std::to_string(c.retries) + " retries, " + std::to_string(c.fallbacks) +
                        " fallbacks, " + std::to_string(c.corrupt) + " corrupt" + unchecked);
  line("batching", c.batched_disabled ? "off (the start-up probe failed, a batch mismatched, or the backend has none)"
                                      : "on");
  if (r.faults != "none") {
    line("faults", r.faults + ": " + std::to_string(r.swallowed_copies) + " copies silently swallowed, " +
                       std::to_string(r.failed_maps) + " map calls failed, " + std::to_string(c.units_retired) +
                       " pinned units retired");
  }
  if (r.has_cache) {
    line("cache", r.eviction_policy + ", " + std::to_string(r.cache_slots) + " slots: hit rate " +
                      fixed(r.cache.hit_rate(), 3) + " (" + std::to_string(r.cache.hits) + " hits, " +
                      std::to_string(r.cache.misses) + " misses; " + bytes_text(r.cache.bytes_uploaded) +
                      " fetched; " + std::to_string(r.cache.prefetches) +
                      " prefetches, " + std::to_string(r.cache.prefetch_hits) + " used, " +
                      std::to_string(r.cache.prefetch_wasted) + " wasted; " + std::to_string(r.cache.evictions) +
                      " evictions)" +
                      (r.host_exec ? "; " + std::to_string(r.host_executed) + " experts run on the host" : ""));
  } else {
    line("cache", "none (weights streamed, no reuse)");
  }
  workloads::devices_summary(r, line);
  s += std::string("verdict: ") + (r.matched ? "MATCHED" : "FAILED") + "\n";
  if (const std::string closing = conclusion(r); !closing.empty()) s += closing + "\n";
  return s;
}

}  // namespace ferry
