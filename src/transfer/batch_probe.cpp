// The start-up probe of the batched copy (batch_probe.hpp): one probe run of
// two batched passes over a canary block, and the decision it feeds.
#include "transfer/batch_probe.hpp"

#include <cstring>
#include <memory>
#include <optional>
#include <string>

#include "ferry/content.hpp"
#include "transfer/diagnosis.hpp"

namespace ferry::detail {
namespace {

// A batch of kCopies canary copies of kPiece bytes each.
constexpr std::uint64_t kCopies = 4, kPiece = 256;

// The probe's host block and device scratch, given back on every exit.
struct ProbeBuffers {
  explicit ProbeBuffers(EngineState& engine) : e(engine) {}
  ProbeBuffers(const ProbeBuffers&) = delete;
  ProbeBuffers& operator=(const ProbeBuffers&) = delete;
  ~ProbeBuffers() {
    if (scratch) (void)e.pool.free(*scratch);  // stream-ordered: legal with work in flight
    if (block) (void)e.arena.free(block);
  }

  EngineState& e;
  HostBlock block{};
  std::optional<DeviceHandle> scratch;
};

// One pass: fills the block with pattern `seed` and the scratch with another,
// copies piece i of the block to piece kCopies-1-i of the scratch (reversed, so
// that a batch that ignores its offsets fails too) as one batch, reads the
// scratch back into *readback and counts the pieces that came back wrong.
// Blocks (bounded).
Result<std::uint64_t> wrong_pieces(EngineState& e, StreamId stream, const ProbeBuffers& b,
                                   std::uint64_t seed, const std::shared_ptr<Bytes>& readback) {
  fill_pattern(seed, 0, b.block.span());
  FERRY_TRY(enqueue_fill(e.pool, stream, *b.scratch, seed ^ 0xffffull));
  auto batch = e.submit(stream, [&](StreamPoint point) -> Result<Op> {
    BatchCopyToDeviceOp op;
    for (std::uint64_t i = 0; i < kCopies; ++i) {
      auto dst = e.lease_dst(*b.scratch, (kCopies - 1 - i) * kPiece, kPiece, point);
      if (!dst.ok()) return std::move(dst).error();
      FERRY_TRY(e.arena.lease_source(b.block.data + i * kPiece, kPiece, point));
      op.copies.push_back(CopyToDeviceOp{*dst, b.block.data + i * kPiece});
    }
    return Op{std::move(op)};
  });
  if (!batch.ok()) return std::move(batch).error();
  auto back = enqueue_copy_to_host(e.pool, stream, *b.scratch, *readback);
  if (!back.ok()) return std::move(back).error();
  if (auto w = e.order.wait({stream, *back}); !w.ok()) {
    e.park({stream, *back}, readback);
    return std::move(w).error();
  }
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < kCopies; ++i) {
    if (std::memcmp(readback->data() + (kCopies - 1 - i) * kPiece, b.block.data + i * kPiece,
                    kPiece) != 0) {
      ++wrong;
    }
  }
  return wrong;
}

// One probe run: two passes. Returns whether both arrived intact; *detail says
// what was checked and what came back. An error: the probe could not run, or
// the block's pinned chunk failed its own canary (it is retired; the caller
// runs the probe once more, on a fresh chunk).
Result<bool> probe_batched_copy(EngineState& e, StreamId stream, std::string* detail) {
  ProbeBuffers b(e);
  auto block = e.arena.allocate(kCopies * kPiece);
  if (!block.ok()) return std::move(block).error();
  b.block = *block;
  auto scratch = e.pool.allocate_internal(kCopies * kPiece, stream);
  if (!scratch.ok()) return std::move(scratch).error();
  b.scratch = *scratch;
  auto readback = std::make_shared<Bytes>(kCopies * kPiece);
  for (int pass = 0; pass < 2; ++pass) {
    auto wrong = wrong_pieces(e, stream, b, 0x5eed0000ull + static_cast<std::uint64_t>(pass), readback);
    if (!wrong.ok()) return std::move(wrong).error();
    if (*wrong == 0) continue;
    *detail = "pass " + std::to_string(pass + 1) + " of 2: " + std::to_string(*wrong) + " of " +
              std::to_string(kCopies) + " batched copies came back wrong";
    // Was it the batch or the pinned chunk (report 000)? A per-copy canary
    // of the same chunk tells them apart.
    auto c = canary(e, b.block.chunk, stream);
    if (c.ok() && !*c) {
      retire_unit(e, b.block.chunk, "start-up probe: canary came back wrong");
      *detail += "; the chunk's own canary failed too (pinned memory, not the batch)";
      return make_error(ErrorCode::backend_error, *detail);  // retried by the caller
    }
    return false;
  }
  *detail = "2 passes of " + std::to_string(kCopies) + " batched copies arrived intact";
  return true;
}

}  // namespace

void decide_batching(EngineState& e) {
  auto off = [&](std::string why, bool ran) {
    std::lock_guard lock(e.mu);
    e.batching = false;
    e.batch_reason = why;
    e.counters.batched_disabled = true;
    e.probe_report.ran = ran;
    e.probe_report.passed = false;
    e.probe_report.detail = std::move(why);
  };
  if (!e.opt.allow_batching) return off("batching disabled by EngineOptions::allow_batching", false);
  if (!e.order.backend().info().batched_copy) return off("the backend has no native batched copy", false);
  std::string detail;
  Result<bool> probe = probe_batched_copy(e, e.opt.probe_stream, &detail);
  if (!probe.ok()) probe = probe_batched_copy(e, e.opt.probe_stream, &detail);  // once more, on a fresh chunk
  if (!probe.ok()) {
    return off("the batched-copy start-up probe could not run: " + probe.error().message, false);
  }
  if (!*probe) return off("the batched-copy start-up probe failed: " + detail, true);
  std::lock_guard lock(e.mu);
  e.batching = true;
  e.probe_report = BatchProbeReport{true, true, detail};
}

}  // namespace ferry::detail
