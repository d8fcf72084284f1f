#include "ferry/op_contract.hpp"

#include <array>
#include <cmath>
#include <iterator>
#include <string>
#include <utility>

#include "core/text.hpp"

namespace ferry {
namespace {

constexpr std::array<std::string_view, 11> kOpNames{"fill", "copy_to_device", "copy_to_host", "copy_on_device",
                                                    "batch_copy_to_device", "compute", "hash", "wait",
                                                    "native_wait", "user", "nop"};
static_assert(std::variant_size_v<Op> == kOpNames.size());

bool device_range_ok(std::uint64_t addr, std::uint64_t bytes) {
  return bytes == 0 || (addr != 0 && addr <= UINT64_MAX - bytes);
}

bool host_range_ok(const void* ptr, std::uint64_t bytes) {
  return bytes == 0 || (ptr != nullptr && reinterpret_cast<std::uintptr_t>(ptr) <= UINTPTR_MAX - bytes);
}

bool ranges_overlap(const DeviceRange& x, const DeviceRange& y) {
  return x.bytes > 0 && y.bytes > 0 && x.addr < y.addr + y.bytes && y.addr < x.addr + x.bytes;
}

}  // namespace

std::string_view op_name(const Op& op) noexcept { return kOpNames[op.index()]; }

Result<void> check_op(StreamId stream, const Op& op, const DeviceInfo& info,
                      const std::function<Ticket(StreamId)>& submitted) {
  // Built only on failure: enqueue is on every hot path.
  const auto where = [&] {
    return "enqueue(" + std::string(op_name(op)) + ") on stream " + std::to_string(stream) + ": ";
  };
  const auto bad = [&](std::string why) {
    return Result<void>(make_error(ErrorCode::invalid_argument, where() + std::move(why)));
  };
  if (Result<void> s = check_stream(stream, "enqueue(" + std::string(op_name(op)) + ")"); !s.ok()) return s;
  const auto device = [&](std::uint64_t addr, std::uint64_t bytes, const char* role) {
    return device_range_ok(addr, bytes)
               ? Result<void>()
               : bad(std::string(role) + " " + text::range(addr, bytes) + " starts at address 0 or wraps around");
  };
  const auto host = [&](const void* ptr, std::uint64_t bytes, const char* role) {
    return host_range_ok(ptr, bytes) ? Result<void>()
                                     : bad(std::string("host ") + role + " " + text::hex(ptr) + " of " +
                                           std::to_string(bytes) + " bytes is null or wraps around");
  };
  const auto copy_to_device = [&](const CopyToDeviceOp& c) -> Result<void> {
    FERRY_TRY(device(c.dst.addr, c.dst.bytes, "dst"));
    return host(c.src, c.dst.bytes, "src");
  };
  const auto pattern = [&](Pattern p) {
    return known_pattern(p) ? Result<void>() : bad("unknown pattern " + std::to_string(static_cast<int>(p)));
  };
  const auto flops = [&](double f) {
    return std::isfinite(f) && f >= 0 ? Result<void>() : bad("flops must be finite and >= 0");
  };
  return std::visit(
      Overloaded{
          [&](const FillOp& f) -> Result<void> {
            FERRY_TRY(pattern(f.pattern));
            return device(f.dst.addr, f.dst.bytes, "dst");
          },
          copy_to_device,
          [&](const CopyToHostOp& c) -> Result<void> {
            FERRY_TRY(device(c.src.addr, c.src.bytes, "src"));
            return host(c.dst, c.src.bytes, "dst");
          },
          [&](const CopyOnDeviceOp& c) -> Result<void> {
            FERRY_TRY(device(c.src_addr, c.dst.bytes, "src"));
            FERRY_TRY(device(c.dst.addr, c.dst.bytes, "dst"));
            // A device copy reads and writes in parallel: a partial overlap has no
            // defined result. The same range is a no-op.
            const DeviceRange src{c.src_addr, c.dst.bytes};
            if (c.src_addr != c.dst.addr && ranges_overlap(src, c.dst)) {
              return bad("src " + text::range(src.addr, src.bytes) + " overlaps dst " +
                         text::range(c.dst.addr, c.dst.bytes));
            }
            return {};
          },
          [&](const BatchCopyToDeviceOp& b) -> Result<void> {
            if (!info.batched_copy) {
              return make_error(ErrorCode::unsupported,
                                where() + "this device has no batched copy (DeviceInfo::batched_copy is false)");
            }
            for (const CopyToDeviceOp& c : b.copies) FERRY_TRY(copy_to_device(c));
            return {};
          },
          [&](const ComputeOp& c) -> Result<void> {
            FERRY_TRY(pattern(c.pattern));
            for (const DeviceRange& in : c.inputs) FERRY_TRY(device(in.addr, in.bytes, "input"));
            FERRY_TRY(device(c.output.addr, c.output.bytes, "output"));
            return flops(c.flops);
          },
          [&](const HashOp& h) -> Result<void> {
            FERRY_TRY(device(h.src.addr, h.src.bytes, "src"));
            if (h.result == nullptr) return bad("result pointer is null");
            return {};
          },
          [&](const WaitOp& w) -> Result<void> {
            if (Result<void> s = check_stream(w.point.stream, where() + "its wait"); !s.ok()) return s;
            // Only enqueued work can be waited for, which also rules out cycles.
            const Ticket last = submitted(w.point.stream);
            if (w.point.ticket > last) {
              return bad("waits for " + text::point(w.point) + ", but that stream has only " + std::to_string(last) +
                         " tickets");
            }
            return {};
          },
          [&](const NativeWaitOp& w) -> Result<void> {
            if (w.event == nullptr) return bad("the native event is null");
            return {};
          },
          [&](const UserOp& u) -> Result<void> {
            if (!u.kernel) return bad("no kernel (an empty callable)");
            for (const UserOperand& o : u.operands) {
              if (static_cast<unsigned>(o.access) > static_cast<unsigned>(Access::read_write)) {
                return bad("operand " + text::range(o.range.addr, o.range.bytes) + " has an unknown access mark");
              }
              FERRY_TRY(device(o.range.addr, o.range.bytes, to_string(o.access).data()));
            }
            return flops(u.flops);
          },
          [](const NopOp&) { return Result<void>(); },
      },
      op);
}

}  // namespace ferry
