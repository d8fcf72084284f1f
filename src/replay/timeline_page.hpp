// The data the timeline's HTML page embeds (timeline_html.cpp): the timeline
// with its samples folded into at most kChartColumns columns (min, max and last
// value of each series per column), the first kMaxEvents OOM and reclaim steps,
// its layouts and keyframes, the largest live blocks at the peak
// (kLargestBlocks) and, for an imported PyTorch snapshot, PyTorch's reserved
// bytes as one more series (torch_reserved_bytes). Its size is bounded whatever the trace's length:
// columns, events and keyframes are (the keyframes by Keyframes' weight budget).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ferry/pool_timeline.hpp"

namespace ferry::replay {

inline constexpr std::size_t kChartColumns = 2000;
inline constexpr std::size_t kMaxEvents = 2000;
inline constexpr std::size_t kLargestBlocks = 12;  // "largest_at_peak": the live blocks listed

std::string timeline_page_json(const PoolTimeline& timeline);

// The page's script, without its <script> tags (timeline_script.cpp).
extern const std::string_view kTimelineScript;

}  // namespace ferry::replay
