// ferry — integrity policies for host->device transfers, and what they counted
// (docs/spec.md I5, report 000).
//
//   off     copies are trusted. A silent no-op copy goes unnoticed; use it only to
//           measure what the guard costs, or to show that a fault bites.
//   probe   a canary copy out of the same pinned unit (arena chunk or registered
//           piece) runs behind the data on the same stream: on a unit's first use
//           and then every N transfers or B bytes out of it. A failed canary
//           retires the unit and redoes that transfer's copies out of it through
//           another path, and from then on every transfer is canaried (once
//           copies go missing in a process they keep going missing). Copies of
//           earlier transfers, between the last good canary and the first
//           failure, are not redone: probe bounds the damage, verify prevents it.
//   verify  the device hashes every destination range behind its copy (HashOp,
//           content_hash) and the engine compares it with the source's hash; a
//           mismatch is retried through another path, and a range that never
//           verifies is returned as transfer_corrupt. Nothing unverified is ever
//           reported as success.
//
// The batched-copy start-up probe (a capability check) runs under every policy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/result.hpp"

namespace ferry FERRY_API {

enum class IntegrityPolicy : std::uint8_t { off, probe, verify };

// "off", "probe", "verify".
std::string_view to_string(IntegrityPolicy policy) noexcept;

// Parses "off" | "probe" | "verify" (exact, lower case).
// Errors: invalid_argument naming the text and the accepted names.
Result<IntegrityPolicy> parse_integrity_policy(std::string_view text);

// Counters of one TransferEngine since construction. A snapshot; every field is
// monotone except the two flags.
//
//   mismatches == ranges whose device hash differed (verify)
//               + ranges redone because their unit's canary failed (probe)
//   recovered + corrupt <= ranges that mismatched (a range counts once)
struct IntegrityCounters {
  std::uint64_t bytes_moved = 0;     // bytes copied (every attempt, every direction)
  std::uint64_t bytes_verified = 0;  // bytes whose device hash matched the source
  std::uint64_t mismatches = 0;      // ranges caught wrong (see above), every attempt
  std::uint64_t retries = 0;         // copies re-issued after a detected failure
  std::uint64_t fallbacks = 0;       // step-downs: batched->per-copy, retired unit->another
                                     // chunk, pinned->pageable
  std::uint64_t recovered = 0;       // ranges that failed, then verified through another path
  std::uint64_t corrupt = 0;         // ranges returned as transfer_corrupt
  std::uint64_t transfers = 0;       // upload/download/copy calls that enqueued work
  std::uint64_t ranges = 0;          // ranges those calls carried
  std::uint64_t batches = 0;         // BatchCopyToDeviceOp operations enqueued
  std::uint64_t per_copy = 0;        // single CopyToDeviceOp operations enqueued
  std::uint64_t staged = 0;          // copies staged through an arena block by the engine
  std::uint64_t pageable = 0;        // copies out of plain (unpinned) heap memory
  std::uint64_t canaries = 0;        // canary copies run (probe and diagnosis)
  std::uint64_t canary_failures = 0;
  std::uint64_t units_retired = 0;   // pinned units (chunks, registered pieces) retired
  bool batched_disabled = false;     // batching is off (start-up probe failed, a batch
                                     // mismatched, or the backend has none)
  bool pinned_distrusted = false;    // too many retired units: retries go pageable
  bool probe_escalated = false;      // a canary failed: probe now checks every transfer
};

}  // namespace ferry
