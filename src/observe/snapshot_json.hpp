// The JSON forms of pool statistics and snapshots, shared by snapshot_json()
// and the timeline (which nests snapshots in a larger document).
#pragma once

#include <nlohmann/json.hpp>

#include "ferry/pool_snapshot.hpp"

namespace ferry::observe {

using Json = nlohmann::ordered_json;

inline Json stats_to_json(const PoolStats& s) {
  return Json{
      {"allocated_bytes", s.allocated_bytes},   {"peak_allocated_bytes", s.peak_allocated_bytes},
      {"requested_bytes", s.requested_bytes},   {"peak_requested_bytes", s.peak_requested_bytes},
      {"reserved_bytes", s.reserved_bytes},     {"peak_reserved_bytes", s.peak_reserved_bytes},
      {"active_bytes", s.active_bytes},         {"peak_active_bytes", s.peak_active_bytes},
      {"pending_free_bytes", s.pending_free_bytes}, {"cached_bytes", s.cached_bytes},
      {"allocs", s.allocs},                     {"frees", s.frees},
      {"internal_allocs", s.internal_allocs},   {"internal_frees", s.internal_frees},
      {"ooms", s.ooms},                         {"reclaims", s.reclaims},
      {"ooms_survived", s.ooms_survived},             {"same_stream_reuses", s.same_stream_reuses},
      {"tight_fits", s.tight_fits},             {"maps", s.maps},
      {"unmaps", s.unmaps},
  };
}

inline Json ranges_to_json(const std::vector<DeviceRange>& runs) {
  Json a = Json::array();
  for (const DeviceRange& r : runs) a.push_back(Json::array({r.addr, r.bytes}));
  return a;
}

inline Json snapshot_to_json(const PoolSnapshot& s) {
  Json segments = Json::array();
  for (const SegmentInfo& g : s.segments) {
    segments.push_back(Json{{"kind", std::string(to_string(g.kind))},
                            {"base", g.base},
                            {"bytes", g.bytes},
                            {"granule", g.granule},
                            {"mapped_bytes", g.mapped_bytes},
                            {"cached_bytes", g.cached_bytes},
                            {"mapped", ranges_to_json(g.mapped)},
                            {"cached", ranges_to_json(g.cached)}});
  }
  Json blocks = Json::array();
  for (std::size_t i = 0; i < s.blocks.size(); ++i) {
    const BlockInfo& b = s.blocks[i];
    Json j{{"addr", b.addr},
           {"bytes", b.bytes},
           {"state", std::string(to_string(b.state))},
           {"stream", b.stream}};
    if (i < s.owners.size() && !s.owners[i].empty()) j["owner"] = s.owners[i];
    blocks.push_back(std::move(j));
  }
  return Json{{"capacity", s.capacity},
              {"stats", stats_to_json(s.stats)},
              {"segments", std::move(segments)},
              {"blocks", std::move(blocks)}};
}

}  // namespace ferry::observe
