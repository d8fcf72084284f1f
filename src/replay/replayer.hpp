// Internal to the replay: the Replayer, which runs a validated trace on a
// Runtime's pool, arena and engine, keeping the host reference model beside it
// (replay.hpp states the semantics). Its parts, by job:
//   replayer.cpp         the run: every op in order, an observer after each, the report's totals
//   replay_ops.cpp       what each trace op does, and the cross-stream waits a program would write
//   replay_outcomes.cpp  errors, problems, races and integrity into the report; the end of a run
//   replay_graphs.cpp    capture and replay ops: graphs captured and launched through the Runtime
// runner.cpp makes the Runtime and holds the entry points (replay_trace_text / _file).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/graph.hpp"
#include "ferry/replay.hpp"
#include "ferry/runtime.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/user_kernel.hpp"
#include "replay/reference.hpp"
#include "replay/trace.hpp"

namespace ferry::replay_runner {

using replay::ExpectedBytes;
using replay::IdIndex;
using replay::OpKind;
using replay::Trace;
using replay::TraceOp;

// What the replay knows about one id.
struct Buffer {
  DeviceHandle handle;         // kept after free, so later uses meet stale_handle
  bool allocated = false;      // the latest alloc succeeded
  bool failed = false;         // the latest alloc failed: later ops are skipped
  ExpectedBytes expected = ExpectedBytes::unknown(0);
  std::uint32_t device = 0;    // the device of its latest alloc
  // Hazard tracking across streams: the op that last wrote the bytes, and the
  // ops that read them since, all on streams of `device`.
  std::optional<StreamPoint> last_write;
  UseSet reads;
};

// The kernel a `user` op's replay runs in place of the program's (replay.hpp).
Result<void> stand_in_kernel(const KernelLaunch& launch);

class Replayer {
  struct WorkRun {
    Ticket first;        // the first ticket of the run
    const TraceOp* op;   // the trace op that enqueued it
  };

 public:
  // `runtime` must outlive the Replayer.
  Replayer(const Trace& trace, Runtime& runtime, ReplayReport& report, bool strict)
      : trace_(trace), runtime_(runtime), report_(report), strict_(strict), buffers_(trace.ids.size()),
        racing_(runtime.backend().race_log() != nullptr), work_(runtime.device_count()), graphs_(trace.graphs.size()) {
    for (std::uint32_t d = runtime.device_count(); d-- > 0;) {
      use_device(d);
      pool_->reset_peak_stats();  // the engine's start-up probe is not the trace's
    }
  }

  void run(const std::function<void(const ReplayStep&)>& on_step);

 private:
  void execute(const TraceOp& op);

  // The device whose components backend_ ... engine_ are: the op's, while it runs.
  void use_device(std::uint32_t device);

  // --- which trace line each device op came from (for race reports) -----------

  using Submitted = std::vector<std::array<Ticket, kMaxStreams>>;  // by device, by stream
  Submitted submitted() const;

  void note_work(const Submitted& before, const TraceOp& op);

  const TraceOp* op_of(std::uint32_t device, StreamPoint p) const;

  void fill_races();

  void alloc(const TraceOp& op);

  void free(const TraceOp& op);

  void fill(const TraceOp& op);

  // Host->device copy of fill_pattern(seed): out of an arena block, through the
  // transfer engine and its integrity policy (I5, I6). The one place uploads
  // are routed.
  void upload(const TraceOp& op);

  void compute(const TraceOp& op);

  // A program's own kernel, replayed by its operand marks: on sim the stand-in
  // kernel writes into every writable operand fill_pattern(mix of its readable
  // operands' hashes, in order), so later checks compare bytes as for compute; on
  // a real device it touches nothing, and what it writes is unknown from then on.
  void user(const TraceOp& op);

  void sync(const TraceOp& op);

  // Device->device through the transfer engine, under its integrity policy; the
  // reference follows the bytes where it can (ExpectedBytes::copied).
  void copy(const TraceOp& op);
  ExpectedBytes copied(const TraceOp& op) const;

  // Runtime::copy_peer from the src's device to the dst's (op.device): ordered
  // (unless strict) after the src's writer on both devices' `stream`.
  void copy_peer(const TraceOp& op);

  // A `wait` op: `stream` of op.device waits for `waits_for` of op.for_device.
  void wait(const TraceOp& op);

  // --- graphs (replay_graphs.cpp) ------------------------------------------------

