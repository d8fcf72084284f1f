// Compiled, never run, by the ctest OpDescription.*: an Op alternative without its
// OpDescription (op_contract.hpp) must not compile. Built as is, every alternative
// is described (the control: the check itself compiles); with FERRY_UNDESCRIBED_OP
// the variant gains one that is not, and the operand walk must refuse it.
#include <cstdint>
#include <variant>

#include "ferry/op_contract.hpp"

namespace probe {

struct UndescribedOp {
  ferry::DeviceRange dst;
};

#ifdef FERRY_UNDESCRIBED_OP
using Ops = std::variant<ferry::FillOp, ferry::CopyToHostOp, UndescribedOp>;
#else
using Ops = std::variant<ferry::FillOp, ferry::CopyToHostOp>;
static_assert(ferry::kEveryOpDescribed<Ops>);
static_assert(!ferry::kEveryOpDescribed<std::variant<ferry::FillOp, UndescribedOp>>);
#endif

std::uint64_t device_bytes(const Ops& op) {
  std::uint64_t bytes = 0;
  ferry::for_each_device_range(op, [&](const ferry::DeviceOperand& d) { bytes += d.bytes; });
  return bytes;
}

}  // namespace probe
