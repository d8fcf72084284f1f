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
#include <cstdint>
#include <functional>
#include <string_view>
#include <variant>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

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
// And unsupported for a BatchCopyToDeviceOp on a device without batched copy.
Result<void> check_op(StreamId stream, const Op& op, const DeviceInfo& info,
                      const std::function<Ticket(StreamId)>& submitted);

// Calls fn(addr, bytes, role) for each device range `op` reads or writes (a
// UserOp's roles are its operands' access marks: "read", "write", "read_write").
template <class Fn>
void for_each_device_range(const Op& op, Fn&& fn) {
  std::visit(Overloaded{
                 [&](const FillOp& f) { fn(f.dst.addr, f.dst.bytes, "dst"); },
                 [&](const CopyToDeviceOp& c) { fn(c.dst.addr, c.dst.bytes, "dst"); },
                 [&](const CopyToHostOp& c) { fn(c.src.addr, c.src.bytes, "src"); },
                 [&](const CopyOnDeviceOp& c) {
                   fn(c.src_addr, c.dst.bytes, "src");
                   fn(c.dst.addr, c.dst.bytes, "dst");
                 },
                 [&](const BatchCopyToDeviceOp& b) {
                   for (const CopyToDeviceOp& c : b.copies) fn(c.dst.addr, c.dst.bytes, "dst");
                 },
                 [&](const ComputeOp& c) {
                   for (const DeviceRange& in : c.inputs) fn(in.addr, in.bytes, "input");
                   fn(c.output.addr, c.output.bytes, "output");
                 },
                 [&](const HashOp& h) { fn(h.src.addr, h.src.bytes, "src"); },
                 [&](const UserOp& u) {
                   for (const UserOperand& o : u.operands) fn(o.range.addr, o.range.bytes, to_string(o.access).data());
                 },
                 [](const auto&) {},
             },
             op);
}

// Calls fn(first_byte, bytes) for each host range `op` reads or writes.
template <class Fn>
void for_each_host_range(const Op& op, Fn&& fn) {
  std::visit(Overloaded{
                 [&](const CopyToDeviceOp& c) { fn(c.src, c.dst.bytes); },
                 [&](const CopyToHostOp& c) { fn(c.dst, c.src.bytes); },
                 [&](const BatchCopyToDeviceOp& b) {
                   for (const CopyToDeviceOp& c : b.copies) fn(c.src, c.dst.bytes);
                 },
                 [&](const HashOp& h) {
                   fn(reinterpret_cast<const std::byte*>(h.result), sizeof(std::uint64_t));
                 },
                 [](const auto&) {},
             },
             op);
}

// True when `op` reads or writes any of the host bytes [begin, begin + bytes)
// (memory that must not be freed while the op may still run).
inline bool touches_host(const Op& op, const std::byte* begin, std::uint64_t bytes) {
  const auto lo = reinterpret_cast<std::uintptr_t>(begin);
  bool touches = false;
  for_each_host_range(op, [&](const std::byte* p, std::uint64_t n) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    touches = touches || (n > 0 && bytes > 0 && a < lo + bytes && lo < a + n);
  });
  return touches;
}

}  // namespace ferry
