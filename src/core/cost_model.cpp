#include "ferry/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include "ferry/op_contract.hpp"

namespace ferry {
namespace {

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

std::uint64_t to_ns(double ns) {
  if (!(ns > 0)) return 0;
  if (ns >= 1e18) return 1'000'000'000'000'000'000ull;
  return static_cast<std::uint64_t>(std::ceil(ns));
}

double transfer_ns(std::uint64_t bytes, double bytes_per_s) {
  return bytes_per_s > 0 ? static_cast<double>(bytes) / bytes_per_s * 1e9 : 0;
}

}  // namespace

double roofline_ns(double latency_ns, double flops, double flops_per_s, std::uint64_t bytes,
                   double bytes_per_s) noexcept {
  const double math = flops_per_s > 0 ? flops / flops_per_s * 1e9 : 0;
  return latency_ns + std::max(math, transfer_ns(bytes, bytes_per_s));
}

std::uint64_t modeled_ns(const Op& op, const DeviceProfile& profile, const PinnedQuery& pinned) {
  const double link = profile.link_latency_ns;
  const double kernel = profile.kernel_latency_ns;
  const double mem = profile.mem_bytes_per_s;
  const auto host_link_ns = [&](const std::byte* ptr, std::uint64_t bytes) {
    const bool fast = bytes > 0 && pinned(ptr, bytes);
    return transfer_ns(bytes, fast ? profile.h2d_bytes_per_s : profile.pageable_bytes_per_s);
  };
  switch (engine_of(op)) {
    case Engine::none:
      return 0;
    case Engine::copy_h2d:
    case Engine::copy_d2h: {  // one submission: one latency, however many ranges
      double ns = link;
      for_each_host_range(op, [&](const HostOperand& h) { ns += host_link_ns(h.ptr, h.bytes); });
      return to_ns(ns);
    }
    case Engine::copy_peer: {  // the pair's link: NVLink-class at the profile's peer figures, else PCIe
      const auto& peer = std::get<PeerCopyOp>(op);
      if (peer.link == PeerLink::nvlink) {
        return to_ns(profile.peer_latency_ns + transfer_ns(peer.dst.bytes, profile.peer_bytes_per_s));
      }
      return to_ns(link + transfer_ns(peer.dst.bytes, profile.h2d_bytes_per_s));
    }
    case Engine::compute:
      break;
  }
  // A kernel: its stated figures, else one pass over the device bytes it touches.
  const OpFigures figures = figures_of(op);
  if (figures.flops == 0 && figures.mem_bytes == 0) {
    std::uint64_t touched = 0;
    for_each_device_range(op, [&](const DeviceOperand& d) { touched = saturating_add(touched, d.bytes); });
    return to_ns(roofline_ns(kernel, 0, profile.flops_per_s, touched, mem));
  }
  return to_ns(roofline_ns(kernel, figures.flops, profile.flops_per_s, figures.mem_bytes, mem));
}

}  // namespace ferry
