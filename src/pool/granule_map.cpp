// The granule map: which granules to map and unmap, and how their driver calls ended.
#include "pool/granule_map.hpp"

namespace ferry::detail {

void GranuleMap::unmapped_runs(std::uint64_t first, std::uint64_t last, std::vector<Run>& out) const {
  for (std::uint64_t g = first; g <= last;) {
    if (flags_[g] & kMapped) {
      ++g;
      continue;
    }
    std::uint64_t end = g;
    while (end <= last && !(flags_[end] & kMapped)) ++end;
    out.emplace_back(g, end - g);
    g = end;
  }
}

void GranuleMap::begin_map(const std::vector<Run>& runs) {
  for (const auto& [g, n] : runs) {
    for (std::uint64_t u = g; u < g + n; ++u) flags_[u] |= kMapped | kFresh | kBusy;
    busy_ += n;
  }
}

GranuleMap::MapEnd GranuleMap::end_map(PlacementCore& live, std::uint64_t first, std::uint64_t last,
                                       bool mapped) {
  MapEnd end;
  for (std::uint64_t g = first; g <= last; ++g) {
    if (!(flags_[g] & kFresh)) {
      if (!mapped && live.drop_ref(g) == 0 && pending_[g] == 0) {
        ++end.to_cached;
        list_cached(g);
      }
      continue;
    }
    ++end.fresh;
    --busy_;
    if (mapped) {
      flags_[g] &= static_cast<std::uint8_t>(~(kFresh | kBusy));
    } else {
      flags_[g] &= static_cast<std::uint8_t>(~(kMapped | kFresh | kBusy));
      live.drop_ref(g);
    }
  }
  return end;
}

void GranuleMap::end_unmap(std::uint64_t g, bool ok) {
  flags_[g] &= static_cast<std::uint8_t>(~kBusy);
  --busy_;
  --unmapping_;
  if (ok) return;
  flags_[g] |= kMapped;
  if (!(flags_[g] & kListed)) {
    flags_[g] |= kListed;
    cached_.insert(cached_.begin(), static_cast<std::uint32_t>(g));  // no allocation: reserved in reserve()
  }
}

namespace {
bool fail(std::string* why, const char* what) {
  if (why) *why = what;
  return false;
}
}  // namespace

bool GranuleMap::validate(const PlacementCore& live, const std::vector<std::uint32_t>& pending, Tally& t,
                          std::string* why) const {
  if (live.granules() != flags_.size() || pending_.size() != flags_.size() || pending.size() != flags_.size())
    return fail(why, "granule arrays disagree in length");
  std::uint64_t busy = 0, unmapping = 0, listed = 0;
  for (std::uint64_t g = 0; g < flags_.size(); ++g) {
    const bool is_mapped = flags_[g] & kMapped;
    const bool used = in_use(live, g);
    if (pending_[g] != pending[g]) return fail(why, "granule pending reference count wrong");
    if (used && !is_mapped) return fail(why, "a block touches an unmapped granule");
    if ((flags_[g] & kFresh) && !(flags_[g] & kBusy)) return fail(why, "a granule is left marked fresh");
    if (flags_[g] & kBusy) {
      ++busy;
      if (!is_mapped) ++unmapping;
      if (is_mapped != used) return fail(why, "a busy granule is unmapped in use, or mapped for nobody");
    }
    if (flags_[g] & kListed) ++listed;
    if (is_mapped) ++t.mapped;
    if (is_mapped && !used) {
      ++t.cached;
      if (!(flags_[g] & kListed)) return fail(why, "a cached granule is not on the cached list");
    }
  }
  if (listed != cached_.size()) return fail(why, "cached list and listed flags disagree");
  if (busy != busy_ || unmapping != unmapping_) return fail(why, "busy granule counts disagree with the busy flags");
  return true;
}

}  // namespace ferry::detail
