// Internal to the workloads: the report of a run over several devices — each
// device's figures (WorkloadReport::devices) and the totals the top level then
// carries (docs/workloads.md, "Several devices").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ferry/workload.hpp"
#include "workloads/env.hpp"
#include "workloads/exec.hpp"

namespace ferry::workloads {

// Fills r.devices from every device of `env` (after the run, every device
// synchronized) and makes r's pool, transfer, time and cache figures their
// totals: byte and event counters summed, peaks summed (an upper bound of the
// peak of the sum), busy times summed, overlap = max(transfer, compute) / (N x
// wall). `planned`: the dry run's peak per device; t0: the host's time when the
// run began. Needs r's wall_ns, completed and cache figures already recorded.
void record_devices(WorkloadReport& r, Env& env, const Exec& live, const Workload& w,
                    const std::vector<std::uint64_t>& planned, double s, std::uint64_t t0);

// The "devices" array of the JSON report: one object per device.
nlohmann::ordered_json devices_json(const std::vector<WorkloadDeviceReport>& devices);

// One summary line per device, through `line(key, value)`.
void devices_summary(const WorkloadReport& r, const std::function<void(const std::string&, const std::string&)>& line);

}  // namespace ferry::workloads
