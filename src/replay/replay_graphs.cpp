// The trace's `capture` and `replay` ops: graphs captured and launched through
// the Runtime (graph.hpp), so that a replayed trace meets ferry's own private
// pools, refusals and stale-handle checks, and its race checker follows each
// launch's ops.
#include "replay/replayer.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/graph.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/transfer_engine.hpp"

namespace ferry::replay_runner {

void Replayer::capture(const TraceOp& op) {
  GraphRun& run = graphs_[op.graph];
  switch (op.phase) {
    case replay::CapturePhase::begin: {
      CaptureOptions options;
      if (op.pool) options.pool = graphs_[*op.pool].graph.pool();
      if (!outcome(op, runtime_.begin_capture(op.stream, std::move(options)))) return;
      (void)run.graph.destroy();  // a graph captured again under its name: the old one goes
      run.ops.clear();
      capturing_[op.stream] = op.graph;
      return expect_success(op);
    }
    case replay::CapturePhase::end: {
      Result<Graph> graph = runtime_.end_capture(op.stream);
      capturing_[op.stream].reset();  // ended even when spoiled
      if (!outcome(op, graph)) return;
      run.graph = std::move(graph).value();
      return expect_success(op);
    }
    case replay::CapturePhase::destroy:
      if (!outcome(op, run.graph.destroy())) return;
      return expect_success(op);
  }
}

void Replayer::replay(const TraceOp& op) {
  GraphRun& run = graphs_[op.graph];
  // The order a program writes before a launch: after every other stream's
  // unfinished writes (and, for what it writes, reads) of the graph's buffers.
  for (const TraceOp* r : run.ops) {
    for (IdIndex in : r->inputs) {
      if (!outcome(op, order_after_writer(op.stream, buffers_[in]))) return;
    }
    std::vector<IdIndex> written;
    if (r->kind == OpKind::check) {
      if (!outcome(op, order_after_writer(op.stream, buffers_[r->id]))) return;
    } else if (r->kind != OpKind::user) {
      written.push_back(r->id);
    }
    for (const replay::TraceOperand& o : r->operands) {
      if (writes(o.access)) written.push_back(o.id);
      else if (!outcome(op, order_after_writer(op.stream, buffers_[o.id]))) return;
    }
    for (IdIndex id : written) {
      if (!outcome(op, order_after_writers_and_readers(op.stream, buffers_[id]))) return;
    }
  }
  if (!outcome(op, runtime_.launch(run.graph, op.stream))) return;
  // Each recorded op ran, in order, before the launch's last ticket.
  const StreamPoint done{op.stream, backend_->submitted(op.stream)};
  for (const TraceOp* r : run.ops) {
    switch (r->kind) {
      case OpKind::fill: {
        Buffer& b = buffers_[r->id];
        wrote(b, done, ExpectedBytes::pattern(b.expected.size(), r->seed));
        break;
      }
      case OpKind::compute: {
        std::vector<ExpectedBytes*> inputs;
        for (IdIndex in : r->inputs) inputs.push_back(&buffers_[in].expected);
        ExpectedBytes result = ExpectedBytes::mixed(inputs, buffers_[r->id].expected.size());
        for (IdIndex in : r->inputs) buffers_[in].reads.add(done);
        wrote(buffers_[r->id], done, std::move(result));
        break;
      }
      case OpKind::user: user_wrote(*r, done, user_results(*r)); break;
      case OpKind::copy: {
        ExpectedBytes result = copied(*r);
        buffers_[r->inputs.front()].reads.add(done);
        wrote(buffers_[r->id], done, std::move(result));
        break;
      }
      case OpKind::upload: {
        Buffer& b = buffers_[r->id];
        wrote(b, done, ExpectedBytes::pattern(b.expected.size(), r->seed));
        break;
      }
      case OpKind::check: {
        Buffer& b = buffers_[r->id];
        b.reads.add(done);
        const std::vector<std::byte>* host = run.check_targets.at(r);
        // This launch's copy overwrites the bytes an earlier one left: only the latest is compared.
        std::erase_if(pending_checks_, [&](const PendingCheck& p) { return p.host == host; });
        pending_checks_.push_back({r, host, b.expected, op.stream, op.graph});
        break;
      }
      default: break;  // only the six above are recorded (captured())
    }
  }
  expect_success(op);
}

bool Replayer::captured(const TraceOp& op) {
  // Captures are device 0's; a wait across devices is Runtime::order_after's (which refuses a capturing stream).
  if (device_ != 0 || op.for_device != 0) return false;
  switch (op.kind) {
    case OpKind::fill:
    case OpKind::compute:
    case OpKind::user:
    case OpKind::copy:
    case OpKind::upload:
    case OpKind::hold:
    case OpKind::release:
      if (!recording(op.stream)) return false;
      break;
    case OpKind::check:
      if (!op.on_stream || !recording(op.stream)) return false;
      break;
    case OpKind::sync:
      if (op.all_streams ? std::none_of(capturing_.begin(), capturing_.end(), [](const auto& g) { return g.has_value(); })
                         : !recording(op.stream)) {
        return false;
      }
      break;
    case OpKind::wait:
      if (!recording(op.stream) && !recording(op.waits_for)) return false;
      break;
    default: return false;
  }
  const std::shared_ptr<PoolCalls> calls = runtime_.calls();
  switch (op.kind) {
    case OpKind::fill: {
      Buffer& b = buffers_[op.id];
      if (skip(b)) return true;
      if (!outcome(op, calls->fill(op.stream, b.handle, op.seed))) return true;
      break;
    }
    case OpKind::compute: {
      for (IdIndex in : op.inputs) {
        if (buffers_[in].failed) {
          skipped();
          return true;
        }
      }
      Buffer& out = buffers_[op.id];
      if (skip(out)) return true;
      std::vector<DeviceHandle> handles;
      std::uint64_t mem_bytes = out.expected.size();
      for (IdIndex in : op.inputs) {
        handles.push_back(buffers_[in].handle);
        mem_bytes += buffers_[in].expected.size();
      }
      if (!outcome(op, calls->compute(op.stream, handles, out.handle, 0.0, mem_bytes))) return true;
      break;
    }
    case OpKind::user: {
      std::vector<Operand> operands;
      for (const replay::TraceOperand& o : op.operands) {
        if (buffers_[o.id].failed) {
          skipped();
          return true;
        }
        operands.push_back({buffers_[o.id].handle, o.access, o.offset, o.bytes});
      }
      if (!outcome(op, calls->user(op.stream, operands, stand_in_kernel, {}, op.tag))) return true;
      break;
    }
    case OpKind::copy: {
      Buffer& src = buffers_[op.inputs.front()];
      Buffer& dst = buffers_[op.id];
      if (skip(src) || skip(dst)) return true;
      // Under verify the capture refuses it (a host compare), as the program's would be.
      if (!outcome(op, calls->copy_on_device(op.stream, dst.handle, op.dst_offset, src.handle, op.src_offset,
                                             op.bytes))) {
        return true;
      }
      break;
    }
    case OpKind::upload:
    case OpKind::check: {
      Buffer& b = buffers_[op.id];
      if (skip(b)) return true;
      GraphRun& run = graphs_[*capturing_[op.stream]];
      std::vector<std::byte>& host = run.host.emplace_back(static_cast<std::size_t>(b.expected.size()));
      if (op.kind == OpKind::check) {
        if (!outcome(op, calls->copy_to_host(op.stream, b.handle, host))) return true;
        run.check_targets[&op] = &host;
        break;
      }
      fill_pattern(op.seed, 0, host);
      // Under probe and verify the capture refuses it (a host compare), as the program's was.
      if (!outcome(op, calls->upload(op.stream, TransferPlan().add(std::span<const std::byte>(host), b.handle)))) {
        return true;
      }
      break;
    }
    case OpKind::hold:
    case OpKind::release:
    case OpKind::sync:
    case OpKind::wait: {
      // None of these can be captured: the capture front refuses them, naming why.
      const Result<void> r = op.kind == OpKind::hold      ? calls->hold(op.stream)
                             : op.kind == OpKind::release ? calls->release(op.stream)
                             : op.kind == OpKind::wait    ? calls->wait(op.stream, op.waits_for)
                             : op.all_streams             ? calls->synchronize()
                                                          : calls->synchronize(op.stream);
      if (outcome(op, r)) expect_success(op);
      return true;
    }
    default: return false;
  }
  graphs_[*capturing_[op.stream]].ops.push_back(&op);
  expect_success(op);
  return true;
}

void Replayer::compare_pending_checks(std::optional<StreamId> stream) {
  std::vector<PendingCheck> now;
  std::erase_if(pending_checks_, [&](PendingCheck& p) {
    if (stream && p.stream != *stream) return false;
    now.push_back(std::move(p));
    return true;
  });
  for (const PendingCheck& p : now) {
    if (!p.expected.known() || p.expected.size() != p.host->size()) {
      ++report_.unwritten_checks;
      continue;
    }
    ++report_.checks;
    if (std::optional<std::uint64_t> at = p.expected.first_mismatch(*p.host)) {
      ++report_.corrupt;
      add_problem(p.op->line, *p.op, "corrupt",
                  "check of " + replay::quoted_id(trace_.ids[p.op->id]) + " in graph " +
                      replay::quoted_id(trace_.graphs[p.graph]) + ": byte " + std::to_string(*at) + " of " +
                      std::to_string(p.host->size()) + " differs from the reference");
    }
  }
}

void Replayer::close_graphs() {
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    if (!recording(s)) continue;
    if (Result<Graph> g = runtime_.end_capture(s); g.ok()) (void)g->destroy();
    capturing_[s].reset();
  }
  for (GraphRun& run : graphs_) (void)run.graph.destroy();
}

}  // namespace ferry::replay_runner
