// The sim's race checker (race.hpp): happens-before from stream order, event
// waits and host synchronization, as vector clocks; a shadow of the last
// accesses to every byte range; each issued operation checked against it.
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
// Cost: a 64-entry clock join per wait and per host wait, a lookup per range per
// op (std::map of disjoint ranges, split where accesses differ), and memory for
// one clock per join plus the shadow's ranges, and one name per allocation the
// pool makes (kept for the run: a race may name a freed one). Not thread-safe:
// the sim's lock guards it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <memory>
#include <vector>

#include "ferry/backend.hpp"
#include "ferry/race.hpp"

namespace ferry::sim {

class RaceChecker {
 public:
  explicit RaceChecker(std::size_t keep) : keep_(keep), log_(std::make_shared<RaceLog>()) {}

  // `op` is issued as (stream, ticket); records its accesses, and the races they
  // make with earlier ones.
  void issue(StreamId stream, Ticket ticket, const Op& op);
  // The host saw `point` complete (a wait), or every issued op (a synchronize).
  void host_waited(StreamPoint point);
  void host_synchronized(const std::array<Ticket, kMaxStreams>& issued);
  // The host reads or writes host bytes that copies may use: a race with any of
  // them the host has not seen complete.
  void host_access(const std::byte* ptr, std::uint64_t bytes, Access access);
  // Device bytes [addr, addr + bytes) are now the pool block `handle` (note_block).
  void block(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle, std::string_view tag);

  std::shared_ptr<const RaceLog> log() const { return log_; }

 private:
  using Clock = std::array<Ticket, kMaxStreams>;
  struct Segment {
    Ticket from = 0;  // first ticket this clock applies to
    Clock clock{};
  };
  static constexpr std::uint32_t kNoBlock = UINT32_MAX;
  struct Side {
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

  Clock clock_of(StreamPoint p) const;
  static bool ordered(const Side& a, const Clock& b) { return b[a.op.stream] >= a.op.ticket; }
  using ShadowMap = std::map<std::uint64_t, Shadow>;  // by start; disjoint
  // Splits the shadow so that [addr, end) starts and ends on range boundaries.
  static void split_at(ShadowMap& shadow, std::uint64_t addr);
  void access(ShadowMap& shadow, const Side& side, const Clock& clock, std::uint64_t addr, std::uint64_t bytes);
  // Counts and keeps the race of `later` with `earlier` over [addr, addr + bytes),
  // merged with one already kept for the same two ops.
  void report(const Side& earlier, const Side& later, std::uint64_t addr, std::uint64_t bytes);
  // The blocks_ entry of the allocation that holds `addr` now, or kNoBlock.
  std::uint32_t block_at(std::uint64_t addr) const;

  std::size_t keep_;
  std::array<std::vector<Segment>, kMaxStreams> segments_;
  Clock host_{};
  ShadowMap shadow_;       // device bytes
  ShadowMap host_shadow_;  // host bytes copies read or write
  // Every allocation the pool named, in order; an index never changes, so a side
  // keeps naming the allocation it touched after the bytes are handed out again.
  std::vector<RaceBlock> blocks_;
  struct Owner {
    std::uint64_t end = 0;
    std::uint32_t block = kNoBlock;
  };
  std::map<std::uint64_t, Owner> owners_;  // by start; disjoint: the allocation holding each range now
  std::shared_ptr<RaceLog> log_;
};

}  // namespace ferry::sim
