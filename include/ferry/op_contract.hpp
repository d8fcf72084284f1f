// ferry — the one op contract, as code: what every backend refuses at enqueue,
// before an op gets a ticket, and how an op's operands are enumerated.
//
// HoldingBackend calls check_op for every backend, so the sim and cuda refuse
// the same malformed ops with the same error (tests/backends/op_contract_test.cpp
// runs one list of them on every backend). Beyond it, in HoldQueues::Device::
// admit, every backend refuses with invalid_argument an op on memory that is not
// mapped when it is enqueued (only the backend's address space knows; memory
// unmapped later is a device fault, which the sim counts as an illegal access),
// and may answer unsupported for what it lacks. Nothing else. (A user op's own
// rules, a GEMM's shape among them, are checked by whoever builds it: gemm.hpp.)
#pragma once

#include <cstddef>
#include <concepts>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <variant>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry FERRY_API {

// std::visit over a set of lambdas.
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

// "fill", "copy_to_device", ...: the op's kind, for messages and reports.
std::string_view op_name(const Op& op) noexcept;

// The contract. Errors: invalid_argument naming the op, the stream and the flaw:
//   * stream outside 0..kMaxStreams-1;
//   * a device range that starts at 0 or wraps; a host pointer that is null or
//     wraps (ranges of 0 bytes are always fine);
//   * an unknown pattern; flops that are negative or not finite;
//   * a device-to-device copy whose ranges overlap without being the same;
//   * a HashOp with no result pointer, a NativeWaitOp with no event, a UserOp
//     with no kernel or an operand with an unknown access mark;
//   * a WaitOp for a point its stream has not handed out yet (which also rules
//     out cycles), where `submitted(s)` is stream s's last ticket.
//   * a PeerCopyOp with no peer, a link that is neither pcie nor nvlink, or a
//     source range that starts at 0 or wraps.
// And unsupported for a BatchCopyToDeviceOp on a device without batched copy,
// and for a PeerCopyOp on a device without peer copy.
Result<void> check_op(StreamId stream, const Op& op, const DeviceInfo& info,
                      const std::function<Ticket(StreamId)>& submitted);

// --- Each op described once: the operand table that check_op, the cost model
// (cost_model.hpp), the sim (admit, effects, race checker) and cuda's admission
// all read. OpDescription<T> has no primary definition, so an Op alternative
// without its description does not compile (tests/compile_fail checks it).

// The engine an op occupies (the cost model's and the sim's queues).
enum class Engine : std::uint8_t {
  none,      // waits and no-ops
  compute,   // fill, compute, user, hash, device-to-device copy
  copy_h2d,  // a copy engine and the host->device direction of the link
  copy_d2h,  // a copy engine and the device->host direction of the link
  copy_peer, // a copy engine and a peer link, not the host link
};

// A device range an op reads or writes. `role` names it in messages ("dst",
// "src", "input", "output"; a UserOp operand's is its access mark).
struct DeviceOperand {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
  std::string_view role;
  Access access = Access::read;
};
// A host range an op reads or writes (a copy's host side, a hash's result).
struct HostOperand {
  const std::byte* ptr = nullptr;
  std::uint64_t bytes = 0;
  std::string_view role;
  Access access = Access::read;
};
// The modeled cost an op states (compute and user ops); 0 and 0: one pass over
// its device operands.
struct OpFigures {
  double flops = 0;
  std::uint64_t mem_bytes = 0;
};

template <class T>
struct OpDescription;  // name, engine, device(op, fn), host(op, fn), figures(op)

