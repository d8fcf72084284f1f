#include "workloads/device_report.hpp"

#include <algorithm>

#include "core/text.hpp"
#include "ferry/devices.hpp"
#include "ferry/fault_spec.hpp"

namespace ferry::workloads {
namespace {

// The links the runtime's pairs have (Runtime::link_between: the model's on the
// sim, the driver's on cuda) as parse_peer_links reads them ("0-1:nvlink,..."),
// each pair once, lower device first; "none" for none.
std::string links_text(const Runtime& rt) {
  std::string out;
  for (std::uint32_t a = 0; a < rt.device_count(); ++a) {
    for (std::uint32_t b = a + 1; b < rt.device_count(); ++b) {
      const PeerLink link = rt.link_between(a, b);
      if (link == PeerLink::none) continue;
      out += (out.empty() ? "" : ",") + std::to_string(a) + "-" + std::to_string(b) + ":" +
             std::string(to_string(link));
    }
  }
  return out.empty() ? "none" : out;
}

// Counters summed, flags or'ed: what the engines did together.
void add(IntegrityCounters& t, const IntegrityCounters& c) {
  t.bytes_moved += c.bytes_moved, t.bytes_verified += c.bytes_verified;
  t.mismatches += c.mismatches, t.retries += c.retries, t.fallbacks += c.fallbacks;
  t.recovered += c.recovered, t.corrupt += c.corrupt;
  t.transfers += c.transfers, t.ranges += c.ranges, t.batches += c.batches, t.per_copy += c.per_copy;
  t.staged += c.staged, t.pageable += c.pageable;
  t.canaries += c.canaries, t.canary_failures += c.canary_failures, t.units_retired += c.units_retired;
  t.batched_disabled = t.batched_disabled || c.batched_disabled;
  t.pinned_distrusted = t.pinned_distrusted || c.pinned_distrusted;
  t.probe_escalated = t.probe_escalated || c.probe_escalated;
}

// One device's figures.
WorkloadDeviceReport device_report(std::uint32_t i, DeviceEnv& d, const Exec& live, const Workload& w,
                                   std::uint64_t planned, double s, std::uint64_t t0, bool completed) {
  const WorkloadOptions& o = live.options();
  WorkloadDeviceReport x;
  x.index = i;
  x.device = d.backend->info().device;
  x.faults = !o.fault_device || *o.fault_device == i ? describe(o.faults) : "none";
  x.capacity = d.pool->capacity();
  x.planned_peak_live = planned;
  const PoolStats ps = d.pool->stats();
  x.peak_live_bytes = ps.peak_requested_bytes;
  x.peak_reserved_bytes = ps.peak_reserved_bytes;
  x.ooms = ps.ooms, x.ooms_survived = ps.ooms_survived, x.reclaims = ps.reclaims;
  x.integrity = d.engine->counters();
  const FaultCounters f = d.backend->fault_counters();
  x.swallowed_copies = f.swallowed_copies, x.failed_maps = f.failed_maps, x.illegal_accesses = f.illegal_accesses;
  const Exec::PeerTraffic& peer = live.peer_traffic()[i];
  x.peer_copies_in = peer.copies_in, x.peer_bytes_in = peer.bytes_in, x.peer_direct_in = peer.direct_in;
  x.peer_copies_out = peer.copies_out, x.peer_bytes_out = peer.bytes_out;
  const std::uint64_t now = d.backend->now_ns();
  x.wall_ns = now > t0 ? now - t0 : 0;
  x.transfer_busy_ns = d.meter->transfer_ns();
  x.compute_busy_ns = d.meter->compute_ns();
  x.host_busy_ns = live.device_host_busy_ns()[i];
  x.overlap_efficiency =
      x.wall_ns == 0 ? 0 : double(std::max(x.transfer_busy_ns, x.compute_busy_ns)) / double(x.wall_ns);
  x.unit_name = w.device_unit_name();
  x.tokens_unit = w.device_tokens_unit();
  if (i < w.device_units.size()) x.units = w.device_units[i];
  if (i < w.device_tokens.size()) x.tokens = w.device_tokens[i];
  // At full shape, as the run's own figure (workload.hpp).
  x.tokens_per_s = x.wall_ns == 0 || !completed ? 0 : double(x.tokens) / (double(x.wall_ns) / 1e9 / (s * s));
  if (i < w.device_cache_stats.size()) {
    x.has_cache = true;
    x.cache = w.device_cache_stats[i];
    x.cache_slots = w.device_cache_slots[i];
  }
  return x;
}

}  // namespace

void record_devices(WorkloadReport& r, Env& env, const Exec& live, const Workload& w,
                    const std::vector<std::uint64_t>& planned, double s, std::uint64_t t0) {
  const auto n = static_cast<std::uint32_t>(env.devices.size());
  r.links = links_text(*env.runtime);
  r.devices.clear();
  for (std::uint32_t i = 0; i < n; ++i) {
    r.devices.push_back(device_report(i, env.at(i), live, w, planned[i], s, t0, r.completed));
  }
  std::vector<PoolStats> pools;
  r.capacity = r.planned_peak_live = 0;
  r.transfer_busy_ns = r.compute_busy_ns = 0;
  r.integrity = {};
  r.swallowed_copies = r.failed_maps = r.illegal_accesses = 0;
  r.races = 0;
  r.race_list.clear();
  for (std::uint32_t i = 0; i < n; ++i) {
    const WorkloadDeviceReport& x = r.devices[i];
    pools.push_back(env.at(i).pool->stats());
    r.capacity += x.capacity;
    r.planned_peak_live += x.planned_peak_live;
    r.transfer_busy_ns += x.transfer_busy_ns;
    r.compute_busy_ns += x.compute_busy_ns;
    add(r.integrity, x.integrity);
    r.swallowed_copies += x.swallowed_copies, r.failed_maps += x.failed_maps;
    r.illegal_accesses += x.illegal_accesses;
    if (const auto races = env.at(i).backend->race_log()) {
      r.race_checked = true;
      r.races += races->count;
      r.race_list.insert(r.race_list.end(), races->kept.begin(), races->kept.end());
    }
  }
  const PoolStats total = total_pool_stats(pools);
  r.peak_live_bytes = total.peak_requested_bytes;
  r.peak_reserved_bytes = total.peak_reserved_bytes;
  r.fragmentation_ratio = r.peak_live_bytes == 0 ? 0 : double(r.peak_reserved_bytes) / double(r.peak_live_bytes);
  r.pressure = r.capacity == 0 ? 0 : double(r.peak_live_bytes) / double(r.capacity);
  r.ooms = total.ooms, r.ooms_survived = total.ooms_survived, r.reclaims = total.reclaims;
  // The engines of N devices could be busy N x wall: the share of that they were.
  r.overlap_efficiency = r.wall_ns == 0 ? 0
                                        : double(std::max(r.transfer_busy_ns, r.compute_busy_ns)) /
                                              (double(n) * double(r.wall_ns));
}

nlohmann::ordered_json devices_json(const std::vector<WorkloadDeviceReport>& devices) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const WorkloadDeviceReport& x : devices) {
    const IntegrityCounters& c = x.integrity;
    nlohmann::ordered_json d;
    d["index"] = x.index;
    d["device"] = x.device;
    d["faults"] = x.faults;
    d["memory"] = {{"capacity_bytes", x.capacity},       {"planned_peak_live_bytes", x.planned_peak_live},
                   {"peak_live_bytes", x.peak_live_bytes}, {"peak_reserved_bytes", x.peak_reserved_bytes},
                   {"ooms", x.ooms},                     {"ooms_survived", x.ooms_survived},
                   {"reclaims", x.reclaims}};
    d["integrity"] = {{"bytes_moved", c.bytes_moved},     {"bytes_verified", c.bytes_verified},
                      {"mismatches", c.mismatches},       {"retries", c.retries},
                      {"fallbacks", c.fallbacks},         {"recovered", c.recovered},
                      {"corrupt", c.corrupt},             {"units_retired", c.units_retired},
                      {"swallowed_copies", x.swallowed_copies}, {"failed_maps", x.failed_maps},
                      {"peer_copies_in", x.peer_copies_in}, {"peer_bytes_in", x.peer_bytes_in},
                      {"peer_direct_in", x.peer_direct_in}, {"peer_copies_out", x.peer_copies_out},
                      {"peer_bytes_out", x.peer_bytes_out}};
    d["time"] = {{"wall_ns", x.wall_ns},
                 {"transfer_busy_ns", x.transfer_busy_ns},
                 {"compute_busy_ns", x.compute_busy_ns},
                 {"host_busy_ns", x.host_busy_ns},
                 {"overlap_efficiency", x.overlap_efficiency}};
    d["throughput"] = {{"units", x.units},
                       {"unit", x.unit_name},
                       {"tokens", x.tokens},
                       {"tokens_unit", x.tokens_unit},
                       {"tokens_per_s", x.tokens_per_s}};
    if (x.has_cache) {
      d["cache"] = {{"slots", x.cache_slots},       {"hit_rate", x.cache.hit_rate()},
                    {"hits", x.cache.hits},         {"misses", x.cache.misses},
                    {"prefetches", x.cache.prefetches}, {"evictions", x.cache.evictions},
                    {"bytes_uploaded", x.cache.bytes_uploaded}, {"peer_fills", x.cache.fills},
                    {"bytes_peer_filled", x.cache.bytes_filled}};
    } else {
      d["cache"] = nullptr;
    }
    d["illegal_accesses"] = x.illegal_accesses;
    list.push_back(std::move(d));
  }
  return list;
}

