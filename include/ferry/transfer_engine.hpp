// ferry — the transfer engine: every host<->device copy, batched where the
// backend allows, under an integrity policy, with fallback paths (docs/spec.md I5).
//
// Report 000: copies out of freshly pinned memory returned success and changed
// nothing; the batched path had a start-up probe, the plain path had no guard.
// Here every host->device path — batched, per-copy, staged, pageable, and every
// later user (prefetch, the offload cache) — goes through upload(), so none
// escapes the policy (integrity.hpp).
//
// Paths, best first:
//   batched    one BatchCopyToDeviceOp for a whole plan: only when the backend
//              has a native batched copy (DeviceInfo::batched_copy) and the
//              start-up probe passed
//   per-copy   one CopyToDeviceOp per range, straight out of the source
//   staged     the source bytes copied into a fresh arena block of a usable
//              chunk (a retired chunk takes no blocks), then per-copy
//   pageable   the source bytes copied into plain heap memory, no pinned memory
//              at all; the last resort
// Sources: an arena block (HostBlock) or a host pointer. A host pointer inside a
// live arena block or a registered region is read in place; any other host
// memory is staged, so upload() never keeps the caller's pointer past its return.
//
// Start-up probe (a capability check; every policy): copies a canary batch twice
// from an arena block into device scratch from the pool and reads it back; if
// either pass comes back wrong (some drivers honour only the first batch),
// batching is disabled and counters().batched_disabled says so.
//
// On a detected failure (a hash mismatch under verify, a failed canary under
// probe) the engine diagnoses the pinned unit with a canary: a failing unit is
// retired and its ranges are staged through another chunk; a healthy unit under
// a batch disables batching and the ranges go per-copy; otherwise, and after too
// many retired units (EngineOptions::distrust_pinned_after), pageable. A range is
// tried at most EngineOptions::max_attempts times, then the call returns
// transfer_corrupt naming it (range index, device handle, offset, bytes, host
// range, the hashes and the paths tried).
//
// Leases: every enqueue goes through StreamOrder::submit; its prepare callback
// leases the device destination (DevicePool::lease) and the host source
// (HostArena::lease_source) for the ticket the copy gets, so neither is reused
// while the copy may still touch it (I2, I6). Under verify each range's hash
// leases both again for its own ticket on its verify stream.
//
// Verify streams: under verify the device hashes do not run on the upload
// stream (where the next upload would wait for them, and for whatever kernel
// holds the engine a hash runs on) but on a verify stream, each behind an event
// wait (WaitOp) for its copy. Uploads on stream s hash on verify stream
// verify_stream - s % verify_streams (EngineOptions; by default uploads on
// streams 0, 1, 2, 3 hash on 63, 62, 61, 60, stream 4 on 63 again, and so on),
// so transfers on different upload streams do not queue behind each other's
// hashes (a stream is a FIFO: one shared verify stream would make an upload wait
// for every copy another stream queued before it). Those streams are the engine's: a
// program that enqueues its own work there only couples its timing to the
// hashes (never its correctness). An upload whose stream is its own verify
// stream hashes in line. Waiting for a transfer's hashes dispatches the held
// copies (StreamOrder holds) that event waits ahead of them on their verify
// stream name, since the hashes could never run otherwise.
//
// Thread safety: every method may be called from any thread; transfers on
// different streams proceed concurrently. The engine's mutex guards counters and
// caches only and is never held while waiting or enqueueing. Blocking: see each
// method; every wait is bounded by the StreamOrder's timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/integrity.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

// Opaque: the engine's shared state and one upload in flight, defined in the
// implementation.
namespace detail {
struct EngineState;
struct UploadState;
}  // namespace detail

// One host->device range. The source is `block` (+ block_offset) when block is
// non-null, else `host`.
struct TransferRange {
  HostBlock block{};
  std::uint64_t block_offset = 0;
  const std::byte* host = nullptr;
  DeviceHandle dst{};
  std::uint64_t dst_offset = 0;
  std::uint64_t bytes = 0;
};