  // What a graph of the trace is: the Graph, and the ops its capture recorded.
  struct GraphRun {
    Graph graph;
    std::vector<const TraceOp*> ops;
    // Host bytes its recorded uploads read and its recorded checks' copies write
    // at every launch: kept until the replay ends (a launch may still run after
    // the graph's destroy), never moved (a deque).
    std::deque<std::vector<std::byte>> host;
    std::map<const TraceOp*, std::vector<std::byte>*> check_targets;  // a recorded check -> its bytes
  };
  // A recorded check's copy launched by a replay: compared at the next sync that
  // covers its stream (or the end), against the reference at that launch.
  struct PendingCheck {
    const TraceOp* op;
    const std::vector<std::byte>* host;
    ExpectedBytes expected;
    StreamId stream;
    IdIndex graph;
  };

  void capture(const TraceOp& op);

  // Launches the graph, ordered (unless strict) after the ops of other streams
  // that its buffers wait for, then applies its recorded ops to the reference.
  void replay(const TraceOp& op);

  // The stream is capturing: `op` goes through Runtime::calls(), which records
  // it or refuses it (as the program's call would be). True when it was taken.
  bool captured(const TraceOp& op);

  // Captures are device 0's.
  bool recording(StreamId stream) const { return device_ == 0 && capturing_[stream].has_value(); }

  // Ends the captures still open and destroys every graph (before the end's frees).
  void close_graphs();

  // Compares the pending checks of `stream` (every stream: nullopt), whose copies completed.
  void compare_pending_checks(std::optional<StreamId> stream);

  // The references a user op leaves in the ids it writes, in operand order.
  std::vector<ExpectedBytes> user_results(const TraceOp& op);
  void user_wrote(const TraceOp& op, StreamPoint point, std::vector<ExpectedBytes> results);

  void check(const TraceOp& op);

  std::vector<ReplayLiveId> live_ids() const;

  // --- cross-stream ordering the program would have written -------------------

  Result<void> order_after_writer(StreamId stream, Buffer& b);

  Result<void> order_after_writers_and_readers(StreamId stream, Buffer& b);

  // `stream` of the current device waits for `point` of device `from`.
  Result<void> wait_on(StreamId stream, std::uint32_t from, StreamPoint point);

  void wrote(Buffer& b, StreamPoint point, ExpectedBytes expected);

  // --- bookkeeping ---------------------------------------------------------------

  bool skip(const Buffer& b) {
    if (!b.failed) return false;
    skipped();
    return true;
  }
  void skipped() { ++report_.skipped; }

  template <class R>
  bool outcome(const TraceOp& op, const R& r) {
    if (r.ok()) return true;
    record(op, r.error());
    return false;
  }

  void record(const TraceOp& op, const Error& e);

  void expect_success(const TraceOp& op);

  void add_problem(std::size_t line, const TraceOp& op, std::string what, std::string message);
  void add_problem(std::size_t line, std::string op, std::string what, std::string message);

  void fill_integrity();

  // Everything enqueued completes before the host buffers and the pool go away.
  void finish();

  const Trace& trace_;
  Runtime& runtime_;
  ReplayReport& report_;
  const bool strict_;
  std::uint32_t device_ = 0;
  Backend* backend_ = nullptr;
  StreamOrder* order_ = nullptr;
  DevicePool* pool_ = nullptr;
  HostArena* arena_ = nullptr;
  TransferEngine* engine_ = nullptr;
  std::vector<Buffer> buffers_;
  // Host buffers handed to enqueued copies to host: each lives until its copy
  // completed (the op that waited for it drops it) or finish() synchronized.
  std::deque<std::vector<std::byte>> copy_targets_;
  const bool racing_;  // the backend checks races: keep what names their sides
  std::vector<std::array<std::vector<WorkRun>, kMaxStreams>> work_;  // by device
  std::vector<GraphRun> graphs_;  // by Trace::graphs index
  std::array<std::optional<IdIndex>, kMaxStreams> capturing_;  // the graph each stream records
  std::vector<PendingCheck> pending_checks_;  // at most one per recorded check: its latest launch
  // For an observer: which id's allocation last covered each byte, as disjoint
  // ranges start -> (end, id), so a pending-free block (or the part of one that
  // a same-stream reuse left) is still named after its id was freed.
  void name_owner(std::uint64_t start, std::uint64_t end, IdIndex id);
  bool naming_owners_ = false;
  std::map<std::uint64_t, std::pair<std::uint64_t, IdIndex>> owners_;
};

}  // namespace ferry::replay_runner