template <>
struct OpDescription<FillOp> {
  static constexpr std::string_view name = "fill";
  static constexpr Engine engine = Engine::compute;
  template <class Fn>
  static void device(const FillOp& o, Fn&& fn) { fn(DeviceOperand{o.dst.addr, o.dst.bytes, "dst", Access::write}); }
  template <class Fn>
  static void host(const FillOp&, Fn&&) {}
  static OpFigures figures(const FillOp&) { return {}; }
};
template <>
struct OpDescription<CopyToDeviceOp> {
  static constexpr std::string_view name = "copy_to_device";
  static constexpr Engine engine = Engine::copy_h2d;
  template <class Fn>
  static void device(const CopyToDeviceOp& o, Fn&& fn) {
    fn(DeviceOperand{o.dst.addr, o.dst.bytes, "dst", Access::write});
  }
  template <class Fn>
  static void host(const CopyToDeviceOp& o, Fn&& fn) { fn(HostOperand{o.src, o.dst.bytes, "src", Access::read}); }
  static OpFigures figures(const CopyToDeviceOp&) { return {}; }
};
template <>
struct OpDescription<CopyToHostOp> {
  static constexpr std::string_view name = "copy_to_host";
  static constexpr Engine engine = Engine::copy_d2h;
  template <class Fn>
  static void device(const CopyToHostOp& o, Fn&& fn) {
    fn(DeviceOperand{o.src.addr, o.src.bytes, "src", Access::read});
  }
  template <class Fn>
  static void host(const CopyToHostOp& o, Fn&& fn) { fn(HostOperand{o.dst, o.src.bytes, "dst", Access::write}); }
  static OpFigures figures(const CopyToHostOp&) { return {}; }
};
template <>
struct OpDescription<CopyOnDeviceOp> {
  static constexpr std::string_view name = "copy_on_device";
  static constexpr Engine engine = Engine::compute;
  template <class Fn>
  static void device(const CopyOnDeviceOp& o, Fn&& fn) {
    fn(DeviceOperand{o.src_addr, o.dst.bytes, "src", Access::read});
    fn(DeviceOperand{o.dst.addr, o.dst.bytes, "dst", Access::write});
  }
  template <class Fn>
  static void host(const CopyOnDeviceOp&, Fn&&) {}
  static OpFigures figures(const CopyOnDeviceOp&) { return {}; }
};
template <>
struct OpDescription<BatchCopyToDeviceOp> {
  static constexpr std::string_view name = "batch_copy_to_device";
  static constexpr Engine engine = Engine::copy_h2d;
  template <class Fn>
  static void device(const BatchCopyToDeviceOp& o, Fn&& fn) {
    for (const CopyToDeviceOp& c : o.copies) OpDescription<CopyToDeviceOp>::device(c, fn);
  }
  template <class Fn>
  static void host(const BatchCopyToDeviceOp& o, Fn&& fn) {
    for (const CopyToDeviceOp& c : o.copies) OpDescription<CopyToDeviceOp>::host(c, fn);
  }
  static OpFigures figures(const BatchCopyToDeviceOp&) { return {}; }
};
template <>
struct OpDescription<ComputeOp> {
  static constexpr std::string_view name = "compute";
  static constexpr Engine engine = Engine::compute;
  template <class Fn>
  static void device(const ComputeOp& o, Fn&& fn) {
    for (const DeviceRange& in : o.inputs) fn(DeviceOperand{in.addr, in.bytes, "input", Access::read});
    fn(DeviceOperand{o.output.addr, o.output.bytes, "output", Access::write});
  }
  template <class Fn>
  static void host(const ComputeOp&, Fn&&) {}
  static OpFigures figures(const ComputeOp& o) { return {o.flops, o.mem_bytes}; }
};
template <>
struct OpDescription<HashOp> {
  static constexpr std::string_view name = "hash";
  static constexpr Engine engine = Engine::compute;
  template <class Fn>
  static void device(const HashOp& o, Fn&& fn) { fn(DeviceOperand{o.src.addr, o.src.bytes, "src", Access::read}); }
  template <class Fn>
  static void host(const HashOp& o, Fn&& fn) {
    fn(HostOperand{reinterpret_cast<const std::byte*>(o.result), sizeof(std::uint64_t), "result", Access::write});
  }
  static OpFigures figures(const HashOp&) { return {}; }
};
template <>
struct OpDescription<WaitOp> {
  static constexpr std::string_view name = "wait";
  static constexpr Engine engine = Engine::none;
  template <class Fn>
  static void device(const WaitOp&, Fn&&) {}
  template <class Fn>
  static void host(const WaitOp&, Fn&&) {}
  static OpFigures figures(const WaitOp&) { return {}; }
};
template <>
struct OpDescription<NativeWaitOp> {
  static constexpr std::string_view name = "native_wait";
  static constexpr Engine engine = Engine::none;
  template <class Fn>
  static void device(const NativeWaitOp&, Fn&&) {}
  template <class Fn>
  static void host(const NativeWaitOp&, Fn&&) {}
  static OpFigures figures(const NativeWaitOp&) { return {}; }
};
template <>
struct OpDescription<UserOp> {
  static constexpr std::string_view name = "user";
  static constexpr Engine engine = Engine::compute;
  template <class Fn>
  static void device(const UserOp& o, Fn&& fn) {
    for (const UserOperand& u : o.operands) {
      fn(DeviceOperand{u.range.addr, u.range.bytes, to_string(u.access), u.access});
    }
  }
  template <class Fn>
  static void host(const UserOp&, Fn&&) {}
  static OpFigures figures(const UserOp& o) { return {o.flops, o.mem_bytes}; }
};
template <>
struct OpDescription<PeerCopyOp> {
  static constexpr std::string_view name = "copy_peer";
  static constexpr Engine engine = Engine::copy_peer;
  // Only the destination is this device's; the source is the peer's memory.
  template <class Fn>
  static void device(const PeerCopyOp& o, Fn&& fn) {
    fn(DeviceOperand{o.dst.addr, o.dst.bytes, "dst", Access::write});
  }
  template <class Fn>
  static void host(const PeerCopyOp&, Fn&&) {}
  static OpFigures figures(const PeerCopyOp&) { return {}; }
};
template <>
struct OpDescription<NopOp> {
  static constexpr std::string_view name = "nop";
  static constexpr Engine engine = Engine::none;
  template <class Fn>
  static void device(const NopOp&, Fn&&) {}
  template <class Fn>
  static void host(const NopOp&, Fn&&) {}
  static OpFigures figures(const NopOp&) { return {}; }
};

