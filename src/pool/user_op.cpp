#include "ferry/user_op.hpp"

#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"

namespace ferry {

Result<DeviceRange> operand_range(const DeviceSpan& span, std::uint64_t offset, std::uint64_t bytes,
                                  std::string_view what) {
  const std::uint64_t n = bytes == kRestOfBlock && offset <= span.bytes ? span.bytes - offset : bytes;
  if (offset > span.bytes || n > span.bytes - offset || n == 0) {
    return make_error(ErrorCode::invalid_argument,
                      std::string(what) + " asks for bytes [" + std::to_string(offset) + ", +" +
                          (bytes == kRestOfBlock ? std::string("rest") : std::to_string(bytes)) +
                          ") of a block of " + std::to_string(span.bytes) + " bytes" +
                          (n == 0 && offset <= span.bytes ? " (an empty range: an operand has at least 1 byte)"
                                                          : ""));
  }
  return DeviceRange{span.addr + offset, n};
}

Result<Ticket> enqueue_user(DevicePool& pool, StreamId stream, std::span<const Operand> operands,
                            UserKernel kernel, UserCost cost, std::string tag) {
  for (const Operand& o : operands) FERRY_TRY(pool.make_ready(o.handle, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    UserOp op;
    op.operands.reserve(operands.size());
    for (std::size_t i = 0; i < operands.size(); ++i) {
      const Operand& o = operands[i];
      Result<DeviceSpan> span = pool.lease(o.handle, {stream, t});
      if (!span.ok()) return std::move(span).error();
      Result<DeviceRange> range =
          operand_range(*span, o.offset, o.bytes,
                        "enqueue_user" + (tag.empty() ? std::string() : " '" + tag + "'") + ": operand " +
                            std::to_string(i));
      if (!range.ok()) return std::move(range).error();
      op.operands.push_back(UserOperand{*range, o.access});
    }
    op.kernel = std::move(kernel);
    op.flops = cost.flops;
    op.mem_bytes = cost.mem_bytes;
    op.tag = std::move(tag);
    return Op{std::move(op)};
  });
}

Result<Ticket> record_use(DevicePool& pool, StreamId stream, std::span<const DeviceHandle> handles) {
  // All or nothing: a stale handle leases none.
  for (DeviceHandle h : handles) FERRY_TRY(pool.resolve(h));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    for (DeviceHandle h : handles) {
      Result<DeviceSpan> span = pool.lease(h, {stream, t});
      if (!span.ok()) return std::move(span).error();
    }
    return Op{NopOp{}};
  });
}

}  // namespace ferry
