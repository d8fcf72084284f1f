// TransferPlan: the list of host->device ranges one upload enqueues together.
// Nothing is checked here; begin_upload() checks every range before it
// enqueues any.
#include "ferry/transfer_engine.hpp"

namespace ferry {

TransferPlan& TransferPlan::add(const HostBlock& src, std::uint64_t src_offset, DeviceHandle dst,
                                std::uint64_t dst_offset, std::uint64_t bytes) {
  ranges_.push_back(TransferRange{src, src_offset, nullptr, dst, dst_offset, bytes});
  return *this;
}

TransferPlan& TransferPlan::add(const HostBlock& src, DeviceHandle dst, std::uint64_t dst_offset) {
  return add(src, 0, dst, dst_offset, src.bytes);
}

TransferPlan& TransferPlan::add(const std::byte* src, DeviceHandle dst, std::uint64_t dst_offset,
                                std::uint64_t bytes) {
  ranges_.push_back(TransferRange{HostBlock{}, 0, src, dst, dst_offset, bytes});
  return *this;
}

TransferPlan& TransferPlan::add(std::span<const std::byte> src, DeviceHandle dst,
                                std::uint64_t dst_offset) {
  return add(src.data(), dst, dst_offset, src.size());
}

std::uint64_t TransferPlan::bytes() const noexcept {
  std::uint64_t n = 0;
  for (const TransferRange& r : ranges_) n += r.bytes;
  return n;
}

}  // namespace ferry