template <class T>
concept DescribedOp = requires(const T& op) {
  { OpDescription<T>::name } -> std::convertible_to<std::string_view>;
  { OpDescription<T>::engine } -> std::convertible_to<Engine>;
  { OpDescription<T>::figures(op) } -> std::same_as<OpFigures>;
};
template <class V>
inline constexpr bool kEveryOpDescribed = false;
template <class... T>
inline constexpr bool kEveryOpDescribed<std::variant<T...>> = (DescribedOp<T> && ...);
static_assert(kEveryOpDescribed<Op>, "an Op alternative has no OpDescription (op_contract.hpp)");

// std::visit with the alternative's description: fn(description, op).
template <class... T, class Fn>
  requires(DescribedOp<T> && ...)
decltype(auto) visit_described(const std::variant<T...>& op, Fn&& fn) {
  return std::visit([&](const auto& o) -> decltype(auto) { return fn(OpDescription<std::decay_t<decltype(o)>>{}, o); },
                    op);
}

// Calls fn(const DeviceOperand&) for each device range `op` reads or writes.
template <class... T, class Fn>
void for_each_device_range(const std::variant<T...>& op, Fn&& fn) {
  visit_described(op, [&](auto d, const auto& o) { d.device(o, fn); });
}

// Calls fn(const HostOperand&) for each host range `op` reads or writes.
template <class... T, class Fn>
void for_each_host_range(const std::variant<T...>& op, Fn&& fn) {
  visit_described(op, [&](auto d, const auto& o) { d.host(o, fn); });
}

inline Engine engine_of(const Op& op) noexcept {
  return visit_described(op, [](auto d, const auto&) { return d.engine; });
}

inline OpFigures figures_of(const Op& op) noexcept {
  return visit_described(op, [](auto d, const auto& o) { return d.figures(o); });
}

// True when `op` reads or writes any of the host bytes [begin, begin + bytes)
// (memory that must not be freed while the op may still run).
inline bool touches_host(const Op& op, const std::byte* begin, std::uint64_t bytes) {
  const auto lo = reinterpret_cast<std::uintptr_t>(begin);
  bool touches = false;
  for_each_host_range(op, [&](const HostOperand& h) {
    const auto a = reinterpret_cast<std::uintptr_t>(h.ptr);
    touches = touches || (h.bytes > 0 && bytes > 0 && a < lo + bytes && lo < a + h.bytes);
  });
  return touches;
}

// Whether `op` may be in a native graph (Backend::end_graph): device work on this
// device's memory alone — a fill, a compute, a device-to-device copy, a user op, a
// no-op. Errors: unsupported naming the op and why (host memory, which a graph
// would read at a replay after the host changed or freed it; a batched copy; a
// peer copy, across devices; a hash, whose result the host reads).
Result<void> check_graphable(const Op& op);

// A graph of `ops`' count and summed stated cost, without its launch: an op that
// states none costs one pass over its device operands (cost_model.hpp's rule).
NativeGraph graph_figures(std::span<const Op> ops);

}  // namespace ferry
