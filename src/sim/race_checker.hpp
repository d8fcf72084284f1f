// The sim's race checker (race.hpp): happens-before from stream order, event
// waits and host synchronization, as vector clocks; a shadow of the last
// accesses to every byte range; each issued operation checked against it.
//
// Devices. One checker may serve several sims (a Runtime's devices, which join
// device 0's: SimGpu::join_race_checker): each is a device of the checker, with
// streams of its own, its own device bytes and pool blocks; the host, its clock
// and its bytes are one. A clock then names a ticket for every stream of every
// device (indexed device * kMaxStreams + stream; a clock made before a device
// joined reads 0 for its streams). A wait across devices (a NativeWaitOp on a
// peer's event) joins with the clock of the peer's point, and a peer copy reads
// the peer's bytes in the peer's shadow, so a race between two devices' work is
// found like one between two streams.
//
// Clocks. VC(s, t), the clock of ticket t of stream s, names for every stream u
// the last ticket of u that completes before (s, t) starts. Within a stream the
// clock only grows at a join: a WaitOp (join with the clock of its point) or the
// first op after a host wait (join with the host's clock, which a host wait on a
// point joined with that point's clock). So a stream keeps its clocks as
// segments, one per join, and VC(s, t) is its segment's clock with [s] = t.
// The pool's own orderings (make_ready's waits) are WaitOps: nothing else to know.
//
// The host's clock joins a point's clock whenever the host learns the point
// completed: a wait, a synchronize, or a poll that saw it (the pool reuses a
// block on another stream once a poll says its users finished).
//
// Races. a happens before b iff VC(b)[a.stream] >= a.ticket. Each byte range of
// the shadow holds its last write and, per stream, its last read since that write
// (a later read of a stream covers its earlier ones: if b is ordered after the
// later it is ordered after both). An op is checked when it is issued, against
// everything issued before it, which is all that can race with it: an op issued
// earlier cannot wait for one issued later.
//
// Cost: a clock join (64 entries per device) per wait and per host wait, a lookup
// per range per op (std::map of disjoint ranges, split where accesses differ), and
// memory for one clock per join plus the shadow's ranges, and one name per
// allocation the pools make (kept for the run: a race may name a freed one).
// Thread safety: every method takes the checker's own mutex, a leaf: a sim calls
// it with its own mutex_ held (lock order: the sim's mutex_, then this one).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/backend.hpp"
#include "ferry/race.hpp"

namespace ferry::sim {

class RaceChecker {
 public:
  // One device (0); add_device adds the others.
  explicit RaceChecker(std::size_t keep) : keep_(keep), devices_(1) {}

  // A further device, with nothing issued yet; returns its index.
  std::uint32_t add_device();

  // What a device's op reaches on another device of this checker: the peer's
  // index and, for a wait across devices, the point it waits for.
  struct PeerSide {
    std::uint32_t device = 0;
    StreamPoint point;
  };
  // `op` is issued as (stream, ticket) of `device`; records its accesses, and the
  // races they make with earlier ones. `peer`: the device a PeerCopyOp reads or a
  // NativeWaitOp waits on, when it is one of this checker's.
  void issue(std::uint32_t device, StreamId stream, Ticket ticket, const Op& op, const PeerSide* peer = nullptr);
  // The host saw `point` complete (a wait), or every issued op (a synchronize).
  void host_waited(std::uint32_t device, StreamPoint point);
  void host_synchronized(std::uint32_t device, const std::array<Ticket, kMaxStreams>& issued);
  // The host reads or writes host bytes that copies may use: a race with any of
  // them the host has not seen complete.
  void host_access(const std::byte* ptr, std::uint64_t bytes, Access access);
  // Device bytes [addr, addr + bytes) are now the pool block `handle` (note_block).
  void block(std::uint32_t device, std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
             std::string_view tag);

  // A copy of what was found so far.
  RaceLog log() const;

 private:
  using Clock = std::vector<Ticket>;  // by device * kMaxStreams + stream; missing entries are 0
  struct Segment {
    Ticket from = 0;  // first ticket this clock applies to
    Clock clock;
  };
  static constexpr std::uint32_t kNoBlock = UINT32_MAX;
  struct Side {
    std::uint32_t device = 0;
    StreamPoint op;
    std::string_view kind;  // op_name(): static storage
    Access access = Access::read;
    std::string tag;
    std::uint32_t block = kNoBlock;  // blocks_[block] owned the bytes when it touched them
  };
  struct Shadow {  // the state of bytes [start, end)
    std::uint64_t end = 0;
    std::optional<Side> write;
    std::vector<Side> reads;  // at most one per stream: its last read since `write`
  };
  using ShadowMap = std::map<std::uint64_t, Shadow>;  // by start; disjoint
  struct Owner {
    std::uint64_t end = 0;
    std::uint32_t block = kNoBlock;
  };
  struct Device {
    std::array<std::vector<Segment>, kMaxStreams> segments;
    ShadowMap shadow;                      // its device bytes
    std::map<std::uint64_t, Owner> owners;  // by start; disjoint: the allocation holding each range now
  };

  // Everything below runs with mu_ held.
  static std::size_t slot(std::uint32_t device, StreamId stream) {
    return std::size_t{device} * kMaxStreams + stream;
  }
  static Ticket at(const Clock& c, std::size_t i) { return i < c.size() ? c[i] : 0; }
  // c = max(c, other), entry by entry; true when an entry grew.
  static bool join(Clock& c, const Clock& other);
  Clock clock_of(std::uint32_t device, StreamPoint p) const;
  static bool ordered(const Side& a, const Clock& b) { return at(b, slot(a.device, a.op.stream)) >= a.op.ticket; }
  void host_waited_locked(std::uint32_t device, StreamPoint point);
  // Splits the shadow so that [addr, end) starts and ends on range boundaries.
  static void split_at(ShadowMap& shadow, std::uint64_t addr);
  // `owners`: the device's blocks when the shadow is its device bytes, else null.
  void access(ShadowMap& shadow, const std::map<std::uint64_t, Owner>* owners, const Side& side, const Clock& clock,
              std::uint64_t addr, std::uint64_t bytes);
  // Counts and keeps the race of `later` with `earlier` over [addr, addr + bytes),
  // merged with one already kept for the same two ops.
  void report(const Side& earlier, const Side& later, std::uint64_t addr, std::uint64_t bytes);
  // The blocks_ entry of the allocation that holds `addr` now, or kNoBlock.
  static std::uint32_t block_at(const std::map<std::uint64_t, Owner>& owners, std::uint64_t addr);

  mutable std::mutex mu_;
  std::size_t keep_;
  std::vector<Device> devices_;
  Clock host_;
  ShadowMap host_shadow_;  // host bytes copies read or write (one host for every device)
  // Every allocation the pools named, in order; an index never changes, so a side
  // keeps naming the allocation it touched after the bytes are handed out again.
  std::vector<RaceBlock> blocks_;
  RaceLog log_;
};

}  // namespace ferry::sim
