// SimGpu: the discrete-event model behind make_sim_backend().
//
// Model. Each stream keeps every issued operation that has not completed, in
// ticket order (held streams are the HoldingBackend layer's: only issued work
// reaches the model). Only a stream's front operation can be running (streams
// are FIFOs). There is one compute engine (fill, compute, user ops,
// hash, device-to-device copy) and profile.copy_engines copy engines
// (host<->device); waits and no-ops need none.
//
// Host link. The host<->device link is one shared resource per direction, full
// duplex: a host->device copy (plain or batched) needs a free copy engine *and*
// the host->device link, a device->host copy a free engine and the device->host
// link. So same-direction copies serialize on their link, each at the profile's
// full bandwidth (two concurrent uploads take as long as the two back to back,
// never twice the link's bandwidth), while an upload and a download overlap when
// the profile has two or more copy engines (with one, the engine serializes
// them). Serializing rather than splitting the bandwidth keeps every op's
// duration fixed at its start, so the schedule stays a plain function of the
// options; the latency a real link overlaps with another transfer is charged
// in full to each copy. The clock moves only inside run_until(), which
// alternates "start whatever is ready now" and "jump to the next completion and
// apply its bytes", so an operation's bytes change exactly at its completion.
//
// Peer copies (PeerCopyOp) need a copy engine and the pair's link, not the host
// link. The source's bytes are read from the peer sim when the op completes, as
// the peer's model stands then, and land in the destination at once, like any
// copy's: a source written or unmapped on the peer before the copy ran shows as
// wrong bytes or an illegal access, not as a lucky pass (the caller orders the
// source's writes before it and leases the source until it completed).
//
// Waits across devices (a NativeWaitOp on another sim's event, Runtime::order_after)
// are resolved when issued: the peer's model runs until the event's point
// completed there, as a host wait on the peer would run it (the peer's later work
// is issued no earlier), and the wait completes here no earlier than that moment
// of the peer's clock (the clocks of one process's sims share one axis from 0). A
// point that had completed before stands at its stream's last completion then,
// no earlier than its own. The peer's model never waits on another device's in
// turn (its own such waits were resolved when issued), so this cannot recurse.
//
// Durations come from the one cost model (cost_model.hpp).
//
// Between calls every issued op that can start at now_ has started
// (issuing starts work at once, as a real submission does, so a free engine
// goes to the first op submitted). Completions, even of zero-length work, happen
// only when wait, synchronize or advance runs the clock, so polling (completed,
// peek, now_ns) never changes the schedule it observes.
//
// Thread safety: every public method takes mutex_; the model runs entirely under
// it (a "blocking" wait costs no real time, only virtual time). Lock order: the
// hold layer's lock, then mutex_. A peer sim's mutex_ is taken only with this
// one's not held (a wait across devices): every mutex_ is a leaf. A peer copy
// reads the peer's memory_ under the peer's memory_mu_ alone, which every change
// of memory_ also takes (after mutex_) and which is held while taking no other
// lock: a leaf too.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/cost_model.hpp"
#include "ferry/holding_backend.hpp"
#include "ferry/sim_backend.hpp"
#include "sim/device_memory.hpp"
#include "sim/fault_model.hpp"
#include "sim/pinned_host_memory.hpp"
#include "sim/race_checker.hpp"

namespace ferry::sim {

class SimGpu final : public HoldingBackend<SimBackend> {
 public:
  explicit SimGpu(const SimOptions& options);

  const DeviceInfo& info() const noexcept override { return info_; }

  Result<std::uint64_t> reserve_address(std::uint64_t bytes) override;
  Result<void> release_address(std::uint64_t base, std::uint64_t bytes) override;
  Result<void> map(std::uint64_t addr, std::uint64_t bytes) override;
  Result<void> unmap(std::uint64_t addr, std::uint64_t bytes) override;
  std::uint64_t mapped_bytes() const override;


