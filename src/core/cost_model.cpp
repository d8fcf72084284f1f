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

Engine engine_of(const Op& op) noexcept {
  return std::visit(Overloaded{
                        [](const CopyToDeviceOp&) { return Engine::copy_h2d; },
                        [](const BatchCopyToDeviceOp&) { return Engine::copy_h2d; },
                        [](const CopyToHostOp&) { return Engine::copy_d2h; },
                        [](const WaitOp&) { return Engine::none; },
                        [](const NativeWaitOp&) { return Engine::none; },
                        [](const NopOp&) { return Engine::none; },
                        [](const auto&) { return Engine::compute; },
                    },
                    op);
}

std::uint64_t modeled_ns(const Op& op, const DeviceProfile& profile, const PinnedQuery& pinned) {
  const double link = profile.link_latency_ns;
  const double kernel = profile.kernel_latency_ns;
  const double mem = profile.mem_bytes_per_s;
  const auto math_ns = [&](double flops) { return profile.flops_per_s > 0 ? flops / profile.flops_per_s * 1e9 : 0; };
  const auto host_link_ns = [&](const std::byte* ptr, std::uint64_t bytes) {
    const bool fast = bytes > 0 && pinned(ptr, bytes);
    return transfer_ns(bytes, fast ? profile.h2d_bytes_per_s : profile.pageable_bytes_per_s);
  };
  return to_ns(std::visit(
      Overloaded{
          [&](const FillOp& f) { return kernel + transfer_ns(f.dst.bytes, mem); },
          [&](const CopyToDeviceOp& c) { return link + host_link_ns(c.src, c.dst.bytes); },
          [&](const CopyToHostOp& c) { return link + host_link_ns(c.dst, c.src.bytes); },
          [&](const CopyOnDeviceOp& c) { return kernel + 2 * transfer_ns(c.dst.bytes, mem); },
          [&](const BatchCopyToDeviceOp& b) {  // one submission: one latency
            double ns = link;
            for (const CopyToDeviceOp& c : b.copies) ns += host_link_ns(c.src, c.dst.bytes);
            return ns;
          },
          [&](const ComputeOp& c) {
            if (c.flops == 0 && c.mem_bytes == 0) {
              std::uint64_t touched = c.output.bytes;
              for (const DeviceRange& in : c.inputs) touched = saturating_add(touched, in.bytes);
              return kernel + transfer_ns(touched, mem);
            }
            return kernel + std::max(math_ns(c.flops), transfer_ns(c.mem_bytes, mem));
          },
          [&](const UserOp& u) {  // like a compute kernel: one pass over its operands unless told
            if (u.flops == 0 && u.mem_bytes == 0) {
              std::uint64_t touched = 0;
              for (const UserOperand& o : u.operands) touched = saturating_add(touched, o.range.bytes);
              return kernel + transfer_ns(touched, mem);
            }
            return kernel + std::max(math_ns(u.flops), transfer_ns(u.mem_bytes, mem));
          },
          [&](const HashOp& h) { return kernel + transfer_ns(h.src.bytes, mem); },
          [](const WaitOp&) { return 0.0; },
          [](const NativeWaitOp&) { return 0.0; },
          [](const NopOp&) { return 0.0; },
      },
      op));
}

}  // namespace ferry