void devices_summary(const WorkloadReport& r, const std::function<void(const std::string&, const std::string&)>& line) {
  if (!r.devices.empty()) line("links", r.links);
  for (const WorkloadDeviceReport& x : r.devices) {
    const IntegrityCounters& c = x.integrity;
    std::string v = x.device + ": " + std::to_string(x.units) + " " + x.unit_name;
    if (r.completed) {
      v += ", " + text::fixed(x.tokens_per_s, 0) + " " + x.tokens_unit + "/s, overlap " + text::fixed(x.overlap_efficiency, 3) +
           " (transfer " + text::human_ns(x.transfer_busy_ns, 3) + ", compute " +
           text::human_ns(x.compute_busy_ns, 3) + " in " + text::human_ns(x.wall_ns, 3) + ")";
    }
    v += "; peak live " + text::human_bytes(x.peak_live_bytes, 2) + " of " + text::human_bytes(x.capacity, 2) +
         ", " + std::to_string(x.ooms_survived) + " OOMs survived, " + std::to_string(x.reclaims) + " reclaims; " +
         text::human_bytes(c.bytes_moved, 2) + " moved, " + std::to_string(c.mismatches) + " mismatches, " +
         std::to_string(c.recovered) + " recovered, " + std::to_string(x.swallowed_copies) + " swallowed; " +
         std::to_string(x.peer_copies_in) + " peer copies in (" + std::to_string(x.peer_direct_in) + " direct), " +
         std::to_string(x.peer_copies_out) + " out";
    if (x.has_cache) {
      v += "; cache hit rate " + text::fixed(x.cache.hit_rate(), 3) + ", " + std::to_string(x.cache.fills) +
           " filled from a peer";
    }
    if (x.faults != "none") v += "; faults " + x.faults;
    line("device " + std::to_string(x.index), v);
  }
}

}  // namespace ferry::workloads
