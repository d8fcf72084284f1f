// What each trace op does on the pool, the arena and the engine, and the
// cross-stream waits a program would have written.
#include "replay/replayer.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "core/align.hpp"
#include "core/input_file.hpp"
#include "core/testing_hooks.hpp"
#include "core/text.hpp"
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/replay.hpp"
#include "ferry/runtime.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/user_op.hpp"
#include "replay/reference.hpp"
#include "replay/trace.hpp"

namespace ferry::replay_runner {

// A check copies a buffer back in pieces of at most this many bytes.
constexpr std::uint64_t kCheckPiece = std::uint64_t{64} << 20;

void Replayer::use_device(std::uint32_t device) {
  RuntimeDevice& d = runtime_.device(device);
  device_ = device;
  backend_ = &d.backend();
  order_ = &d.order();
  pool_ = &d.pool();
  arena_ = &d.arena();
  engine_ = &d.engine();
}

void Replayer::execute(const TraceOp& op) {
  use_device(op.device);
  if (op.kind == OpKind::sync && op.all_devices) return sync(op);  // every device's streams
  if (captured(op)) return;
  switch (op.kind) {
    case OpKind::alloc: return alloc(op);
    case OpKind::free: return free(op);
    case OpKind::fill: return fill(op);
    case OpKind::upload: return upload(op);
    case OpKind::compute: return compute(op);
    case OpKind::user: return user(op);
    case OpKind::copy: return copy(op);
    case OpKind::hold:
      backend_->set_hold(op.stream, true);
      return expect_success(op);
    case OpKind::release:
      backend_->set_hold(op.stream, false);
      if (!outcome(op, backend_->flush(op.stream))) return;
      return expect_success(op);
    case OpKind::sync: return sync(op);
    case OpKind::trim:
      if (!outcome(op, pool_->trim())) return;
      return expect_success(op);
    case OpKind::check: return check(op);
    case OpKind::wait: return wait(op);
    case OpKind::capture: return capture(op);
    case OpKind::replay: return replay(op);
    case OpKind::copy_peer: return copy_peer(op);
    case OpKind::meta: return;  // never among ops: parse_trace keeps it in Trace
  }
}

void Replayer::alloc(const TraceOp& op) {
  Buffer& b = buffers_[op.id];
  // Only an alloc that carried `expect` and succeeded anyway leaves a live
  // handle behind under the same id (the validator rejects the rest).
  if (b.allocated) (void)runtime_.device(b.device).pool().free(b.handle);
  b = Buffer{};
  // On a capturing stream, from the graph's private pool.
  Result<DeviceHandle> h =
      recording(op.stream) ? runtime_.calls()->allocate(op.bytes, op.stream, "") : pool_->allocate(op.bytes, op.stream);
  if (!h.ok()) {
    b.failed = true;
    record(op, std::move(h).error());
    return;
  }
  b.handle = *h;
  b.allocated = true;
  b.device = device_;
  b.expected = ExpectedBytes::unknown(op.bytes);
  if (racing_) (void)pool_->set_tag(*h, trace_.ids[op.id]);  // the handle is live: cannot fail
  if (naming_owners_ && device_ == 0) {  // an observer sees device 0's pool
    const DeviceSpan span = *pool_->resolve(*h);
    name_owner(span.addr, span.addr + detail::align_up(span.bytes, detail::kBlockAlign), op.id);
  }
  expect_success(op);
}

void Replayer::free(const TraceOp& op) {
  Buffer& b = buffers_[op.id];
  if (skip(b)) return;
  b.allocated = false;
  // With graphs, a free of a private pool's block is deferred by the capture front.
  if (!outcome(op, trace_.graphs.empty() ? pool_->free(b.handle) : runtime_.calls()->free(b.handle))) return;
  expect_success(op);
}

void Replayer::fill(const TraceOp& op) {
  Buffer& b = buffers_[op.id];
  if (skip(b)) return;
  if (!outcome(op, order_after_writers_and_readers(op.stream, b))) return;
  Result<Ticket> t = enqueue_fill(*pool_, op.stream, b.handle, op.seed);
  if (!outcome(op, t)) return;
  wrote(b, {op.stream, *t}, ExpectedBytes::pattern(b.expected.size(), op.seed));
  expect_success(op);
}

void Replayer::upload(const TraceOp& op) {
  Buffer& b = buffers_[op.id];
  if (skip(b)) return;
  if (!outcome(op, order_after_writers_and_readers(op.stream, b))) return;
  const std::uint64_t size = b.expected.size();
  TransferPlan plan;
  Result<HostBlock> block = arena_->allocate(size);
  std::vector<std::byte> unpinned;
  if (block.ok()) {
    fill_pattern(op.seed, 0, block->span());
    plan.add(*block, b.handle);
  } else if (block.error().code == ErrorCode::out_of_memory) {
    // Larger than the arena's pinned budget: plain host memory, which the
    // engine copies before upload() returns (pageable, still verified).
    unpinned.resize(static_cast<std::size_t>(size));
    fill_pattern(op.seed, 0, unpinned);
    plan.add(std::span<const std::byte>(unpinned), b.handle);
  } else {
    record(op, std::move(block).error());
    return;
  }
  Result<TransferReceipt> receipt = engine_->upload(op.stream, plan);
  // Legal with the copy in flight: the engine leased the block for it.
  if (block.ok()) (void)arena_->free(*block);
  if (!receipt.ok()) {
    // Whatever the engine enqueued before it gave up may still write the
    // buffer: order later users after all of it, and trust none of the bytes.
    if (receipt.error().code == ErrorCode::transfer_corrupt) {
      wrote(b, {op.stream, backend_->submitted(op.stream)}, ExpectedBytes::unknown(size));
    }
    record(op, receipt.error());
    return;
  }
  wrote(b, receipt->done, ExpectedBytes::pattern(size, op.seed));
  expect_success(op);
}

void Replayer::compute(const TraceOp& op) {
  Buffer& out = buffers_[op.id];
  for (IdIndex in : op.inputs) {
    if (buffers_[in].failed) return skipped();
  }
  if (skip(out)) return;
  std::vector<DeviceHandle> handles;
  std::vector<ExpectedBytes*> inputs;
  std::uint64_t mem_bytes = out.expected.size();
  for (IdIndex in : op.inputs) {
    Buffer& b = buffers_[in];
    if (!outcome(op, order_after_writer(op.stream, b))) return;
    handles.push_back(b.handle);
    inputs.push_back(&b.expected);
    mem_bytes += b.expected.size();
  }
  if (!outcome(op, order_after_writers_and_readers(op.stream, out))) return;
  // The reference of the output is computed before it changes (the output may
  // also be an input).
  ExpectedBytes result = ExpectedBytes::mixed(inputs, out.expected.size());
  Result<Ticket> t = enqueue_compute(*pool_, op.stream, handles, out.handle, 0.0, mem_bytes);
  if (!outcome(op, t)) return;
  for (IdIndex in : op.inputs) buffers_[in].reads.add({op.stream, *t});
  wrote(out, {op.stream, *t}, std::move(result));
  expect_success(op);
}

void Replayer::copy(const TraceOp& op) {
  Buffer& src = buffers_[op.inputs.front()];
  Buffer& dst = buffers_[op.id];
  if (skip(src) || skip(dst)) return;
  if (!outcome(op, order_after_writer(op.stream, src))) return;
  if (!outcome(op, order_after_writers_and_readers(op.stream, dst))) return;
  ExpectedBytes result = copied(op);  // before dst changes (src may be dst)
  Result<TransferReceipt> r =
      engine_->copy_on_device(op.stream, dst.handle, op.dst_offset, src.handle, op.src_offset, op.bytes);
  if (!outcome(op, r)) return;
  src.reads.add(r->done);
  wrote(dst, r->done, std::move(result));
  expect_success(op);
}

void Replayer::copy_peer(const TraceOp& op) {
  Buffer& src = buffers_[op.inputs.front()];
  Buffer& dst = buffers_[op.id];
  if (skip(src) || skip(dst)) return;
  // The pull on the dst's device and the staged path's download on the src's both follow the src's writer.
  if (!outcome(op, order_after_writer(op.stream, src))) return;
  if (!outcome(op, order_after_writers_and_readers(op.stream, dst))) return;
  if (op.for_device != op.device) {
    use_device(op.for_device);
    const Result<void> source_side = order_after_writer(op.stream, src);
    use_device(op.device);
    if (!outcome(op, source_side)) return;
  }
  ExpectedBytes result = copied(op);  // before dst changes (src may be dst)
  Result<PeerCopyReceipt> r = runtime_.copy_peer(dst.handle, op.dst_offset, src.handle, op.src_offset, op.bytes, op.stream);
  if (!outcome(op, r)) return;
  // Later writers of src wait for the src device's `stream`, which follows the copy's read either way.
  src.reads.add({op.stream, runtime_.device(op.for_device).backend().submitted(op.stream)});
  wrote(dst, r->done, std::move(result));
  expect_success(op);
}

void Replayer::wait(const TraceOp& op) {
  // An event recorded on `for` (of for_device) now, waited on by `stream`.
  const StreamPoint point{op.waits_for, runtime_.device(op.for_device).backend().submitted(op.waits_for)};
  if (op.for_device == op.device) {
    if (!outcome(op, order_->order_after(op.stream, point))) return;
  } else if (!outcome(op, runtime_.order_after(op.device, op.stream, op.for_device, point))) {
    return;
  }
  expect_success(op);
}

ExpectedBytes Replayer::copied(const TraceOp& op) const {
  const Buffer& dst = buffers_[op.id];
  return ExpectedBytes::copied(buffers_[op.inputs.front()].expected, op.src_offset, dst.expected.size(),
                               op.dst_offset, op.bytes);
}

void Replayer::user(const TraceOp& op) {
  for (const replay::TraceOperand& o : op.operands) {
    if (buffers_[o.id].failed) return skipped();
  }
  std::vector<Operand> operands;
  for (const replay::TraceOperand& o : op.operands) {
    Buffer& b = buffers_[o.id];
    if (writes(o.access)) {
      if (!outcome(op, order_after_writers_and_readers(op.stream, b))) return;
    } else if (!outcome(op, order_after_writer(op.stream, b))) {
      return;
    }
    operands.push_back({b.handle, o.access, o.offset, o.bytes});
  }
  // The references of the outputs are computed before they change (an operand
  // may be read and written).
  std::vector<ExpectedBytes> results = user_results(op);
  Result<Ticket> t = enqueue_user(*pool_, op.stream, operands, stand_in_kernel, {}, op.tag);
  if (!outcome(op, t)) return;
  user_wrote(op, {op.stream, *t}, std::move(results));
  expect_success(op);
}

Result<void> stand_in_kernel(const KernelLaunch& launch) {
  std::uint64_t acc = kMixStart, k = 0;
  for (const KernelArg& a : launch.args) {
    if (reads(a.access)) acc = mix_step(acc, k++, content_hash(a.in));
  }
  for (const KernelArg& a : launch.args) {
    if (writes(a.access)) fill_pattern(acc, 0, a.out);  // empty on a real device
  }
  return {};
}

std::vector<ExpectedBytes> Replayer::user_results(const TraceOp& op) {
  const bool modeled = backend_->info().host_visible;
  std::vector<ExpectedBytes*> inputs;
  bool whole_inputs = true;
  for (const replay::TraceOperand& o : op.operands) {
    Buffer& b = buffers_[o.id];
    if (!reads(o.access)) continue;
    inputs.push_back(&b.expected);
    whole_inputs = whole_inputs && o.offset == 0 && (o.bytes == kRestOfBlock || o.bytes == b.expected.size());
  }
  std::vector<ExpectedBytes> results;
  for (const replay::TraceOperand& o : op.operands) {
    const Buffer& b = buffers_[o.id];
    const bool whole = o.offset == 0 && (o.bytes == kRestOfBlock || o.bytes == b.expected.size());
    if (!writes(o.access)) continue;
    results.push_back(modeled && whole && whole_inputs ? ExpectedBytes::mixed(inputs, b.expected.size())
                                                       : ExpectedBytes::unknown(b.expected.size()));
  }
  return results;
}

void Replayer::user_wrote(const TraceOp& op, StreamPoint point, std::vector<ExpectedBytes> results) {
  std::size_t out = 0;
  for (const replay::TraceOperand& o : op.operands) {
    Buffer& b = buffers_[o.id];
    if (writes(o.access)) {
      wrote(b, point, std::move(results[out++]));
      if (reads(o.access)) b.reads.add(point);
    } else {
      b.reads.add(point);
    }
  }
}

void Replayer::sync(const TraceOp& op) {
  if (op.all_devices) {
    for (std::uint32_t d = 0; d < runtime_.device_count(); ++d) {
      if (!outcome(op, runtime_.device(d).backend().synchronize())) return;
    }
  } else if (op.all_streams) {
    if (!outcome(op, backend_->synchronize())) return;
  } else {
    const Ticket last = backend_->submitted(op.stream);
    if (!outcome(op, order_->wait(StreamPoint{op.stream, last}))) return;
  }
  compare_pending_checks(op.all_streams ? std::nullopt : std::optional<StreamId>(op.stream));
  expect_success(op);
}

void Replayer::check(const TraceOp& op) {
  Buffer& b = buffers_[op.id];
  if (skip(b)) return;
  Result<DeviceSpan> span = pool_->resolve(b.handle);
  if (!outcome(op, span)) return;
  if (!b.expected.known()) {
    ++report_.unwritten_checks;
    return expect_success(op);
  }
  // Copy on the stream that wrote last: the FIFO orders the copy after it.
  // In pieces, so a check of gigabytes needs little host memory.
  const StreamId stream = b.last_write ? b.last_write->stream : 0;
  const std::uint64_t size = b.expected.size();
  // The copy's host buffer is a copy target of the runner's; it leaves them only
  // once its copies completed, so an error return leaves it to finish().
  std::vector<std::byte>& host = copy_targets_.emplace_back(static_cast<std::size_t>(std::min(size, kCheckPiece)));
  std::optional<std::uint64_t> at;
  for (std::uint64_t off = 0; off < size && !at; off += kCheckPiece) {
    const std::span<std::byte> piece(host.data(), static_cast<std::size_t>(std::min(kCheckPiece, size - off)));
    Result<Ticket> t = enqueue_copy_to_host(*pool_, stream, b.handle, off, piece);
    if (!outcome(op, t)) return;
    b.reads.add({stream, *t});
    if (!outcome(op, order_->wait_for_result(StreamPoint{stream, *t}))) return;
    at = b.expected.first_mismatch(piece, off);
  }
  copy_targets_.pop_back();
  ++report_.checks;
  if (at) {
    ++report_.corrupt;
    add_problem(op.line, op, "corrupt",
                "check of " + replay::quoted_id(trace_.ids[op.id]) + ": byte " + std::to_string(*at) + " of " +
                    std::to_string(size) + " differs from the reference");
    return;
  }
  expect_success(op);
}

Result<void> Replayer::order_after_writer(StreamId stream, Buffer& b) {
  if (strict_ || !b.last_write) return {};
  return wait_on(stream, b.device, *b.last_write);
}

Result<void> Replayer::order_after_writers_and_readers(StreamId stream, Buffer& b) {
  if (strict_) return {};  // the trace's own waits order the streams
  FERRY_TRY(order_after_writer(stream, b));
  b.reads.retire(runtime_.device(b.device).order());
  std::vector<StreamPoint> reads(b.reads.points().begin(), b.reads.points().end());
  for (const StreamPoint& p : reads) FERRY_TRY(wait_on(stream, b.device, p));
  return {};
}

Result<void> Replayer::wait_on(StreamId stream, std::uint32_t from, StreamPoint point) {
  RuntimeDevice& source = runtime_.device(from);
  if ((from == device_ && point.stream == stream) || source.order().is_complete(point)) return {};
  if (testing_hooks::dropped(testing_hooks::WaitSite::replay_runner)) return {};
  // A held producer would never reach the event: dispatch what it holds.
  if (source.backend().held(point.stream)) FERRY_TRY(source.backend().flush(point.stream));
  Result<Ticket> t = from == device_ ? order_->order_after(stream, point)
                                     : runtime_.order_after(device_, stream, from, point);
  if (!t.ok()) return std::move(t).error();
  return {};
}

void Replayer::wrote(Buffer& b, StreamPoint point, ExpectedBytes expected) {
  b.expected = std::move(expected);
  b.last_write = point;
  b.reads.clear();
}

}  // namespace ferry::replay_runner
