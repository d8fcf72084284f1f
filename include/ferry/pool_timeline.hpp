// ferry — the pool over time: a replay sampled after every operation, with
// layout snapshots at chosen moments, as JSON and as a self-contained HTML page
// (docs/spec.md §1; `ferry snapshot TRACE` is its command line).
//
// observe_replay() replays a trace (replay.hpp) with an observer that reads the
// pool's statistics after every op, and takes layout snapshots (pool_snapshot.hpp)
// at: the end of the trace (after its last op, before the replay's own final
// synchronize and frees), the peak (the first op after which reserved bytes,
// then allocated bytes, were highest), the first op that met out_of_memory, and
// optionally the first op on or after a given trace line; and keyframes, evenly
// spaced, for a page that shows the layout at any point it is clicked. Each
// block is named after the trace id it was allocated for, a pending-free one too. The sim is deterministic (same seed, same schedule), so the
// peak, known only once the replay is over, is snapshotted by replaying a second
// time when it is not one of the other moments; a second replay that does not
// match the first is reported in PoolTimeline::note.
//
// Thread safety: reentrant; each call builds its own backend and pool. Blocks for
// as long as the replays run (twice at most).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/pool_snapshot.hpp"
#include "ferry/replay.hpp"
#include "ferry/result.hpp"

namespace ferry FERRY_API {

// The pool after one step of a replay (ReplayStep::index).
struct PoolSample {
  std::size_t index = 0;  // 0: start; i: after op i; ops + 1: after the replay's end
  std::size_t line = 0;   // the op's trace line; 0 for start and end
  std::string op;         // "alloc", ..., "start", "end"
  std::uint64_t now_ns = 0;  // backend clock (virtual on sim)
  std::uint64_t requested_bytes = 0;  // live, as requested
  std::uint64_t allocated_bytes = 0;  // live, as the pool rounds them
  std::uint64_t reserved_bytes = 0;   // mapped
  std::uint64_t pending_free_bytes = 0;
  std::uint64_t cached_bytes = 0;     // mapped, touched by no block
  std::uint64_t ooms = 0, reclaims = 0;  // running totals
  // The graphs' private pools (ReplayStep), inside the live bytes above.
  std::uint64_t graph_pool_reserved_bytes = 0, graph_pool_allocated_bytes = 0;
  friend bool operator==(const PoolSample&, const PoolSample&) = default;
};

struct PoolLayout {
  std::string moment;  // "peak", "oom", "end", "line" or "keyframe"
  std::string title;   // what a person reads: "peak reserved: after line 42 (alloc)"
  PoolSample at;       // the sample the snapshot goes with
  PoolSnapshot snapshot;  // blocks named by their trace ids
};

inline constexpr std::size_t kMaxKeyframes = 200;
inline constexpr std::size_t kKeyframeWeight = 40000;

struct TimelineOptions {
  ReplayOptions replay;  // its on_step is the timeline's own (any given is replaced)
  // Also snapshot after the first op on or after this trace line (1-based).
  std::optional<std::size_t> at_line;
  // Optional: called after every step of each replay with the phase ("replay",
  // then "peak layout" when a second replay is needed), steps done and the total.
  std::function<void(std::string_view phase, std::size_t done, std::size_t total)> progress;
};

struct PoolTimeline {
  std::string trace;
  std::string backend, device;
  std::uint64_t capacity = 0, granule = 0, seed = 0;
  std::vector<PoolSample> samples;  // one per ReplayStep, in order
  std::vector<PoolLayout> layouts;  // peak first, then the first OOM, end, line (each when there is one)
  // Layouts (moment "keyframe") every few steps, evenly spaced by index, and
  // after the trace's last op: at most kMaxKeyframes, holding about
  // kKeyframeWeight blocks and mapped or cached runs in all at most (fewer,
  // further apart, past that), so a page of any trace stays bounded.
  std::vector<PoolLayout> keyframes;
  ReplayReport report;              // of the first replay
  std::string note;                 // "" or why a layout may not match the samples
  // 1, or 2 when the peak's layout took a second replay: the first takes it as the
  // peak rises while that costs at most kPeakLayoutWeightPerStep blocks and runs
  // per step replayed (a trace that peaks at every op, say, goes past it).
  std::size_t replays = 1;
};

inline constexpr std::size_t kPeakLayoutWeightPerStep = 64;

// Replays the trace at `path` (or the text, named `name` in messages) and
// samples it. Errors: those of replay_trace_file/replay_trace_text (nothing
// has run), and invalid_argument when at_line is 0 or past the trace's last
// op (found after the first replay). Problems while replaying are in
// PoolTimeline::report, as for a replay.
Result<PoolTimeline> observe_replay(const std::string& path, const TimelineOptions& options);
Result<PoolTimeline> observe_replay_text(std::string_view text, std::string_view name,
                                         const TimelineOptions& options);

// One JSON object: {"trace", "backend", "device", "capacity", "granule", "seed",
// "note", "report": {report_json's object}, "samples": {"index": [...], "line":
// [...], "op": [...], "now_ns": [...], "requested_bytes": [...], ...} (columns of
// equal length; "graph_pool_reserved_bytes" and "graph_pool_allocated_bytes" only
// when a graph's private pool held a block), "layouts": [{"moment", "title", "index", "line", "op",
// "now_ns", "snapshot": {snapshot_json's object}}], "keyframes": [as layouts]}.
std::string timeline_json(const PoolTimeline& timeline);

// A single HTML page with no external resources (drawn by inline script on a
// canvas and in inline SVG): the pool over time (live, reserved, pending-free and
// cached bytes, with the capacity, OOMs, reclaims and the layout moments
// marked; past 2000 samples each pixel column shows the min and max of the
// samples it stands for), the first OOM's diagnostic, and the layout (each
// reserved range, its mapped and cached granules, its blocks colored by state
// and stream and named by owner) at the peak, the first OOM, the end, --at, and
// at any point of the chart one clicks (the keyframe at or before it; also
// FILE.html#op=N), the largest live blocks at the peak, and for an imported
// PyTorch snapshot its own reserved bytes as one more line. Its size is bounded
// whatever the trace's length.
std::string timeline_html(const PoolTimeline& timeline);

}  // namespace ferry
