// ferry — the CUDA backend's peers: the link to another device of the process, by
// what the runtime API says of the pair, and the access a peer copy needs, opened
// once per ordered pair (cuda_backend.hpp).
#include "cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "cuda/cuda_error.hpp"

namespace ferry::cuda_detail {
namespace {

std::string pair_text(int reader, int owner) {
  return "device " + std::to_string(reader) + " reading device " + std::to_string(owner);
}

// The link between devices `reader` and `owner`, by the one rule: linked when each
// may access the other's memory (cudaDeviceCanAccessPeer both ways; a copy_peer
// pulls in either direction); NVLink-class when the link carries native atomics
// (cudaDevP2PAttrNativeAtomicSupported, asked both ways), which NVLink and NVSwitch
// report and PCIe peer-to-peer does not; PCIe otherwise. The runtime API names no
// link kind (NVML does, and ferry does not depend on it), and
// cudaDevP2PAttrPerformanceRank is relative to this machine's pairs (0 for its best,
// all-PCIe machines included), so it cannot tell the kinds apart. Limits: a PCIe
// platform that reported native atomics would read as nvlink; the kind says which
// path, not how fast (nothing on cuda reads figures for it).
Result<PeerLink> driver_link(int reader, int owner) {
  int reads = 0, read_back = 0;
  const auto asked = [&](cudaError_t err, const std::string& what) -> Result<void> {
    if (err == cudaSuccess) return {};
    return cuda_error(err, what + " (" + pair_text(reader, owner) + ")");
  };
  FERRY_TRY(asked(cudaDeviceCanAccessPeer(&reads, reader, owner), "cudaDeviceCanAccessPeer"));
  FERRY_TRY(asked(cudaDeviceCanAccessPeer(&read_back, owner, reader), "cudaDeviceCanAccessPeer"));
  if (reads == 0 || read_back == 0) return PeerLink::none;
  int atomics = 0, atomics_back = 0;
  FERRY_TRY(asked(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, owner, reader),
                  "cudaDeviceGetP2PAttribute"));
  FERRY_TRY(asked(cudaDeviceGetP2PAttribute(&atomics_back, cudaDevP2PAttrNativeAtomicSupported, reader, owner),
                  "cudaDeviceGetP2PAttribute"));
  return atomics != 0 && atomics_back != 0 ? PeerLink::nvlink : PeerLink::pcie;
}

}  // namespace

Result<std::optional<PeerLink>> CudaBackend::connect_peer(Backend& peer) {
  auto* owner = dynamic_cast<CudaBackend*>(&peer.innermost());
  if (owner == nullptr || owner->device_ == device_) {
    return make_error(ErrorCode::invalid_argument, "connect_peer on CUDA device " + std::to_string(device_) +
                                                       ": the peer is not another CUDA device");
  }
  Result<PeerLink> link = driver_link(device_, owner->device_);
  if (!link.ok()) return std::move(link).error();
  if (*link == PeerLink::none) return std::optional<PeerLink>(PeerLink::none);
  {
    std::lock_guard lock(peers_mu_);  // opened once per ordered pair: a repeat finds it open
    if (peers_.contains(owner->device_)) return std::optional<PeerLink>(*link);
  }
  const DeviceScope bound = bind();
  // Peer access is the context's, and ferry's contexts are the primary ones the
  // whole process shares: another Runtime (or the program) may have opened it, so
  // it is never disabled here either.
  cudaError_t err = cudaDeviceEnablePeerAccess(owner->device_, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();  // an answer, not a fault: clear it before it resurfaces
    err = cudaSuccess;
  }
  if (err == cudaErrorTooManyPeers) {
    // The hardware's limit on peers of one device: this pair's copies go through the host.
    (void)cudaGetLastError();
    return std::optional<PeerLink>(PeerLink::none);
  }
  FERRY_TRY(check(err, "cudaDeviceEnablePeerAccess (" + pair_text(device_, owner->device_) + ")"));
  // The owner's VMM granules are readable here only once it names this device in
  // cuMemSetAccess: those mapped now and every later one (address_space.hpp).
  Result<void> granted = [&] {
    const DeviceScope on_owner = owner->bind();
    return owner->space_.grant_peer(device_);
  }();
  FERRY_TRY(std::move(granted));
  std::lock_guard lock(peers_mu_);
  peers_.insert(owner->device_);
  return std::optional<PeerLink>(*link);
}

Result<void> CudaBackend::check_peer_source(const PeerCopyOp& op) const {
  const auto* owner = dynamic_cast<const CudaBackend*>(&op.peer->innermost());
  if (owner == nullptr || owner == this) {
    return make_error(ErrorCode::invalid_argument, "the peer is not another CUDA device");
  }
  {
    std::lock_guard lock(peers_mu_);
    if (!peers_.contains(owner->device_)) {
      return make_error(ErrorCode::unsupported,
                        pair_text(device_, owner->device_) + ": no peer access was opened (Backend::connect_peer)");
    }
  }
  return owner->space_.check_mapped(op.src_addr, op.dst.bytes, "peer src");
}

}  // namespace ferry::cuda_detail
