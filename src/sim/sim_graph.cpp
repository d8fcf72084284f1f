// ferry — the simulated GPU's native graphs (SimOptions::native_graphs): the kept
// ops, replayed by one user kernel that applies each op's effect, in order, to the
// views of the launch's operands (which cover every range the ops touch), so the
// bytes are those of the ops run one by one.
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/content.hpp"
#include "ferry/op_contract.hpp"
#include "sim/sim_backend.hpp"

namespace ferry::sim {
namespace {

// The bytes of [addr, addr + bytes) among the launch's writable views.
Result<std::span<std::byte>> view_of(const KernelLaunch& launch, std::uint64_t addr, std::uint64_t bytes,
                                     std::string_view what) {
  for (const KernelArg& a : launch.args) {
    if (addr >= a.addr && bytes <= a.bytes && addr - a.addr <= a.bytes - bytes && a.out.size() == a.bytes) {
      return a.out.subspan(addr - a.addr, bytes);
    }
  }
  return make_error(ErrorCode::invalid_argument, std::string(what) + " " + text::range(addr, bytes) +
                                                     " is not among the graph launch's writable operands");
}

Result<void> run_user_in_graph(const KernelLaunch& launch, const UserOp& u) {
  std::vector<KernelArg> args;
  for (const UserOperand& o : u.operands) {
    auto v = view_of(launch, o.range.addr, o.range.bytes, "user op operand");
    if (!v.ok()) return std::move(v).error();
    KernelArg arg{o.range.addr, o.range.bytes, o.access, {}, {}};
    if (reads(o.access)) arg.in = *v;
    if (writes(o.access)) arg.out = *v;
    args.push_back(arg);
  }
  return call_user_kernel(u.kernel, KernelLaunch{nullptr, args, launch.point, u.tag});
}

Result<void> apply_in_graph(const KernelLaunch& launch, const Op& op) {
  return std::visit(
      Overloaded{
          [&](const FillOp& f) -> Result<void> {
            auto dst = view_of(launch, f.dst.addr, f.dst.bytes, "fill dst");
            if (!dst.ok()) return std::move(dst).error();
            fill_with(f.pattern, f.seed, 0, *dst);
            return {};
          },
          [&](const ComputeOp& c) -> Result<void> {
            // Every input hashed before the output is written, as SimGpu::apply does.
            std::uint64_t mix = kMixStart;
            for (std::size_t k = 0; k < c.inputs.size(); ++k) {
              auto in = view_of(launch, c.inputs[k].addr, c.inputs[k].bytes, "compute input");
              if (!in.ok()) return std::move(in).error();
              mix = mix_step(mix, k, content_hash(*in));
            }
            auto out = view_of(launch, c.output.addr, c.output.bytes, "compute output");
            if (!out.ok()) return std::move(out).error();
            fill_with(c.pattern, mix, 0, *out);
            return {};
          },
          [&](const CopyOnDeviceOp& c) -> Result<void> {
            auto dst = view_of(launch, c.dst.addr, c.dst.bytes, "copy dst");
            if (!dst.ok()) return std::move(dst).error();
            auto src = view_of(launch, c.src_addr, c.dst.bytes, "copy src");
            if (!src.ok()) return std::move(src).error();
            if (!dst->empty()) std::memmove(dst->data(), src->data(), dst->size());
            return {};
          },
          [&](const UserOp& u) { return run_user_in_graph(launch, u); },
          [](const NopOp&) -> Result<void> { return {}; },
          [&](const auto&) -> Result<void> { return check_graphable(op); },  // refused at build
      },
      op);
}

}  // namespace

Result<NativeGraph> SimGpu::build_graph(StreamId stream, std::vector<Op> ops) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (Result<void> r = check_graphable(ops[i]); !r.ok()) {
      Error e = std::move(r).error();
      e.message = "end_graph on stream " + std::to_string(stream) + ", op " + std::to_string(i + 1) + ": " + e.message;
      return e;
    }
  }
  NativeGraph graph = graph_figures(ops);
  auto kept = std::make_shared<const std::vector<Op>>(std::move(ops));
  graph.launch = [kept](const KernelLaunch& launch) -> Result<void> {
    for (std::size_t i = 0; i < kept->size(); ++i) {
      if (Result<void> r = apply_in_graph(launch, (*kept)[i]); !r.ok()) {
        Error e = std::move(r).error();
        e.message = "graph op " + std::to_string(i + 1) + " of " + std::to_string(kept->size()) + " (" +
                    std::string(op_name((*kept)[i])) + "): " + e.message;
        return e;
      }
    }
    return {};
  };
  return graph;
}

}  // namespace ferry::sim