  Result<std::byte*> allocate_pinned(std::uint64_t bytes) override;
  Result<void> free_pinned(std::byte* ptr) override;
  Result<void> register_host(std::byte* ptr, std::uint64_t bytes) override;
  Result<void> unregister_host(std::byte* ptr) override;
  HostMemoryStats host_stats() const override;

  std::uint64_t now_ns() const override;

  void advance(std::uint64_t ns) override;
  FaultCounters fault_counters() const override;
  std::shared_ptr<const RaceLog> race_log() const override;
  Result<void> join_race_checker(Backend& first) override;
  void note_host_access(const std::byte* ptr, std::uint64_t bytes, Access access) override;
  void note_block(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
                  std::string_view tag) override;
  Result<void> peek(std::uint64_t addr, std::span<std::byte> out) const override;
  bool validate(std::string* why = nullptr) const override;

 protected:
  // HoldQueues::Device: the primitives under the hold layer.
  Result<void> admit(StreamId stream, const Op& op) override;
  Result<Ticket> issue(StreamId stream, Op op) override;
  Ticket issued_completed(StreamId stream) override;
  Result<void> wait_issued(StreamPoint point, std::chrono::nanoseconds timeout) override;
  Result<void> synchronize_issued() override;
  // Native streams are tokens: the address of the stream's state. Events are
  // tokens too, each standing for the point it was exported for.
  Result<NativeStream> native_of(StreamId stream) override;
  Result<void> bind_stream(StreamId stream, NativeStream native) override;
  Result<void> unbind_stream(StreamId stream) override;
  Result<NativeEvent> export_issued(StreamPoint point) override;
  Result<void> release_export(NativeEvent event) override;
  // sim_graph.cpp: SimOptions::native_graphs.
  Result<NativeGraph> build_graph(StreamId stream, std::vector<Op> ops) override;

 private:
  bool validate_locked(std::string* why) const;
  // With heavy validation on (validation.hpp), validate() after every operation.
  void heavy_check() const;

  static constexpr std::uint32_t kNoUnit = UINT32_MAX;

  struct PendingOp {
    Ticket ticket = 0;
    Op op;
    Engine engine = Engine::none;  // cost_model.hpp; copies also own their link direction
    std::uint64_t issued_ns = 0;
    bool started = false;
    std::uint32_t unit = kNoUnit;  // index into compute_/copy_ owners while started
    std::uint64_t finish_ns = 0;
    std::uint64_t not_before_ns = 0;    // a wait across devices: its point's completion on the peer
  };

  // Where a peer's event stands once its point completed (run_to_event).
  struct PeerPoint {
    StreamPoint point;
    std::uint64_t done_ns = 0;  // on the peer's clock
  };

  // completed <= submitted; ops.size() == submitted - completed;
  // ops[i].ticket == completed + 1 + i; only ops.front() may have started.
  struct StreamState {
    Ticket submitted = 0;
    Ticket completed = 0;
    std::uint64_t last_completion_ns = 0;
    std::deque<PendingOp> ops;
    StreamFault fault;  // a user kernel that failed (user_kernel.hpp)
  };

  enum class RunEnd { done, reached, stuck };

