// The replay report as JSON (for tools) and as a summary (for a person).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/text.hpp"
#include "ferry/replay.hpp"

namespace ferry {
namespace {

using text::human_bytes;
using text::human_ns;

}  // namespace

std::string report_json(const ReplayReport& r) {
  using nlohmann::ordered_json;
  ordered_json j;
  j["trace"] = r.trace;
  j["backend"] = r.backend;
  j["device"] = r.device;
  if (r.devices > 1) j["devices"] = r.devices;  // one device's reports keep their keys
  j["capacity"] = r.capacity;
  j["seed"] = r.seed;
  j["faults"] = r.faults;
  if (r.source) {
    const TorchSnapshotSource& src = *r.source;
    j["source"] = {{"format", src.format},
                   {"device", src.device},
                   {"events", src.events},
                   {"allocs", src.allocs},
                   {"frees", src.frees},
                   {"streams", src.streams},
                   {"reconstructed_blocks", src.reconstructed_blocks},
                   {"peak_requested_bytes", src.peak_requested_bytes},
                   {"peak_reserved_bytes", src.peak_reserved_bytes},
                   {"segment_allocs", src.segment_allocs},
                   {"ooms", src.ooms}};
  }
  j["verdict"] = r.passed() ? "pass" : "fail";
  j["ops"] = r.ops;
  j["skipped"] = r.skipped;
  j["checks"] = r.checks;
  j["unwritten_checks"] = r.unwritten_checks;
  j["corrupt"] = r.corrupt;
  j["errors"] = ordered_json::object();
  for (const auto& [code, n] : r.errors) j["errors"][code] = n;
  j["expected_errors"] = r.expected_errors;
  j["unexpected_errors"] = r.unexpected_errors;
  j["unexpected_successes"] = r.unexpected_successes;
  j["peak_live_bytes"] = r.peak_live_bytes;
  j["peak_allocated_bytes"] = r.peak_allocated_bytes;
  j["peak_reserved_bytes"] = r.peak_reserved_bytes;
  j["ooms"] = r.ooms;
  j["reclaims"] = r.reclaims;
  j["ooms_survived"] = r.ooms_survived;
  const ReplayIntegrity& in = r.integrity;
  j["integrity"] = {{"policy", std::string(to_string(in.policy))},
                    {"bytes_moved", in.bytes_moved},
                    {"bytes_verified", in.bytes_verified},
                    {"mismatches", in.mismatches},
                    {"retries", in.retries},
                    {"fallbacks", in.fallbacks},
                    {"recovered", in.recovered},
                    {"corrupt", in.corrupt},
                    {"units_retired", in.units_retired},
                    {"batched_disabled", in.batched_disabled},
                    {"batch_probe", in.batch_probe},
                    {"batching_note", in.batching_note}};
  j["device_time_ns"] = r.device_time_ns;
  j["illegal_accesses"] = r.illegal_accesses;
  if (r.race_checked) {
    ordered_json list = ordered_json::array();
    for (const ReplayRace& race : r.race_list) {
      const auto side = [&r](const ReplayRaceSide& s) {
        ordered_json o{{"line", s.line},     {"op", s.op},         {"kind", s.kind},
                       {"access", s.access}, {"stream", s.point.stream}, {"ticket", s.point.ticket},
                       {"id", s.id}};
        if (r.devices > 1) o["device"] = s.device;  // one device's reports keep their keys
        return o;
      };
      list.push_back({{"earlier", side(race.earlier)},
                      {"later", side(race.later)},
                      {"addr", race.addr},
                      {"bytes", race.bytes},
                      {"reuse", race.reuse},
                      {"ordered_by_verification", race.ordered_by_verification}});
    }
    j["races"] = {{"count", r.races}, {"list", std::move(list)}};
  }
  if (r.first_oom.line != 0) {
    j["first_oom"] = {{"line", r.first_oom.line}, {"op", r.first_oom.op}, {"message", r.first_oom.message}};
  }
  j["problems"] = ordered_json::array();
  for (const ReplayProblem& p : r.problems) {
    j["problems"].push_back(
        {{"line", p.line}, {"op", p.op}, {"what", p.what}, {"message", p.message}});
  }
  return j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

namespace {

// The first races of r, a line each.
std::string race_lines(const ReplayReport& r) {
  std::string s;
  constexpr std::size_t kShown = 5;
  for (std::size_t i = 0; i < r.race_list.size() && i < kShown; ++i) {
    const ReplayRace& race = r.race_list[i];
    const auto side = [&r](const ReplayRaceSide& x) {
      return (x.line ? "line " + std::to_string(x.line) : std::string("the end")) + " (" + x.op + ": " + x.kind +
             " " + x.access + " on stream " + std::to_string(x.point.stream) +
             (r.devices > 1 ? " of device " + std::to_string(x.device) : "") +
             (x.id.empty() ? "" : ", id \"" + x.id + "\"") + ")";
    };
    s += "  race: " + side(race.earlier) + " and " + side(race.later) + ", " + human_bytes(race.bytes) +
         " at " + text::hex(race.addr) + (race.reuse ? " - a freed block reused too early" : "") +
         (race.ordered_by_verification ? " - ordered here only by a verified upload's host wait" : "") + "\n";
  }
  return s;
}

// PASS, or FAIL with what failed.
std::string verdict_line(const ReplayReport& r) {
  if (r.passed()) return "verdict: PASS - every check matched and every error was expected\n";
  std::string why;
  auto add = [&](std::uint64_t n, const char* one, const char* many) {
    if (n) why += (why.empty() ? "" : ", ") + text::count(n, one, many);
  };
  add(r.corrupt, "corrupt check", "corrupt checks");
  add(r.unexpected_errors, "unexpected error", "unexpected errors");
  add(r.unexpected_successes, "unexpected success", "unexpected successes");
  add(r.illegal_accesses, "illegal device access", "illegal device accesses");
  add(r.races, "race", "races");
  return "verdict: FAIL - " + why + "\n";
}

}  // namespace

std::string report_summary(const ReplayReport& r) {
  std::string s;
  auto line = [&](const std::string& label, const std::string& value) {
    s += "  ";
    s += label;
    s.append(label.size() < 15 ? 15 - label.size() : 1, ' ');
    s += value;
    s += '\n';
  };
  s += "replay " + r.trace + "\n";
  line("device", r.backend + " " + r.device + (r.devices > 1 ? " x " + std::to_string(r.devices) + " devices" : "") +
                     ", pool capacity " + human_bytes(r.capacity) +
                     ", seed " + std::to_string(r.seed) +
                     (r.faults != "none" ? ", injecting " + r.faults : ""));
  line("ops", std::to_string(r.ops) + (r.skipped ? " (" + std::to_string(r.skipped) +
                                                       " skipped after a failed alloc)"
                                                 : ""));
  line("checks", std::to_string(r.checks) + " compared, " + std::to_string(r.corrupt) + " corrupt" +
                     (r.unwritten_checks ? ", " + std::to_string(r.unwritten_checks) +
                                               " not compared (bytes not modeled)"
                                         : ""));
  std::string errors;
  for (const auto& [code, n] : r.errors) {
    errors += (errors.empty() ? "" : ", ") + code + " " + std::to_string(n);
  }
  if (errors.empty()) {
    errors = "none";
  } else {
    errors += " (" + std::to_string(r.expected_errors) + " expected, " +
              std::to_string(r.unexpected_errors) + " unexpected)";
  }
  line("errors", errors);
  if (r.unexpected_successes) {
    line("expectations", std::to_string(r.unexpected_successes) +
                             " ops succeeded although the trace expected an error");
  }
  std::string peaks = "live " + human_bytes(r.peak_live_bytes) + ", reserved " +
                      human_bytes(r.peak_reserved_bytes);
  if (r.peak_live_bytes > 0) {
    char ratio[64];
    std::snprintf(ratio, sizeof ratio, " (fragmentation ratio %.3f = reserved / live)",
                  static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(r.peak_live_bytes));
    peaks += ratio;
  }
  line("peak", peaks);
  if (r.source) {
    const TorchSnapshotSource& src = *r.source;
    line("snapshot", "PyTorch memory snapshot, device " + std::to_string(src.device) + ": " +
                         std::to_string(src.events) + " events, " + std::to_string(src.allocs) + " allocs, " +
                         std::to_string(src.frees) + " frees, " + std::to_string(src.streams) + " streams, " +
                         std::to_string(src.reconstructed_blocks) + " blocks alive before the history began, " +
                         std::to_string(src.ooms) + " OOMs");
    line("pytorch", "PyTorch reserved " + human_bytes(src.peak_reserved_bytes) + " at its peak (" +
                        human_bytes(src.peak_requested_bytes) + " requested); ferry reserved " +
                        human_bytes(r.peak_reserved_bytes) + " at capacity " + human_bytes(r.capacity) +
                        " (`ferry bench fragmentation` finds the smallest)");
  }
  line("pressure", text::count(r.ooms_survived, "OOM", "OOMs") +
                       " survived (failed fits a reclaim turned into success), " +
                       text::count(r.reclaims, "reclaim", "reclaims") + ", " + text::count(r.ooms, "OOM", "OOMs") +
                       " returned");
  const ReplayIntegrity& in = r.integrity;
  std::string integrity = std::string(to_string(in.policy)) + ": " + human_bytes(in.bytes_moved) +
                          " moved, " + human_bytes(in.bytes_verified) + " verified";
  if (in.mismatches || in.retries || in.corrupt) {
    integrity += "; " + std::to_string(in.mismatches) + " mismatches caught, " +
                 std::to_string(in.retries) + " retries, " + std::to_string(in.fallbacks) +
                 " fallbacks, " + std::to_string(in.recovered) + " recovered, " +
                 std::to_string(in.corrupt) + " corrupt";
  }
  line("integrity", integrity);
  line("batching", in.batched_disabled ? "off - " + in.batching_note : "on - probe " + in.batch_probe);
  line("device time", human_ns(r.device_time_ns) + (r.modeled_time ? " (virtual)" : ""));
  if (r.illegal_accesses) {
    line("illegal", std::to_string(r.illegal_accesses) + " device ops touched unmapped memory");
  }
  if (r.race_checked) {
    line("races", text::count(r.races, "race", "races") +
                      " (unordered conflicting accesses from different streams)");
    s += race_lines(r);
  }
  for (const ReplayProblem& p : r.problems) {
    s += "  ! ";
    s += p.line ? "line " + std::to_string(p.line) : std::string("at the end");
    s += " (" + p.op + "): " + p.what + (p.message.empty() ? "" : ": " + p.message) + "\n";
  }
  s += verdict_line(r);
  return s;
}

}  // namespace ferry
