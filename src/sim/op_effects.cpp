// ferry — the simulated GPU's effects of an op on device memory: the storage an
// op needs, held at admission (so an op that cannot get it is refused, not
// failed), and what each op does to the bytes when it completes.
#include "sim/sim_backend.hpp"

#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/op_contract.hpp"

namespace ferry::sim {

using text::hex;

Result<void> SimGpu::prepare_storage(const Op& op) {
  std::lock_guard memory(memory_mu_);
  return std::visit(
      Overloaded{
          [&](const FillOp& f) { return memory_.prepare_fill(f.dst.addr, f.dst.bytes); },
          [&](const ComputeOp& c) { return memory_.prepare_fill(c.output.addr, c.output.bytes); },
          [&](const CopyToDeviceOp& c) { return memory_.prepare_write(c.dst.addr, c.dst.bytes); },
          [&](const BatchCopyToDeviceOp& b) -> Result<void> {
            for (const CopyToDeviceOp& c : b.copies) FERRY_TRY(memory_.prepare_write(c.dst.addr, c.dst.bytes));
            return {};
          },
          [&](const CopyOnDeviceOp& c) { return memory_.prepare_copy(c.dst.addr, c.src_addr, c.dst.bytes); },
          [&](const UserOp& u) -> Result<void> {
            for (const UserOperand& o : u.operands) {
              if (writes(o.access)) FERRY_TRY(memory_.prepare_write(o.range.addr, o.range.bytes));
            }
            return {};
          },
          [](const CopyToHostOp&) -> Result<void> { return {}; },  // writes host memory only
          [](const HashOp&) -> Result<void> { return {}; },        // writes host memory only
          [](const WaitOp&) -> Result<void> { return {}; },
          [](const NativeWaitOp&) -> Result<void> { return {}; },
          [](const NopOp&) -> Result<void> { return {}; },
          [&](const PeerCopyOp& p) { return memory_.prepare_write(p.dst.addr, p.dst.bytes); },
      },
      op);
}

// --- Effects at completion --------------------------------------------------

std::optional<std::string> SimGpu::find_unmapped(const Op& op) const {
  std::optional<std::string> found;
  for_each_device_range(op, [&](const DeviceOperand& d) {
    if (found) return;
    if (const auto hole = memory_.first_unmapped(d.addr, d.bytes)) {
      found = std::string(d.role) + " " + text::range(d.addr, d.bytes) + " touched unmapped device memory at " +
              hex(*hole);
    }
  });
  return found;
}

bool SimGpu::swallowed(const CopyToDeviceOp& copy) const {
  if (copy.dst.bytes == 0) return false;
  const PinnedRange* range = host_.find(copy.src, copy.dst.bytes);
  return range != nullptr && range->stale_at_ns <= now_;
}

void SimGpu::apply(StreamId stream, const PendingOp& pending) {
  const auto illegal = [&](const std::string& bad) {
    ++illegal_accesses_;
    if (first_fault_.empty()) {
      first_fault_ = text::point({stream, pending.ticket}) + " (" + std::string(op_name(pending.op)) + ") " + bad +
                     " at virtual time " + std::to_string(now_) + " ns";
    }
  };
  if (const std::optional<std::string> bad = find_unmapped(pending.op)) return illegal(*bad);
  // A peer copy reads its source now, as the peer's memory stands (before
  // memory_mu_: the peer's is taken alone).
  const auto* peer_copy = std::get_if<PeerCopyOp>(&pending.op);
  const bool peer_noop = peer_copy != nullptr && faults_.swallows_peer_copy(stream, pending.ticket);
  Result<std::vector<std::byte>> peer_bytes = std::vector<std::byte>{};
  if (peer_copy != nullptr && !peer_noop) {
    peer_bytes = read_peer(stream, *peer_copy);
    // The source unmapped on the peer since the enqueue: the peer broke I2.
    if (!peer_bytes.ok() && peer_bytes.error().code == ErrorCode::invalid_argument) {
      return illegal(peer_bytes.error().message);
    }
  }
  std::lock_guard memory(memory_mu_);
  const auto copy_to_device = [&](const CopyToDeviceOp& c) -> Result<void> {
    if (swallowed(c)) {
      ++swallowed_copies_;  // report 000: success, destination unchanged
      return {};
    }
    return memory_.write(c.dst.addr, std::span<const std::byte>(c.src, c.dst.bytes));
  };
  const auto hash = [&](const DeviceRange& r) {
    memory_.hash(r.addr, r.bytes, hasher_);
    return hasher_.finish();
  };
  Result<void> done = std::visit(
      Overloaded{
          [&](const FillOp& f) { return memory_.fill(f.dst.addr, f.dst.bytes, f.seed, f.pattern); },
          copy_to_device,
          [&](const CopyToHostOp& c) -> Result<void> {
            memory_.read(c.src.addr, std::span<std::byte>(c.dst, c.src.bytes));
            return {};
          },
          [&](const CopyOnDeviceOp& c) { return memory_.copy(c.dst.addr, c.src_addr, c.dst.bytes); },
          [&](const BatchCopyToDeviceOp& b) -> Result<void> {
            for (std::size_t i = 0; i < b.copies.size(); ++i) {
              if (i > 0 && faults_.faults().batch_broken) break;
              FERRY_TRY(copy_to_device(b.copies[i]));
            }
            return {};
          },
          [&](const ComputeOp& c) {
            // All inputs are hashed before the output is written, so an
            // output overlapping an input still sees the old input bytes.
            std::uint64_t mix = kMixStart;
            for (std::size_t k = 0; k < c.inputs.size(); ++k) {
              mix = mix_step(mix, k, hash(c.inputs[k]));
            }
            return memory_.fill(c.output.addr, c.output.bytes, mix, c.pattern);
          },
          [&](const HashOp& h) -> Result<void> {
            *h.result = hash(h.src);
            return {};
          },
          [&](const UserOp& u) { return run_user(stream, pending.ticket, u); },
          [&](const WaitOp& w) { return streams_[w.point.stream].fault.passed_on(w.point); },
          [](const NativeWaitOp&) -> Result<void> { return {}; },  // issue() made it a WaitOp
          [](const NopOp&) -> Result<void> { return {}; },
          [&](const PeerCopyOp& p) -> Result<void> {
            if (peer_noop) {
              ++swallowed_peer_copies_;  // peer-noop: success, destination unchanged
              return {};
            }
            if (!peer_bytes.ok()) return std::move(peer_bytes).error();
            return memory_.write(p.dst.addr, *peer_bytes);
          },
      },
      pending.op);
  // An op that could not finish (a failed user kernel, no host memory for the
  // model's bytes) is its stream's sticky fault: every later wait on it says so.
  if (!done.ok()) {
    Error e = std::move(done).error();
    if (!std::holds_alternative<UserOp>(pending.op)) {
      e.message = text::point({stream, pending.ticket}) + " (" + std::string(op_name(pending.op)) + "): " + e.message;
    }
    streams_[stream].fault.record(pending.ticket, std::move(e));
  }
}

Result<void> SimGpu::run_user(StreamId stream, Ticket ticket, const UserOp& op) {
  std::vector<std::vector<std::byte>> bytes(op.operands.size());
  std::vector<KernelArg> args(op.operands.size());
  try {
    for (std::size_t i = 0; i < op.operands.size(); ++i) bytes[i].resize(op.operands[i].range.bytes);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, "user op '" + op.tag + "' at " + text::point({stream, ticket}) +
                                                    ": no host memory for views of its operands");
  }
  for (std::size_t i = 0; i < op.operands.size(); ++i) {
    const UserOperand& o = op.operands[i];
    memory_.read(o.range.addr, bytes[i]);  // a write-only view starts as the current bytes
    args[i] = KernelArg{o.range.addr, o.range.bytes, o.access, {}, {}};
    if (reads(o.access)) args[i].in = bytes[i];
    if (writes(o.access)) args[i].out = bytes[i];
  }
  FERRY_TRY(call_user_kernel(op.kernel, KernelLaunch{nullptr, args, {stream, ticket}, op.tag}));
  for (std::size_t i = 0; i < op.operands.size(); ++i) {
    if (!writes(op.operands[i].access)) continue;
    if (Result<void> w = memory_.write(op.operands[i].range.addr, bytes[i]); !w.ok()) {
      return make_error(ErrorCode::out_of_memory, "user op '" + op.tag + "' at " + text::point({stream, ticket}) +
                                                      ": its output could not be kept: " + w.error().message);
    }
  }
  return {};
}

}  // namespace ferry::sim
