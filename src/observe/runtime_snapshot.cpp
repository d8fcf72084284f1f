// One snapshot of every device of a Runtime (runtime_snapshot.hpp).
#include "ferry/runtime_snapshot.hpp"

#include <utility>

#include "ferry/devices.hpp"
#include "ferry/runtime.hpp"
#include "observe/snapshot_json.hpp"

namespace ferry {

RuntimeSnapshot take_snapshot(Runtime& rt, std::span<const NamedHandle> owners) {
  RuntimeSnapshot s;
  std::vector<PoolStats> each;
  for (std::uint32_t d = 0; d < rt.device_count(); ++d) {
    // A handle resolves only in its own pool, so every device may see every owner.
    s.devices.push_back(take_snapshot(rt.device(d).pool(), owners));
    s.capacity += s.devices.back().capacity;
    each.push_back(s.devices.back().stats);
  }
  s.stats = total_pool_stats(each);
  return s;
}

std::string snapshot_json(const RuntimeSnapshot& snapshot) {
  if (snapshot.devices.size() == 1) return snapshot_json(snapshot.devices.front());
  observe::Json devices = observe::Json::array();
  for (std::size_t i = 0; i < snapshot.devices.size(); ++i) {
    observe::Json pool = observe::snapshot_to_json(snapshot.devices[i]);
    observe::Json one{{"device", i}};
    for (auto it = pool.begin(); it != pool.end(); ++it) one[it.key()] = std::move(it.value());
    devices.push_back(std::move(one));
  }
  const observe::Json all{{"capacity", snapshot.capacity},
                          {"stats", observe::stats_to_json(snapshot.stats)},
                          {"devices", std::move(devices)}};
  return all.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry
