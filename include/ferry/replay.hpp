// ferry — replaying an allocation trace against a backend and a device pool
// (docs/spec.md §3), with a host reference model of every buffer's bytes.
//
// A trace is JSON Lines, one operation per line: alloc, free, fill, upload,
// compute, hold, release, sync, trim, check, wait, user, capture, replay. Blank lines are ignored; fields a
// trace does not need are ignored too (a recorder may add metadata). The whole
// trace is validated before anything runs; the first problems are returned as
// one `invalid_argument` error whose lines read "FILE:LINE: what is wrong".
//
// Semantics beyond the minimum, decided here (docs/spec.md §3 lists them):
//   * `expect` is allowed on every op: "oom" (= "out_of_memory") or any error
//     code name. The named error is counted in `errors` but not as unexpected;
//     an op that succeeds although an error was expected is counted in
//     `unexpected_successes` and fails the verdict (the trace's claim was wrong).
//   * Ops that touch an id whose alloc failed (expectedly or not) are skipped and
//     counted in `skipped`; the failure itself was counted once.
//   * An id may be allocated again after `free`, or after an alloc that carried
//     `expect`; allocating an id that is still live is malformed.
//   * A fresh allocation's bytes are undefined: `check` before the first write
//     compares nothing and is counted in `unwritten_checks`.
//   * Trace order is the program order. When an op reads or writes an id that
//     an unfinished op on another stream wrote (or, for a write, read), the
//     replay makes its stream wait for that op (an event wait), as a program
//     would; if the producer's stream is held, its held commands are dispatched
//     first so the wait can be satisfied (the hold stays on).
//   * `check` copies on the stream that last wrote the id and waits for that copy.
//   * `upload` takes a block from a host arena, writes the pattern into it, and
//     hands it to a transfer engine (TransferEngine::upload, under the chosen
//     integrity policy), then frees the block (the arena keeps it until the copy
//     completed). Under `verify` the upload waits for its own hash, so it also
//     dispatches what its stream holds up to it. An upload returned as
//     `transfer_corrupt` is an error like any other (expectable); the id's
//     bytes are unknown after it, so later checks of it compare nothing.
//   * `copy` runs TransferEngine::copy_on_device under the integrity policy; the
//     reference follows a copy of the whole destination from the same offset
//     (ExpectedBytes::copied), and leaves any other destination unknown.
//   * `capture` / `replay` (graph.hpp): a capture's ops on its stream go through
//     Runtime::calls(), which records them (fill, compute, user, copy — refused
//     under verify; an alloc there
//     comes from the graph's private pool, a free of such a block is deferred)
//     or refuses them (hold, release, sync and wait with that stream; the
//     capture is spoiled and its `end` returns the refusal). The replay records
//     no upload in a capture (invalid_argument). `replay` orders its stream, as
//     for any op, after other streams' unfinished work on the graph's ids, then
//     Runtime::launch; the reference applies the recorded ops, in order, at the
//     launch. Under --strict nothing is ordered, so a launch that races another
//     stream's op is reported as a race naming the `replay` line.
//   * Several devices (a meta `devices` N): a Runtime of N devices; each op runs
//     on its `device`'s stack, an id lives on its alloc's device, a `wait` with
//     `for_device` is Runtime::order_after across devices, `copy_peer` is
//     Runtime::copy_peer, and the waits the replay inserts reach across devices
//     where an id's last user ran on another. Captures are device 0's.
//   * At the end open captures are ended, every graph destroyed, every stream
//     of every device synchronized and every live id freed.
//
// Thread safety: replay functions are reentrant; each call builds its own
// backend, pool, host arena and transfer engine. They block for as long as the replay runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/integrity.hpp"
#include "ferry/result.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/torch_snapshot.hpp"

