// The data the timeline's HTML page embeds (timeline_html.cpp): the timeline
// with its samples folded into at most kChartColumns columns (min, max and last
// value of each series per column), the first kMaxEvents OOM and reclaim steps,
// its layouts and keyframes. Its size is bounded whatever the trace's length:
// columns, events and keyframes are (the keyframes by Keyframes' weight budget).
#pragma once

#include <cstddef>
#include <string>

#include "ferry/pool_timeline.hpp"

namespace ferry::replay {

inline constexpr std::size_t kChartColumns = 2000;
inline constexpr std::size_t kMaxEvents = 2000;

std::string timeline_page_json(const PoolTimeline& timeline);

}  // namespace ferry::replay
