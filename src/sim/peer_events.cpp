// ferry — the simulated GPU's native streams and events (tokens), and the ops
// that reach another sim device of the process: a peer copy's source bytes and a
// wait for another device's event (sim_backend.hpp says when each is resolved).
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "sim/sim_backend.hpp"

namespace ferry::sim {

using text::hex;

Result<NativeStream> SimGpu::native_of(StreamId stream) {
  std::lock_guard lock(mutex_);
  return static_cast<NativeStream>(&streams_[stream]);
}

Result<void> SimGpu::bind_stream(StreamId stream, NativeStream native) {
  std::lock_guard lock(mutex_);
  const auto* p = static_cast<const std::byte*>(native);
  const auto* first = reinterpret_cast<const std::byte*>(streams_.data());
  if (p >= first && p < first + streams_.size() * sizeof(StreamState)) {
    return make_error(ErrorCode::invalid_argument, "adopt_stream(" + hex(native) +
                                                       "): that is one of the sim's own streams");
  }
  if (events_.contains(native)) {
    return make_error(ErrorCode::invalid_argument, "adopt_stream(" + hex(native) + "): that is an event");
  }
  (void)stream;  // the sim runs no program work: the token is only the stream's identity
  return {};
}

Result<void> SimGpu::unbind_stream(StreamId) { return {}; }

Result<NativeEvent> SimGpu::export_issued(StreamPoint point) {
  std::lock_guard lock(mutex_);
  auto holder = std::make_unique<StreamPoint>(point);
  const void* token = holder.get();
  events_.emplace(token, std::move(holder));
  return const_cast<void*>(token);
}

Result<SimGpu*> SimGpu::peer_of(StreamId stream, const NativeWaitOp& wait) const {
  const std::string where = "enqueue(native_wait) on stream " + std::to_string(stream) + ": event " + hex(wait.event);
  auto* peer = dynamic_cast<SimGpu*>(&wait.peer->innermost());
  if (peer == nullptr || peer == this) {
    return make_error(ErrorCode::invalid_argument, where + ": its peer is not another sim device");
  }
  std::lock_guard lock(peer->mutex_);
  if (!peer->events_.contains(wait.event)) {
    return make_error(ErrorCode::invalid_argument, where + " is not one the peer's export_event made, or it was released");
  }
  return peer;
}

Result<void> SimGpu::release_export(NativeEvent event) {
  std::lock_guard lock(mutex_);
  if (events_.erase(event) == 0) {
    return make_error(ErrorCode::invalid_argument, "release_event(" + hex(event) +
                                                       "): not an event export_event made, or released already");
  }
  return {};
}

Result<const SimGpu*> SimGpu::peer_sim(StreamId stream, const PeerCopyOp& op) const {
  const auto* peer = dynamic_cast<const SimGpu*>(&op.peer->innermost());
  if (peer == nullptr || peer == this) {
    return make_error(ErrorCode::invalid_argument, "enqueue(copy_peer) on stream " + std::to_string(stream) +
                                                       ": the peer is not another sim device");
  }
  return peer;
}

Result<std::vector<std::byte>> SimGpu::read_peer(StreamId stream, const PeerCopyOp& op) const {
  Result<const SimGpu*> peer = peer_sim(stream, op);
  if (!peer.ok()) return std::move(peer).error();
  std::vector<std::byte> out;
  try {
    out.resize(op.dst.bytes);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, "copy_peer into " + text::range(op.dst.addr, op.dst.bytes) +
                                                    ": no host memory to model the peer's bytes");
  }
  FERRY_TRY((*peer)->read_for_peer(op.src_addr, op.dst.bytes, out));
  return out;
}

Result<void> SimGpu::read_for_peer(std::uint64_t addr, std::uint64_t bytes, std::span<std::byte> out) const {
  std::lock_guard lock(memory_mu_);
  if (bytes == 0) return {};
  if (addr == 0 || addr > UINT64_MAX - bytes) {
    return make_error(ErrorCode::invalid_argument, "the peer's source " + text::range(addr, bytes) +
                                                       " starts at 0 or wraps around");
  }
  if (const auto hole = memory_.first_unmapped(addr, bytes)) {
    return make_error(ErrorCode::invalid_argument, "the peer's source " + text::range(addr, bytes) +
                                                       " is not mapped there (at " + hex(*hole) + ")");
  }
  if (!out.empty()) memory_.read(addr, out);
  return {};
}

Result<void> SimGpu::join_race_checker(Backend& first) {
  auto* other = dynamic_cast<SimGpu*>(&first.innermost());
  if (other == nullptr || other == this) return {};
  std::shared_ptr<RaceChecker> shared;
  {
    std::lock_guard lock(other->mutex_);
    shared = other->races_;
  }
  std::lock_guard lock(mutex_);
  if (!shared && !races_) return {};
  if (!shared || !races_) {
    return make_error(ErrorCode::invalid_argument, "join_race_checker: one device checks races and the other not");
  }
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    if (streams_[s].submitted > 0) {
      return make_error(ErrorCode::invalid_argument, "join_race_checker: stream " + std::to_string(s) +
                                                         " has work already; join before the first op");
    }
  }
  races_ = std::move(shared);
  race_device_ = races_->add_device();
  return {};
}

std::optional<RaceChecker::PeerSide> SimGpu::races_shared_with(Backend& peer, StreamPoint point) const {
  const auto* other = dynamic_cast<const SimGpu*>(&peer.innermost());
  if (!races_ || other == nullptr || other == this || other->races_ != races_) return std::nullopt;
  return RaceChecker::PeerSide{other->race_device_, point};
}

}  // namespace ferry::sim