namespace ferry FERRY_API {

// A trace id whose allocation is live, and its handle in the replay's pool.
struct ReplayLiveId {
  std::string_view id;  // valid during the on_step call only
  DeviceHandle handle;
};

// What a replay shows its observer (ReplayOptions::on_step): the pool as it
// stands between two operations. Valid during the call only.
struct ReplayStep {
  std::size_t index = 0;  // 0: before the first op; i: after op i; total + 1: after the end
  std::size_t total = 0;  // operations in the trace
  std::size_t line = 0;   // the op's line in the trace; 0 at the start and the end
  std::string_view op;    // the op's name; "start" or "end"
  std::uint64_t now_ns = 0;  // backend clock (virtual on sim)
  const DevicePool* pool = nullptr;  // only its const observers may be called
  // The ids whose latest alloc succeeded and that were not freed since. O(ids).
  std::function<std::vector<ReplayLiveId>()> live_ids;
  // The id of the latest allocation whose block covered `addr`, live or freed
  // since ("" when none did): it names a pending-free block, and the part of one
  // that a same-stream reuse left. O(log allocations). Valid during the call.
  std::function<std::string_view(std::uint64_t addr)> owner_at;
  // The private pools of the trace's graphs (graph.hpp), summed: what their
  // blocks request, and of that what the program holds. 0 without graphs.
  std::uint64_t graph_pool_reserved_bytes = 0;
  std::uint64_t graph_pool_allocated_bytes = 0;
};

struct ReplayOptions {
  // The backend (make_backend.hpp): its kind, the sim's profile, seed and
  // injected faults (sim only: any fault with cuda is invalid_argument).
  BackendSpec backend;
  // Pool capacity in bytes; 0: the trace's own (its first-line meta op), else the device's.
  std::uint64_t capacity = 0;
  bool trace_capacity = true;  // false: capacity 0 means the device's, whatever the trace says
  IntegrityPolicy integrity = IntegrityPolicy::verify;  // of every upload
  // The trace's order stands: the replay inserts no cross-stream wait of its own
  // (only the trace's `wait` ops order streams), so a recorded program's ordering
  // bug shows as a race (backend.race_check) or a corrupt check.
  bool strict = false;
  // A PyTorch memory snapshot given in place of a trace (recognised by its
  // content, torch_snapshot.hpp): the device whose history is replayed; empty:
  // the one with the most entries.
  std::optional<int> snapshot_device;
  // Called on the replaying thread before the first op, after every op, and
  // after the final synchronize and frees ("end"). Empty: never called.
  // An exception it throws stops the calls and counts as an unexpected
  // backend_error; the replay itself runs to the end.
  std::function<void(const ReplayStep&)> on_step;
};

// The transfer engine's counters at the end of the replay (IntegrityCounters).
struct ReplayIntegrity {
  IntegrityPolicy policy = IntegrityPolicy::verify;
  std::uint64_t bytes_moved = 0;     // host->device bytes copied, every attempt and canary
  std::uint64_t bytes_verified = 0;  // bytes whose device hash matched (verify)
  std::uint64_t mismatches = 0;      // copies caught wrong (hash or canary)
  std::uint64_t retries = 0;         // copies re-issued after a detected failure
  std::uint64_t fallbacks = 0;       // step-downs to another path
  std::uint64_t recovered = 0;       // uploads' ranges that failed, then arrived intact
  std::uint64_t corrupt = 0;         // ranges returned as transfer_corrupt
  std::uint64_t units_retired = 0;   // pinned chunks retired as bad
  bool batched_disabled = false;     // batching is off (reason in batching_note)
  std::string batch_probe;           // "passed", "failed" or "not run": the start-up probe
  std::string batching_note;         // why batching is off; the probe's detail when on
};

// One side of a race, as the trace has it.
struct ReplayRaceSide {
  std::size_t line = 0;  // the trace line whose work it was; 0: the replay's own (the end)
  std::string op;        // the trace op ("fill", "upload", ...)
  std::string kind;      // the device operation ("fill", "copy_to_device", "hash", ...)
  std::string access;    // "read", "write" or "read_write"
  StreamPoint point;
  std::string id;        // the trace id whose allocation held the bytes then, if any
  std::uint32_t device = 0;  // the device of the op's stream (RaceAccess::device)
};

// Two unordered conflicting accesses (race.hpp). `reuse`: the two sides' bytes
// belonged to different allocations, a freed block reused too early.
struct ReplayRace {
  ReplayRaceSide earlier, later;
  std::uint64_t addr = 0, bytes = 0;
  bool reuse = false;
  // Found only with uploads asynchronous (--strict, integrity other than off): the
  // host's wait for a verified upload ordered the two here; on a GPU whose uploads
  // do not block the host they race.
  bool ordered_by_verification = false;
};

// One thing a person should look at: an unexpected error, an unexpected
// success, or a corrupt check.
struct ReplayProblem {
  std::size_t line = 0;
  std::string op;
  std::string what;  // error code name, "unexpected_success" or "corrupt"
  std::string message;
};

struct ReplayReport {
  std::string trace;  // the name the trace was read under
  // Set when the file was a PyTorch memory snapshot: what its own history says.
  std::optional<TorchSnapshotSource> source;
  std::string backend, device;
  std::uint64_t capacity = 0;  // the pool's capacity as it ran; with several devices, their pools' summed
  std::uint32_t devices = 1;   // the trace's meta `devices`; above 1 the pool figures are summed over them
  std::uint64_t seed = 0;
  std::string faults = "none";  // describe(SimFaults) of what the sim injected

