// The single-range copies that start on the device: download (device->host)
// and copy_on_device (device->device). Each try is one copy and, under verify,
// a hash of each side; one retry loop (retry_until_intact) repeats the try
// until the hashes match or the attempts run out, and keeps the counters and
// the receipt for both.
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "core/text.hpp"
#include "ferry/content.hpp"
#include "transfer/engine_state.hpp"

namespace ferry {
namespace detail {
namespace {

// One try of a copy checked by hashes.
struct HashedTry {
  StreamPoint done{};          // the try's last operation
  bool compared = false;       // false (off, probe): nothing was hashed, the copy stands
  std::uint64_t arrived = 0;   // the hash of the bytes that arrived
  std::uint64_t expected = 0;  // the hash of the source
};

// How the error names a copy that never arrived intact.
struct CopyNames {
  std::string copy;            // what was copied from where to where
  std::string_view path;       // listed once per attempt; "" lists nothing
  std::string_view arrived;    // "host hash", "destination hash"
  std::string_view expected;   // "device hash", "source hash"
};

// Runs try_once until the hashes it reports match, at most
// EngineOptions::max_attempts times, and returns the receipt of one range of
// `bytes`: done is the last try's, verified once they matched, recovered when
// that took more than one try. A try that compared nothing ends the loop with
// its receipt; a try's error ends it with that error; running out of attempts
// with transfer_corrupt naming the copy and the last two hashes.
Result<TransferReceipt> retry_until_intact(EngineState& e, std::uint64_t bytes,
                                           const CopyNames& names,
                                           const std::function<Result<HashedTry>()>& try_once) {
  TransferReceipt receipt;
  receipt.bytes = bytes;
  receipt.ranges = 1;
  HashedTry last;
  for (std::uint32_t attempt = 1; attempt <= e.opt.max_attempts; ++attempt) {
    auto t = try_once();
    if (!t.ok()) return std::move(t).error();
    receipt.done = t->done;
    if (!t->compared) return receipt;
    last = *t;
    if (last.arrived == last.expected) {
      receipt.verified = true;
      receipt.recovered = attempt > 1 ? 1 : 0;
      e.count([&](IntegrityCounters& k) {
        k.bytes_verified += bytes;
        if (attempt > 1) ++k.recovered;
      });
      return receipt;
    }
    e.count([&](IntegrityCounters& k) {
      ++k.mismatches;
      if (attempt < e.opt.max_attempts) ++k.retries;
    });
  }
  e.count([](IntegrityCounters& c) { ++c.corrupt; });
  std::string tried;
  for (std::uint32_t i = 0; !names.path.empty() && i < e.opt.max_attempts; ++i) {
    tried += (i == 0 ? " (" : ", ") + std::string(names.path);
  }
  if (!tried.empty()) tried += ")";
  return make_error(ErrorCode::transfer_corrupt,
                    names.copy + " never arrived intact after " + std::to_string(e.opt.max_attempts) +
                        " attempts" + tried + "; " + std::string(names.arrived) + " " +
                        text::hex16(last.arrived) + " != " + std::string(names.expected) + " " +
                        text::hex16(last.expected));
}

}  // namespace
}  // namespace detail

using detail::HashedTry;

Result<TransferReceipt> TransferEngine::download(StreamId stream, DeviceHandle src,
                                                 std::uint64_t src_offset,
                                                 std::span<std::byte> dst) {
  FERRY_TRY(state_->status);
  detail::EngineState& e = *state_;
  e.prune();
  const std::uint64_t bytes = dst.size();
  const std::string what = "download of " + std::to_string(bytes) + " bytes from " +
                           text::handle(src) + " offset " + std::to_string(src_offset);
  if (bytes == 0 || dst.data() == nullptr) {
    return make_error(ErrorCode::invalid_argument, what + ": empty destination");
  }
  FERRY_TRY(e.check_dst(what, src, src_offset, bytes, stream));
  const bool verify = options_.policy == IntegrityPolicy::verify;
  // Into an arena block the copy writes in place under a lease; anywhere else it
  // lands in an engine-owned bounce buffer first, so a wait that gives up never
  // leaves the device writing into memory the caller may free.
  const bool in_arena = arena_.locate(dst.data(), bytes).has_value();
  e.count([](IntegrityCounters& c) { ++c.transfers; ++c.ranges; });
  const detail::CopyNames names{
      what + " into host " + text::range(reinterpret_cast<std::uintptr_t>(dst.data()), bytes),
      "copy-to-host", "host hash", "device hash"};
  return detail::retry_until_intact(e, bytes, names, [&]() -> Result<HashedTry> {
    auto bounce = in_arena ? nullptr : std::make_shared<detail::Bytes>(bytes);
    std::byte* target = in_arena ? dst.data() : bounce->data();
    auto hash = std::make_shared<std::uint64_t>(0);
    std::optional<StreamPoint> hashed;
    if (verify) {
      auto h = e.submit(stream, [&](StreamPoint p) -> Result<Op> {
        auto r = e.lease_dst(src, src_offset, bytes, p);
        if (!r.ok()) return std::move(r).error();
        return Op{HashOp{*r, hash.get()}};
      });
      if (!h.ok()) return std::move(h).error();
      hashed = *h;
    }
    auto c = e.submit(stream, [&](StreamPoint p) -> Result<Op> {
      auto r = e.lease_dst(src, src_offset, bytes, p);
      if (!r.ok()) return std::move(r).error();
      if (in_arena) FERRY_TRY(arena_.lease_source(target, bytes, p));
      return Op{CopyToHostOp{target, *r}};
    });
    if (!c.ok()) {
      if (hashed) e.park(*hashed, hash);  // the device may still write the hash
      return std::move(c).error();
    }
    e.count([&](IntegrityCounters& k) { k.bytes_moved += bytes; });
    if (auto w = e.order.wait_for_result(*c); !w.ok()) {
      e.park(*c, bounce);
      e.park(*c, hash);
      return std::move(w).error();
    }
    if (!in_arena) std::memcpy(dst.data(), bounce->data(), bytes);
    if (!verify) return HashedTry{*c};
    return HashedTry{*c, true, content_hash(dst), *hash};
  });
}

Result<TransferReceipt> TransferEngine::copy_on_device(StreamId stream, DeviceHandle dst,
                                                       std::uint64_t dst_offset, DeviceHandle src,
                                                       std::uint64_t src_offset,
                                                       std::uint64_t bytes) {
  FERRY_TRY(state_->status);
  detail::EngineState& e = *state_;
  e.prune();
  const std::string what = "device copy of " + std::to_string(bytes) + " bytes from " +
                           text::handle(src) + " offset " + std::to_string(src_offset) + " to " +
                           text::handle(dst) + " offset " + std::to_string(dst_offset);
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, what + ": 0 bytes");
  FERRY_TRY(e.check_dst(what, src, src_offset, bytes, stream));
  FERRY_TRY(e.check_dst(what, dst, dst_offset, bytes, stream));
  const bool verify = options_.policy == IntegrityPolicy::verify;
  e.count([](IntegrityCounters& c) { ++c.transfers; ++c.ranges; });
  const detail::CopyNames names{what, "", "destination hash", "source hash"};
  return detail::retry_until_intact(e, bytes, names, [&]() -> Result<HashedTry> {
    auto c = e.submit(stream, [&](StreamPoint p) -> Result<Op> {
      auto d = e.lease_dst(dst, dst_offset, bytes, p);
      if (!d.ok()) return std::move(d).error();
      auto s = e.lease_dst(src, src_offset, bytes, p);
      if (!s.ok()) return std::move(s).error();
      return Op{CopyOnDeviceOp{*d, s->addr}};
    });
    if (!c.ok()) return std::move(c).error();
    e.count([&](IntegrityCounters& k) { k.bytes_moved += bytes; });
    if (!verify) return HashedTry{*c};  // asynchronous: the copy is only enqueued
    auto hashes = std::make_shared<std::array<std::uint64_t, 2>>();  // source, destination
    StreamPoint done = *c;
    for (int side = 0; side < 2; ++side) {
      auto h = e.submit(stream, [&](StreamPoint p) -> Result<Op> {
        auto r = side == 0 ? e.lease_dst(src, src_offset, bytes, p)
                           : e.lease_dst(dst, dst_offset, bytes, p);
        if (!r.ok()) return std::move(r).error();
        return Op{HashOp{*r, hashes->data() + side}};
      });
      if (!h.ok()) {
        e.park(done, hashes);
        return std::move(h).error();
      }
      done = *h;
    }
    if (auto w = e.order.wait(done); !w.ok()) {
      e.park(done, hashes);
      return std::move(w).error();
    }
    return HashedTry{done, true, (*hashes)[1], (*hashes)[0]};
  });
}

}  // namespace ferry
