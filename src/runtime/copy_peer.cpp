// Runtime::copy_peer: a copy between the blocks of two devices (devices.hpp).
#include <string>

#include "core/text.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry {
namespace {

std::string range_of(const char* what, DeviceHandle h, std::uint64_t offset, std::uint64_t bytes) {
  return std::string(what) + " " + text::handle(h) + " bytes [" + std::to_string(offset) + ", +" +
         std::to_string(bytes) + ")";
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
    Result<TransferReceipt> r = target.engine().copy_on_device(stream, dst, dst_offset, src, src_offset, bytes);
    if (!r.ok()) return std::move(r).error();
    out.direct = true, out.verified = r->verified, out.recovered = r->recovered, out.done = r->done;
    return out;
  }
  // Staged in the destination's arena: its upload leg then reads pinned memory
  // that device's integrity probe and retries already know.
  Result<HostBlock> staged = target.arena().allocate(bytes);
  if (!staged.ok()) return std::move(staged).error();
  const HostBlock staging = *staged;
  Result<TransferReceipt> down = source.engine().download(stream, src, src_offset, staging.span());
  if (!down.ok()) {
    (void)target.arena().free(staging);
    Error e = std::move(down).error();
    e.message = "copy_peer: device " + std::to_string(from) + " to host: " + e.message;
    return e;
  }
  Result<TransferReceipt> up = target.engine().upload(stream, TransferPlan().add(staging, 0, dst, dst_offset, bytes));
  // Legal with the upload in flight: the block stays leased until it completed (I6).
  (void)target.arena().free(staging);
  if (!up.ok()) {
    Error e = std::move(up).error();
    e.message = "copy_peer: host to device " + std::to_string(to) + ": " + e.message;
    return e;
  }
  out.verified = down->verified && up->verified;
  out.recovered = down->recovered + up->recovered;
  out.done = up->done;
  return out;
}

}  // namespace ferry