  std::uint64_t ops = 0;               // operations in the trace
  std::uint64_t skipped = 0;           // ops on an id whose alloc failed
  std::uint64_t checks = 0;            // checks that compared bytes
  std::uint64_t unwritten_checks = 0;  // checks that compared nothing: bytes not modeled
  std::uint64_t corrupt = 0;           // checks whose bytes differed
  std::map<std::string, std::uint64_t> errors;  // every error returned, by code
  std::uint64_t expected_errors = 0;
  std::uint64_t unexpected_errors = 0;
  std::uint64_t unexpected_successes = 0;

  std::uint64_t peak_live_bytes = 0;       // pool peak of requested live bytes
  std::uint64_t peak_allocated_bytes = 0;  // the same, rounded as the pool allocates
  std::uint64_t peak_reserved_bytes = 0;   // pool peak of mapped memory
  std::uint64_t ooms = 0, reclaims = 0;
  std::uint64_t ooms_survived = 0;  // failed fits a reclaim turned into success (PoolStats::ooms_survived)
  ReplayIntegrity integrity;

  std::uint64_t device_time_ns = 0;    // backend clock (virtual on sim) spent
  bool modeled_time = false;           // that clock is virtual (DeviceInfo::modeled_time)
  std::uint64_t illegal_accesses = 0;  // sim only: device ops on unmapped memory
  std::vector<ReplayProblem> problems;  // the first kMaxProblems, in trace order
  // The first out_of_memory an op met, expected or not, with the pool's
  // diagnostic as its message; line 0 when there was none.
  ReplayProblem first_oom;
  bool race_checked = false;            // the backend checked for races
  std::uint64_t races = 0;              // every race found
  std::vector<ReplayRace> race_list;    // the first ones (the sim keeps 64)

  static constexpr std::size_t kMaxProblems = 20;

  // The verdict: no corrupt check, no unexpected error or success, no race.
  bool passed() const noexcept {
    return corrupt == 0 && unexpected_errors == 0 && unexpected_successes == 0 &&
           illegal_accesses == 0 && races == 0;
  }
};

// The most a trace file may hold, and the longest line in it (docs/spec.md §3).
inline constexpr std::uint64_t kMaxTraceBytes = std::uint64_t{1} << 30;  // 1 GiB
inline constexpr std::uint64_t kMaxTraceLineBytes = std::uint64_t{1} << 20;  // 1 MiB

// The text of the trace at `path`, read whole. Refused at once, without reading:
// a path that is not a regular file (a directory, a FIFO, a device such as
// /dev/zero). Errors: invalid_argument naming the path and the reason (cannot
// open, not a regular file, a read error part-way, larger than kMaxTraceBytes);
// out_of_memory (host memory cannot hold the text). Never a prefix of the file.
Result<std::string> read_trace_file(const std::string& path);

// Reads the trace at `path` (read_trace_file), validates it, then replays it.
// Errors (nothing has run): read_trace_file's; invalid_argument (malformed trace,
// the message naming FILE:LINE; a trace with no ops, "FILE: the trace is empty";
// unknown profile or backend, bad capacity, faults with a backend other than sim),
// unsupported (the backend is not available here), backend_error (the backend
// or pool could not be set up). Every error while replaying is counted in the
// report instead.
Result<ReplayReport> replay_trace_file(const std::string& path, const ReplayOptions& options);

// The same for a trace held in memory; `name` stands for the file in messages.
Result<ReplayReport> replay_trace_text(std::string_view text, std::string_view name,
                                       const ReplayOptions& options);

// The report as one JSON object (docs/spec.md §5: the stable keys and the extra ones above).
std::string report_json(const ReplayReport& report);

// The report as a few lines a person reads, ending with the verdict.
std::string report_summary(const ReplayReport& report);

}  // namespace ferry