  // Everything below runs with mutex_ held.
  Result<void> check_healthy() const;
  bool point_complete(StreamPoint point) const;
  // Starts what is ready at now_ and completes what is due at now_, until neither
  // changes anything.
  void settle();
  // Runs the model until done() holds (RunEnd::done), the clock reaches `until`
  // with done() still false (reached; the clock is then `until`), or nothing can
  // ever progress (stuck; the clock stays at the last event).
  template <class Done>
  RunEnd run_until(std::uint64_t until, Done&& done);
  void start_ready_ops();
  std::optional<std::uint64_t> next_completion() const;
  void complete_ops_at(std::uint64_t t);
  std::uint64_t duration_ns(const Op& op) const;
  void apply(StreamId stream, const PendingOp& pending);
  // Runs a user kernel on host copies of its operands; writes back on success.
  Result<void> run_user(StreamId stream, Ticket ticket, const UserOp& op);
  std::optional<std::string> find_unmapped(const Op& op) const;
  // Stores now what the op's writes will need (DeviceMemory::prepare_*), so the
  // model's refusal is the enqueue's out_of_memory. Changes no byte.
  Result<void> prepare_storage(const Op& op);
  bool swallowed(const CopyToDeviceOp& copy) const;
  // The sim a PeerCopyOp reads from, or invalid_argument (not another sim).
  Result<const SimGpu*> peer_sim(StreamId stream, const PeerCopyOp& op) const;
  // A PeerCopyOp's source bytes, read from the peer's memory as it stands now;
  // invalid_argument when the peer has no mapping behind them. Takes the peer's
  // memory_mu_ only (no lock of this sim's may be held but mutex_).
  Result<std::vector<std::byte>> read_peer(StreamId stream, const PeerCopyOp& op) const;
  // Bytes [addr, addr + out.size()) of this sim's memory, read for a peer under
  // memory_mu_ alone; with `out` empty only checks they are mapped
  // (`bytes` long). Errors: invalid_argument (unmapped; names the address).
  Result<void> read_for_peer(std::uint64_t addr, std::uint64_t bytes, std::span<std::byte> out) const;
  // The other sim a NativeWaitOp's `peer` names, or invalid_argument (not a sim,
  // this one, or an event it did not make). Takes the peer's mutex_, not this one's.
  Result<SimGpu*> peer_of(StreamId stream, const NativeWaitOp& wait) const;
  // Runs this sim's model until the point of `event` (one export_event made)
  // completed; what a peer's wait across devices waits for. Takes mutex_.
  // Errors: invalid_argument (an unknown event), backend_error (a device fault),
  // timeout (the point can never complete: a bug).
  Result<PeerPoint> run_to_event(NativeEvent event);
  // `peer`'s device in this sim's race checker (with `point`, a wait's), when the
  // peer is a sim sharing it; else none (the op is checked on this device alone).
  std::optional<RaceChecker::PeerSide> races_shared_with(Backend& peer, StreamPoint point) const;
  std::optional<StreamPoint> host_pointer_user(const std::byte* begin, std::uint64_t bytes) const;
  // note_block's work when a race checker is on: out of line, so a pool allocation
  // without one pays only the test.
  [[gnu::noinline]] void note_block_checked(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
                                            std::string_view tag);

  const DeviceProfile profile_;
  const FaultModel faults_;
  DeviceInfo info_;

  mutable std::mutex mutex_;
  std::uint64_t now_ = 0;
  // Taken by every change of memory_ (mutex_ held) and by a peer's read of it
  // (read_for_peer, mutex_ not held), so this sim's own reads need only mutex_.
  mutable std::mutex memory_mu_;
  DeviceMemory memory_;
  PinnedHostMemory host_;
  std::vector<StreamState> streams_;
  std::uint64_t active_ = 0;  // bit s set <=> streams_[s].ops is not empty
  std::vector<std::optional<StreamId>> compute_;  // owner of each compute engine
  std::vector<std::optional<StreamId>> copy_;     // owner of each copy engine
  // Owner of each direction of the host link: a stream whose started front op
  // is a copy in that direction, which also owns a copy engine.
  std::array<std::optional<StreamId>, 2> link_;
  ContentHasher hasher_;
  std::uint64_t map_calls_ = 0;
  std::uint64_t illegal_accesses_ = 0;
  std::uint64_t swallowed_copies_ = 0;
  std::uint64_t swallowed_peer_copies_ = 0;
  std::uint64_t failed_maps_ = 0;
  std::map<const void*, std::unique_ptr<StreamPoint>> events_;  // export_event's, by token
  // Null unless SimOptions::race_check; shared with the other sims of a Runtime
  // (join_race_checker), where this one is device race_device_. Both change only
  // in join_race_checker, before this sim's first op, so peers read them unlocked.
  std::shared_ptr<RaceChecker> races_;
  std::uint32_t race_device_ = 0;
  std::string first_fault_;  // set by the first illegal access; sticky
};

}  // namespace ferry::sim
