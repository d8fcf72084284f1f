#include "ferry/pool_snapshot.hpp"

#include <algorithm>
#include <array>

#include "ferry/names.hpp"
#include "observe/snapshot_json.hpp"

namespace ferry {

namespace {

constexpr std::array<NamedValue<SegmentInfo::Kind>, 3> kSegmentKinds{{
    {SegmentInfo::Kind::small, "small"},
    {SegmentInfo::Kind::large, "large"},
    {SegmentInfo::Kind::shared, "shared"},
}};

constexpr std::array<NamedValue<BlockInfo::State>, 3> kBlockStates{{
    {BlockInfo::State::live, "live"},
    {BlockInfo::State::pending_free, "pending_free"},
    {BlockInfo::State::free, "free"},
}};

}  // namespace

std::string_view to_string(SegmentInfo::Kind kind) noexcept { return name_in<SegmentInfo::Kind>(kSegmentKinds, kind); }

std::string_view to_string(BlockInfo::State state) noexcept { return name_in<BlockInfo::State>(kBlockStates, state); }

PoolSnapshot take_snapshot(const DevicePool& pool, std::span<const NamedHandle> owners) {
  PoolSnapshot s;
  s.capacity = pool.capacity();
  s.stats = pool.stats();
  s.segments = pool.segments();
  s.blocks = pool.snapshot();
  s.owners.assign(s.blocks.size(), std::string());
  for (const NamedHandle& o : owners) {
    Result<DeviceSpan> span = pool.resolve(o.handle);
    if (!span.ok()) continue;
    // Blocks are sorted by address; a live block starts where its handle resolves.
    auto it = std::lower_bound(s.blocks.begin(), s.blocks.end(), span->addr,
                               [](const BlockInfo& b, std::uint64_t addr) { return b.addr < addr; });
    while (it != s.blocks.end() && it->addr == span->addr) {
      if (it->state == BlockInfo::State::live) {
        s.owners[static_cast<std::size_t>(it - s.blocks.begin())] = std::string(o.name);
        break;
      }
      ++it;
    }
  }
  return s;
}

std::string snapshot_json(const PoolSnapshot& snapshot) {
  return observe::snapshot_to_json(snapshot).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace ferry