// A copy plan: many ranges, enqueued together (one batch when batching is on).
class TransferPlan {
 public:
  TransferPlan& add(const HostBlock& src, std::uint64_t src_offset, DeviceHandle dst,
                    std::uint64_t dst_offset, std::uint64_t bytes);
  // The whole block to dst at dst_offset.
  TransferPlan& add(const HostBlock& src, DeviceHandle dst, std::uint64_t dst_offset = 0);
  TransferPlan& add(const std::byte* src, DeviceHandle dst, std::uint64_t dst_offset,
                    std::uint64_t bytes);
  TransferPlan& add(std::span<const std::byte> src, DeviceHandle dst, std::uint64_t dst_offset = 0);

  std::span<const TransferRange> ranges() const noexcept { return ranges_; }
  std::size_t size() const noexcept { return ranges_.size(); }
  bool empty() const noexcept { return ranges_.empty(); }
  std::uint64_t bytes() const noexcept;
  void clear() noexcept { ranges_.clear(); }

 private:
  std::vector<TransferRange> ranges_;
};

struct EngineOptions {
  IntegrityPolicy policy = IntegrityPolicy::verify;
  // Attempts per range (the first copy included) before transfer_corrupt; >= 1.
  std::uint32_t max_attempts = 4;
  // probe: canary a unit on first use, then every this many transfers or bytes
  // out of it.
  std::uint32_t probe_every_transfers = 16;
  std::uint64_t probe_every_bytes = std::uint64_t{256} << 20;
  // After this many retired units, retries skip pinned memory and go pageable
  // (stops the retire->re-pin churn that report 000 says makes things worse).
  std::uint32_t distrust_pinned_after = 4;
  // Use the backend's batched copy when it has one and the probe passes.
  bool allow_batching = true;
  // The stream the constructor's start-up probe runs on.
  StreamId probe_stream = 0;
  // verify: the streams the device hashes run on, verify_stream down to
  // verify_stream - verify_streams + 1 (see "Verify streams" above). They must
  // lie in 0..kMaxStreams-1, else status() is invalid_argument; 0 counts as 1.
  // Pick streams the program does not use for its own work.
  StreamId verify_stream = kMaxStreams - 1;
  std::uint32_t verify_streams = 4;
};

// What a finished transfer did.
struct TransferReceipt {
  // A point after which every operation of the transfer (copies, hashes) has
  // completed. off/probe: the last copy, on the upload stream. verify: the last
  // hash, on a verify stream (its event waits for the copies make it imply
  // them), already complete when the receipt is returned; so done.stream may
  // differ from the upload stream — order other work after it with a WaitOp
  // unless StreamOrder::is_complete(done).
  StreamPoint done{};
  std::uint64_t bytes = 0;      // bytes the caller asked for
  std::uint32_t ranges = 0;
  bool batched = false;         // the first attempt went as one batch
  bool verified = false;        // every range's device hash matched (verify)
  std::uint32_t recovered = 0;  // ranges that needed another path
};

// The start-up probe's outcome.
struct BatchProbeReport {
  bool ran = false;       // false: backend has no batched copy, or batching not allowed
  bool passed = false;
  std::string detail;     // one line: what was checked and what came back
};

class TransferEngine;

// An upload enqueued by begin_upload() and not yet checked. Move-only. Dropping
// it without finish() is safe (the engine keeps what the device still writes
// alive) but the transfer then counts as unverified and no retry happens.
class PendingUpload {
 public:
  PendingUpload() noexcept;
  PendingUpload(PendingUpload&&) noexcept;
  PendingUpload& operator=(PendingUpload&&) noexcept;
  ~PendingUpload();
  // The point after which the transfer's device work is complete (as
  // TransferReceipt::done: under verify a point on a verify stream).
  StreamPoint point() const noexcept;
  bool valid() const noexcept { return state_ != nullptr; }

 private:
  friend class TransferEngine;
  TransferEngine* engine_ = nullptr;
  std::unique_ptr<detail::UploadState> state_;
};

class TransferEngine {
 public:
  // `pool` and `arena` must share one StreamOrder and outlive the engine. Runs the
  // start-up probe on options.probe_stream (blocks, bounded). A probe that cannot
  // run (no pinned memory, no device memory) disables batching and is not an
  // error; status() reports a pool/arena mismatch or a bad option.
  TransferEngine(DevicePool& pool, HostArena& arena, EngineOptions options = {});
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  const Result<void>& status() const noexcept;

