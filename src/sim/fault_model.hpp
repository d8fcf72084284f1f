// The sim backend's fault injection: every decision a SimFaults option makes,
// drawn from the seed alone.
//
// Draws are counter-based — draw(tag, index) depends only on (seed, tag, index) —
// so the fault of one pinned buffer or one operation never shifts because another
// fault model drew more or fewer numbers before it. No wall clock, no
// random_device: same seed, same faults.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ferry/content.hpp"
#include "ferry/sim_backend.hpp"
#include "ferry/stream.hpp"
#include "sim/pinned_host_memory.hpp"

namespace ferry::sim {

class FaultModel {
 public:
  // Mean virtual time from pinning to going stale with no churn. Report 000 saw a
  // 5 ms sleep turn 1 failure in 20 into 19; a few hundred microseconds puts the
  // sim's typical copy-after-pin delays on both sides of the edge.
  static constexpr double kStaleMeanNs = 400'000;
  // Pin/unpin calls that halve that mean (report 000: heavy churn makes it worse).
  static constexpr double kChurnScale = 8;

  FaultModel(std::uint64_t seed, const SimFaults& faults)
      : key_(splitmix64(seed ^ 0x243f6a8885a308d3ull)), faults_(faults) {}

  const SimFaults& faults() const noexcept { return faults_; }

  // pinned-noop: when a range pinned at now_ns, the pin_index-th pin after
  // `churn` pin/unpin calls, goes stale; kNever when it is spared. The delay is
  // exponential with mean kStaleMeanNs / (1 + churn / kChurnScale), so a copy
  // long after pinning, or after heavy churn, is the likely victim.
  std::uint64_t pinned_stale_at(std::uint64_t now_ns, std::uint64_t churn,
                                std::uint64_t pin_index) const {
    const double p = faults_.pinned_noop;
    if (!(p > 0)) return kNever;  // also NaN
    if (unit(kTagStaleChoice, pin_index) >= p) return kNever;
    const double mean = kStaleMeanNs / (1.0 + static_cast<double>(churn) / kChurnScale);
    const double delay = -mean * std::log1p(-unit(kTagStaleDelay, pin_index));
    const auto d = static_cast<std::uint64_t>(std::min(delay, 1e15));
    return now_ns + std::min(d, kNever - 1 - now_ns);
  }

  // Extra virtual time before an operation's completion, in [0, max_completion_delay_ns].
  std::uint64_t completion_delay(StreamId stream, Ticket ticket) const {
    const std::uint64_t max = faults_.max_completion_delay_ns;
    if (max == 0) return 0;
    const std::uint64_t bits = draw(kTagDelay, (std::uint64_t{stream} << 48) ^ ticket);
    return max == UINT64_MAX ? bits : bits % (max + 1);
  }

  // peer-noop: whether the peer copy at (stream, ticket) is swallowed.
  bool swallows_peer_copy(StreamId stream, Ticket ticket) const {
    const double p = faults_.peer_noop;
    if (!(p > 0)) return false;  // also NaN
    return unit(kTagPeerNoop, (std::uint64_t{stream} << 48) ^ ticket) < p;
  }

  // map() call number `call` (1-based) is the injected failure.
  bool fails_map_call(std::uint64_t call) const noexcept {
    return faults_.fail_map_call != 0 && call == faults_.fail_map_call;
  }

 private:
  static constexpr std::uint64_t kTagStaleChoice = 1;
  static constexpr std::uint64_t kTagStaleDelay = 2;
  static constexpr std::uint64_t kTagDelay = 3;
  static constexpr std::uint64_t kTagPeerNoop = 4;

  std::uint64_t draw(std::uint64_t tag, std::uint64_t index) const noexcept {
    return splitmix64(key_ ^ splitmix64(tag ^ splitmix64(index)));
  }
  // Uniform in [0, 1).
  double unit(std::uint64_t tag, std::uint64_t index) const noexcept {
    return static_cast<double>(draw(tag, index) >> 11) * 0x1.0p-53;
  }

  std::uint64_t key_;
  SimFaults faults_;
};

}  // namespace ferry::sim
