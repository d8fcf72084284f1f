#include "ferry/op_contract.hpp"

#include <cmath>
#include <string>
#include <string_view>
#include <variant>
#include <utility>

#include "core/text.hpp"

namespace ferry {
namespace {

bool device_range_ok(std::uint64_t addr, std::uint64_t bytes) {
  return bytes == 0 || (addr != 0 && addr <= UINT64_MAX - bytes);
}

bool host_range_ok(const void* ptr, std::uint64_t bytes) {
  return bytes == 0 || (ptr != nullptr && reinterpret_cast<std::uintptr_t>(ptr) <= UINTPTR_MAX - bytes);
}

bool ranges_overlap(const DeviceRange& x, const DeviceRange& y) {
  return x.bytes > 0 && y.bytes > 0 && x.addr < y.addr + y.bytes && y.addr < x.addr + x.bytes;
}

// A PeerCopyOp's own fields; `where` names the enqueue.
template <class Where>
Result<void> check_peer(const PeerCopyOp& p, const DeviceInfo& info, const Where& where) {
  const auto bad = [&](const std::string& why) { return make_error(ErrorCode::invalid_argument, where() + why); };
  if (!info.peer_copy) {
    return make_error(ErrorCode::unsupported, where() + "this device has no peer copy (DeviceInfo::peer_copy is false)");
  }
  if (p.peer == nullptr) return bad("the peer device is null");
  if (p.link != PeerLink::pcie && p.link != PeerLink::nvlink) return bad("the link is neither pcie nor nvlink");
  if (!device_range_ok(p.src_addr, p.dst.bytes)) {
    return bad("peer src " + text::range(p.src_addr, p.dst.bytes) + " starts at address 0 or wraps around");
  }
  return {};
}

}  // namespace

std::string_view op_name(const Op& op) noexcept {
  return visit_described(op, [](auto d, const auto&) { return d.name; });
}

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
  const auto pattern = [&](Pattern p) {
    return known_pattern(p) ? Result<void>() : bad("unknown pattern " + std::to_string(static_cast<int>(p)));
  };
  const auto flops = [&](double f) {
    return std::isfinite(f) && f >= 0 ? Result<void>() : bad("flops must be finite and >= 0");
  };
  // Three passes, so that an op with one flaw is named by that flaw: what the
  // op's own fields say, its device ranges (the op table), what relates them,
  // then its host ranges (the op table).
  FERRY_TRY(std::visit(
      Overloaded{
          [&](const FillOp& f) { return pattern(f.pattern); },
          [](const CopyToDeviceOp&) { return Result<void>(); },
          [](const CopyToHostOp&) { return Result<void>(); },
          [](const CopyOnDeviceOp&) { return Result<void>(); },
          [&](const BatchCopyToDeviceOp&) -> Result<void> {
            if (info.batched_copy) return {};
            return make_error(ErrorCode::unsupported,
                              where() + "this device has no batched copy (DeviceInfo::batched_copy is false)");
          },
          [&](const ComputeOp& c) { return pattern(c.pattern); },
          [](const HashOp&) { return Result<void>(); },
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
            }
            return {};
          },
          [](const NopOp&) { return Result<void>(); },
          [&](const PeerCopyOp& p) { return check_peer(p, info, where); },
      },
      op));
  Result<void> ranges;
  for_each_device_range(op, [&](const DeviceOperand& d) {
    if (ranges.ok() && !device_range_ok(d.addr, d.bytes)) {
      ranges = bad(std::string(d.role) + " " + text::range(d.addr, d.bytes) + " starts at address 0 or wraps around");
    }
  });
  FERRY_TRY(std::move(ranges));
  FERRY_TRY(std::visit(
      Overloaded{
          [](const FillOp&) { return Result<void>(); },
          [](const CopyToDeviceOp&) { return Result<void>(); },
          [](const CopyToHostOp&) { return Result<void>(); },
          [&](const CopyOnDeviceOp& c) -> Result<void> {
            // A device copy reads and writes in parallel: a partial overlap has no
            // defined result. The same range is a no-op.
            const DeviceRange src{c.src_addr, c.dst.bytes};
            if (c.src_addr != c.dst.addr && ranges_overlap(src, c.dst)) {
              return bad("src " + text::range(src.addr, src.bytes) + " overlaps dst " +
                         text::range(c.dst.addr, c.dst.bytes));
            }
            return {};
          },
          [](const BatchCopyToDeviceOp&) { return Result<void>(); },
          [&](const ComputeOp& c) { return flops(c.flops); },
          [&](const HashOp& h) -> Result<void> {
            if (h.result == nullptr) return bad("result pointer is null");
            return {};
          },
          [](const WaitOp&) { return Result<void>(); },
          [](const NativeWaitOp&) { return Result<void>(); },
          [&](const UserOp& u) { return flops(u.flops); },
          [](const NopOp&) { return Result<void>(); },
          [](const PeerCopyOp&) { return Result<void>(); },
      },
      op));
  Result<void> host_ranges;
  for_each_host_range(op, [&](const HostOperand& h) {
    if (host_ranges.ok() && !host_range_ok(h.ptr, h.bytes)) {
      host_ranges = bad("host " + std::string(h.role) + " " + text::hex(h.ptr) + " of " + std::to_string(h.bytes) +
                   " bytes is null or wraps around");
    }
  });
  return host_ranges;
}

Result<void> check_graphable(const Op& op) {
  const auto no = [&](std::string_view why) -> Result<void> {
    return make_error(ErrorCode::unsupported,
                      std::string("a ") + std::string(op_name(op)) + " op cannot be in a native graph: " + std::string(why));
  };
  return std::visit(
      Overloaded{
          [](const FillOp&) { return Result<void>(); },
          [](const ComputeOp&) { return Result<void>(); },
          [](const CopyOnDeviceOp&) { return Result<void>(); },
          [](const UserOp&) { return Result<void>(); },
          [](const NopOp&) { return Result<void>(); },
          [&](const CopyToDeviceOp&) { return no("it reads host memory, which may change or go between replays"); },
          [&](const BatchCopyToDeviceOp&) { return no("it reads host memory, which may change or go between replays"); },
          [&](const CopyToHostOp&) { return no("it writes host memory, which may go between replays"); },
          [&](const HashOp&) { return no("its result is for the host to read"); },
          [&](const PeerCopyOp&) { return no("it reads another device's memory"); },
          [&](const WaitOp&) { return no("a wait is the launch's to give"); },
          [&](const NativeWaitOp&) { return no("a wait is the launch's to give"); },
      },
      op);
}

NativeGraph graph_figures(std::span<const Op> ops) {
  NativeGraph g;
  for (const Op& op : ops) {
    ++g.ops;
    const OpFigures f = figures_of(op);
    g.flops += f.flops;
    if (f.flops != 0 || f.mem_bytes != 0) {
      g.mem_bytes += f.mem_bytes;
      continue;
    }
    for_each_device_range(op, [&](const DeviceOperand& d) { g.mem_bytes += d.bytes; });
  }
  return g;
}

}  // namespace ferry
