// Runtime::copy_peer: a copy between the blocks of two devices (devices.hpp):
// direct over the pair's link when it has one, through the destination's pinned
// arena when it has none (or the direct copy arrived wrong, I5).
#include <array>
#include <memory>
#include <string>
#include <utility>

#include "core/text.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_kernel.hpp"
#include "runtime/graph_capture.hpp"

namespace ferry {
namespace {

std::string range_of(const char* what, DeviceHandle h, std::uint64_t offset, std::uint64_t bytes) {
  return std::string(what) + " " + text::handle(h) + " bytes [" + std::to_string(offset) + ", +" +
         std::to_string(bytes) + ")";
}

// What one direct copy did: under verify and probe the hash of what arrived on
// the destination's device and of the source on its own.
struct DirectTry {
  StreamPoint done{};
  bool compared = false;
  std::uint64_t arrived = 0, expected = 0;
};

struct PeerSides {
  RuntimeDevice& source;
  RuntimeDevice& target;
  DeviceHandle dst, src;
  std::uint64_t dst_offset, src_offset, bytes;
  StreamId stream;
};

// Hashes [offset, +bytes) of `h` on `dev`'s `stream` into *out, behind the
// stream's earlier work, and returns the hash's point.
Result<StreamPoint> submit_hash(RuntimeDevice& dev, StreamId stream, DeviceHandle h, std::uint64_t offset,
                                std::uint64_t bytes, std::uint64_t* out) {
  FERRY_TRY(dev.pool().make_ready(h, stream));
  Result<Ticket> t = dev.order().submit(stream, [&](Ticket ticket) -> Result<Op> {
    Result<DeviceSpan> span = dev.pool().lease(h, StreamPoint{stream, ticket});
    if (!span.ok()) return std::move(span).error();
    return Op{HashOp{DeviceRange{span->addr + offset, bytes}, out}};
  });
  if (!t.ok()) return std::move(t).error();
  return StreamPoint{stream, *t};
}

// Orders `stream` of `dev` after the last uses of `h` on every stream of `dev`
// (DevicePool::last_uses), held work among them dispatched: the host waits for
// what follows.
Result<void> order_after_uses(RuntimeDevice& dev, StreamId stream, DeviceHandle h) {
  Result<UseSet> uses = dev.pool().last_uses(h);
  if (!uses.ok()) return std::move(uses).error();
  for (const StreamPoint& p : uses->points()) {
    FERRY_TRY(dev.order().order_after(stream, p, StreamOrder::HeldWork::dispatch));
  }
  return {};
}

// The stream of the source's device that its hash runs on: the first of its
// engine's verify streams with nothing queued that has not completed, so the
// hash waits for the block's own uses alone (not for `stream`'s prefetches, say);
// when every one is busy, the one `stream`'s uploads hash on.
StreamId source_hash_stream(RuntimeDevice& dev, StreamId stream) {
  const EngineOptions& o = dev.engine().options();
  for (std::uint32_t i = 0; i < o.verify_streams; ++i) {
    const StreamId v = o.verify_stream - i;
    if (!dev.backend().held(v) && dev.order().is_complete(StreamPoint{v, dev.backend().submitted(v)})) return v;
  }
  return o.verify_stream - stream % o.verify_streams;
}

// The destination's device pulls the bytes over `link` (PeerCopyOp, leasing
// its block), its stream ordered after the source block's last uses on every
// stream of its device (DevicePool::last_uses: each write enqueued before this
// call, I3) by waits across devices, not after the tail of the source's
// `stream`, whose later work (prefetches) the pull does not read; hashed, the
// source's hash follows those uses and the pull follows the hash. Then the
// source's `stream` waits for the pull, a wait that leases the source (I2
// across devices: a free of it while the pull is queued keeps its memory until
// the pull completed, and later work on that stream, a reuse of the block
// included, follows the pull). Unhashed it blocks on nothing; hashed, it
// returns once both hashes completed.
template <class WaitAcross>
Result<DirectTry> direct_copy(const PeerSides& s, PeerLink link, bool hashed, WaitAcross&& wait_across) {
  auto hashes = std::make_shared<std::array<std::uint64_t, 2>>();  // source, destination
  DirectTry out;
  // On an error after a hash or the pull was enqueued the devices may still
  // write *hashes or read the source: drain them first.
  const auto drained = [&](Error e) -> Result<DirectTry> {
    (void)s.source.backend().synchronize();
    (void)s.target.backend().synchronize();
    return e;
  };
  FERRY_TRY(s.source.pool().make_ready(s.src, s.stream));
  Result<UseSet> uses = s.source.pool().last_uses(s.src);
  if (!uses.ok()) return std::move(uses).error();
  StreamPoint source_ready{};
  if (hashed) {
    const StreamId on = source_hash_stream(s.source, s.stream);
    if (Result<void> w = order_after_uses(s.source, on, s.src); !w.ok()) return drained(std::move(w).error());
    Result<StreamPoint> h = submit_hash(s.source, on, s.src, s.src_offset, s.bytes, hashes->data());
    if (!h.ok()) return drained(std::move(h).error());
    uses->clear();
    uses->add(source_ready = *h);
  }
  for (const StreamPoint& p : uses->points()) {
    if (Result<Ticket> w = wait_across(s.target, s.stream, s.source, p, nullptr); !w.ok()) {
      return drained(std::move(w).error());
    }
  }
  if (Result<void> r = s.target.pool().make_ready(s.dst, s.stream); !r.ok()) return drained(std::move(r).error());
  Result<Ticket> c = s.target.order().submit(s.stream, [&](Ticket ticket) -> Result<Op> {
    Result<DeviceSpan> from = s.source.pool().resolve(s.src);  // leased by the wait below
    if (!from.ok()) return std::move(from).error();
    Result<DeviceSpan> to = s.target.pool().lease(s.dst, StreamPoint{s.stream, ticket});
    if (!to.ok()) return std::move(to).error();
    return Op{PeerCopyOp{DeviceRange{to->addr + s.dst_offset, s.bytes}, &s.source.backend(),
                         from->addr + s.src_offset, link}};
  });
  if (!c.ok()) return drained(std::move(c).error());
  out.done = StreamPoint{s.stream, *c};
  if (Result<Ticket> w = wait_across(s.source, s.stream, s.target, out.done, &s.src); !w.ok()) {
    return drained(std::move(w).error());
  }
  if (!hashed) return out;
  Result<StreamPoint> h = submit_hash(s.target, s.stream, s.dst, s.dst_offset, s.bytes, hashes->data() + 1);
  if (!h.ok()) return drained(std::move(h).error());
  out.done = *h;
  // The host reads both hashes: the destination's, and the source's (done before the pull began).
  for (const auto& [dev, point] : {std::pair{&s.target, out.done}, std::pair{&s.source, source_ready}}) {
    if (Result<void> w = dev->order().wait_for_result(point); !w.ok()) return drained(std::move(w).error());
  }
  out.compared = true, out.expected = (*hashes)[0], out.arrived = (*hashes)[1];
  return out;
}

}  // namespace

Result<PeerCopyReceipt> Runtime::copy_peer(DeviceHandle dst, std::uint64_t dst_offset, DeviceHandle src,
                                           std::uint64_t src_offset, std::uint64_t bytes, StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::copy_peer"));
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, "copy_peer of 0 bytes (sizes must be > 0)");
  // Each handle's device is the one whose pool resolves it; resolve() leases
  // nothing, the legs below lease what they enqueue.
  const auto owner = [&](DeviceHandle h, std::uint64_t offset, const char* what) -> Result<std::uint32_t> {
    for (const auto& d : devices_) {
      Result<DeviceSpan> span = d->pool().resolve(h);
      if (!span.ok()) continue;
      if (offset > span->bytes || bytes > span->bytes - offset) {
        return make_error(ErrorCode::invalid_argument, "copy_peer: " + range_of(what, h, offset, bytes) +
                                                           " lies outside its " + std::to_string(span->bytes) +
                                                           "-byte block on device " + std::to_string(d->index()));
      }
      return d->index();
    }
    return make_error(ErrorCode::stale_handle, "copy_peer: " + range_of(what, h, offset, bytes) +
                                                   " is live in no pool of this runtime's " +
                                                   std::to_string(devices_.size()) + " device(s)");
  };
  Result<std::uint32_t> src_owner = owner(src, src_offset, "source");
  if (!src_owner.ok()) return std::move(src_owner).error();
  Result<std::uint32_t> dst_owner = owner(dst, dst_offset, "destination");
  if (!dst_owner.ok()) return std::move(dst_owner).error();
  const std::uint32_t from = *src_owner, to = *dst_owner;
  RuntimeDevice& source = *devices_[from];
  RuntimeDevice& target = *devices_[to];
  PeerCopyReceipt out;
  out.src_device = from, out.dst_device = to, out.bytes = bytes;
  if (from == to) {
    // Device 0's through calls(): a capture there records it, a recorder writes it.
    Result<TransferReceipt> r = to == 0 ? calls()->copy_on_device(stream, dst, dst_offset, src, src_offset, bytes)
                                        : target.engine().copy_on_device(stream, dst, dst_offset, src, src_offset, bytes);
    if (!r.ok()) return std::move(r).error();
    out.direct = true, out.verified = r->verified, out.recovered = r->recovered, out.done = r->done;
    return out;
  }
  if (from == 0 || to == 0) {
    FERRY_TRY(graph_capture()->refuse_on(stream, "copy_peer across devices",
                                         "it waits on the host for its source leg, which a replay cannot"));
  }
  out.link = link_between(from, to);
  // A held destination stream goes through the host: the source's wait for a
  // pull held there would dispatch it (export_event), breaking the hold.
  std::string direct_failed;
  if (out.link != PeerLink::none && !target.backend().held(stream) && target.backend().info().peer_copy) {
    const bool hashed = target.engine().policy() != IntegrityPolicy::off;
    Result<DirectTry> d = direct_copy(
        PeerSides{source, target, dst, src, dst_offset, src_offset, bytes, stream}, out.link, hashed,
        [this](RuntimeDevice& waits, StreamId on, RuntimeDevice& after, StreamPoint point, const DeviceHandle* lease) {
          return wait_across(waits, on, after, point, lease);
        });
    if (!d.ok()) {
      Error e = std::move(d).error();
      e.message = "copy_peer: device " + std::to_string(from) + " to device " + std::to_string(to) + " over " +
                  std::string(to_string(out.link)) + ": " + e.message;
      return e;
    }
    if (!d->compared || d->arrived == d->expected) {
      out.direct = true, out.verified = d->compared, out.done = d->done;
      return out;
    }
    // I5: a direct copy caught wrong is redone through another path.
    direct_failed = "the direct copy over " + std::string(to_string(out.link)) + " arrived with destination hash " +
                    text::hex16(d->arrived) + " != source hash " + text::hex16(d->expected) + "; ";
  }
  // I3: the download follows the source's writes on the device's other streams too.
  FERRY_TRY(order_after_uses(source, stream, src));
  // Staged in the destination's arena: its upload leg then reads pinned memory
  // that device's integrity probe and retries already know.
  Result<HostBlock> staged = target.arena().allocate(bytes);
  if (!staged.ok()) return std::move(staged).error();
  const HostBlock staging = *staged;
  Result<TransferReceipt> down = source.engine().download(stream, src, src_offset, staging.span());
  if (!down.ok()) {
    (void)target.arena().free(staging);
    Error e = std::move(down).error();
    e.message = "copy_peer: " + direct_failed + "device " + std::to_string(from) + " to host: " + e.message;
    return e;
  }
  Result<TransferReceipt> up = target.engine().upload(stream, TransferPlan().add(staging, 0, dst, dst_offset, bytes));
  // Legal with the upload in flight: the block stays leased until it completed (I6).
  (void)target.arena().free(staging);
  if (!up.ok()) {
    Error e = std::move(up).error();
    e.message = "copy_peer: " + direct_failed + "host to device " + std::to_string(to) + ": " + e.message;
    return e;
  }
  out.verified = down->verified && up->verified;
  out.recovered = down->recovered + up->recovered + (direct_failed.empty() ? 0 : 1);
  out.done = up->done;
  return out;
}

}  // namespace ferry