  // Host->device copies of every range of `plan` on `stream`.
  //   off, probe: returns once the copies are enqueued (and, under probe, once any
  //     due canary came back); the device work completes later, at receipt.done.
  //     Arena blocks named by the plan may be freed right away (they stay leased).
  //   verify: returns only after every range's device hash matched — verify makes
  //     an upload synchronous with its own completion (bounded waits). The
  //     hashes run on a verify stream, so the upload stream is free for the
  //     next copy while they run.
  // Errors: invalid_argument (empty range, range outside its block or device
  // allocation, null source, overflow), stale_handle (a freed block or handle),
  // transfer_corrupt (a range never verified; the message names it),
  // out_of_memory (staging could not get memory), timeout, backend_error.
  // On error, ranges may have been partly written.
  Result<TransferReceipt> upload(StreamId stream, const TransferPlan& plan);

  // The asynchronous form: enqueues the copies (and, under verify, the hashes)
  // and returns. finish() waits, compares, retries and returns what upload()
  // would have. Under off/probe finish() only reports. Arena blocks and
  // registered ranges named by the plan must stay live and unchanged until
  // finish() (retries re-read them); other host memory is staged by
  // begin_upload() and may be reused at once. A PendingUpload must not outlive
  // the engine or the arena. Errors of begin_upload as for upload() (under probe
  // transfer_corrupt too: its canaries run inside begin_upload).
  Result<PendingUpload> begin_upload(StreamId stream, const TransferPlan& plan);
  Result<TransferReceipt> finish(PendingUpload&& pending);

  // Device->host: copies [src_offset, src_offset + dst.size()) of `src` into dst
  // and waits for it (dst is the caller's memory). Under verify the device hashes
  // the source first and the host bytes are compared; a mismatch is retried.
  // Errors: invalid_argument, stale_handle, transfer_corrupt, timeout,
  // backend_error. Blocks (bounded).
  Result<TransferReceipt> download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                   std::span<std::byte> dst);

  // Device->device, same length. off/probe: asynchronous (enqueue only). verify:
  // hashes both sides and waits; a mismatch is retried. Errors as for download().
  Result<TransferReceipt> copy_on_device(StreamId stream, DeviceHandle dst,
                                         std::uint64_t dst_offset, DeviceHandle src,
                                         std::uint64_t src_offset, std::uint64_t bytes);

  // Registers an immutable host range in place (HostArena::register_host) and
  // hashes it once, so verify never re-hashes it; sub-ranges uploaded later are
  // hashed on first use and cached by (ptr, bytes). The caller must not change
  // the bytes until unregister(). Errors: those of register_host. Never blocks on
  // the device (hashing costs host time).
  Result<RegionId> register_immutable(std::byte* ptr, std::uint64_t bytes);
  // As register_immutable, for a range whose bytes are written in parts, each
  // just before the uploads that read it (a lazily generated weight bank):
  // nothing is hashed now; each sub-range is hashed on its first upload and
  // cached by (ptr, bytes), so the caller must have written its bytes before
  // that upload, must write the same bytes every time it writes them, and must
  // keep them until every transfer reading them completed.
  // Errors: those of register_host. Never blocks on the device.
  Result<RegionId> register_generated(std::byte* ptr, std::uint64_t bytes);
  // Precomputes and caches the hash of a sub-range of an immutable region (e.g.
  // one expert of a bank). Errors: invalid_argument (not inside one; a
  // register_generated region is not immutable: its bytes come and go).
  Result<void> precompute_hash(const std::byte* ptr, std::uint64_t bytes);
  // Forgets the cached hashes and unregisters (blocks until no copy reads it).
  Result<void> unregister(RegionId region);

  IntegrityCounters counters() const;
  IntegrityPolicy policy() const noexcept { return options_.policy; }
  const EngineOptions& options() const noexcept { return options_; }
  bool batching_enabled() const noexcept;
  // Why batching is off ("" while on).
  std::string batching_disabled_reason() const;
  BatchProbeReport startup_probe() const;

  DevicePool& pool() noexcept { return pool_; }
  HostArena& arena() noexcept { return arena_; }

 private:
  DevicePool& pool_;
  HostArena& arena_;
  EngineOptions options_;
  std::unique_ptr<detail::EngineState> state_;
};

}  // namespace ferry
