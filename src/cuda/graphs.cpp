// ferry — the CUDA backend's native graphs (DeviceInfo::native_graphs): the ops the
// hold layer kept for a graph (Backend::begin_graph / end_graph) captured on a
// private stream into a CUDA graph and instantiated once; a launch is one
// cudaGraphLaunch, made by the graph's user kernel on the native stream of the
// op that replays it. A graph's instantiation and scratch are freed once the last
// copy of its launch kernel is gone and every launch of it has completed.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/cuda_error.hpp"
#include "cuda/kernels.hpp"
#include "ferry/op_contract.hpp"

namespace ferry::cuda_detail {
namespace {

// Destroys a graph that was never handed out (a failed build).
struct DestroyNow {
  void operator()(CudaGraph* g) const noexcept { RetiredGraphs::destroy(g); }
};

}  // namespace

void RetiredGraphs::destroy(CudaGraph* g) noexcept {
  if (g == nullptr) return;
  if (g->exec != nullptr) (void)cudaGraphExecDestroy(g->exec);
  if (g->graph != nullptr) (void)cudaGraphDestroy(g->graph);
  if (g->scratch != nullptr) (void)cudaFree(g->scratch);
  (void)cudaGetLastError();
  delete g;
}

RetiredGraphs::~RetiredGraphs() {
  for (CudaGraph* g : graphs) destroy(g);
}

Result<void> CudaBackend::capture_op(StreamId s, cudaStream_t capture, const Op& op, std::uint64_t* scratch) {
  return std::visit(
      Overloaded{
          [&](const FillOp& o) {
            return check(launch_fill(device_ptr(o.dst.addr), o.dst.bytes, o.pattern, o.seed, nullptr, capture),
                         "launching the fill kernel");
          },
          [&](const ComputeOp& o) { return check(launch_compute(o, scratch, capture), "launching the compute kernels"); },
          [&](const CopyOnDeviceOp& o) -> Result<void> {
            if (o.dst.bytes == 0 || o.dst.addr == o.src_addr) return {};
            return check(cudaMemcpyAsync(device_ptr(o.dst.addr), device_ptr(o.src_addr), o.dst.bytes,
                                         cudaMemcpyDeviceToDevice, capture),
                         "cudaMemcpyAsync device->device");
          },
          [&](const UserOp& o) -> Result<void> {
            // The program's kernel launches on the stream it is given: here the
            // capturing one, so its launches become the graph's nodes. Ticket 0:
            // this is no point of `s`.
            std::vector<KernelArg> args;
            args.reserve(o.operands.size());
            for (const UserOperand& u : o.operands) args.push_back(KernelArg{u.range.addr, u.range.bytes, u.access, {}, {}});
            return call_user_kernel(o.kernel, KernelLaunch{capture, args, {s, 0}, o.tag});
          },
          [](const NopOp&) -> Result<void> { return {}; },
          [&](const auto&) -> Result<void> { return check_graphable(op); },  // refused before the capture
      },
      op);
}

Result<NativeGraph> CudaBackend::build_graph(StreamId stream, std::vector<Op> ops) {
  const std::string where = "end_graph on stream " + std::to_string(stream);
  std::uint64_t scratch_words = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (Result<void> r = check_graphable(ops[i]); !r.ok()) {
      Error e = std::move(r).error();
      e.message = where + ", op " + std::to_string(i + 1) + ": " + e.message;
      return e;
    }
    if (const auto* c = std::get_if<ComputeOp>(&ops[i])) scratch_words = std::max(scratch_words, compute_scratch_words(*c));
  }
  const DeviceScope bound = bind();
  {
    std::lock_guard lock(mu_);
    if (fault_) return *fault_;
  }
  std::unique_ptr<CudaGraph, DestroyNow> g(new CudaGraph);
  // The graph's own scratch: a stream's grows and moves, and the graph keeps the
  // address it was captured with.
  if (scratch_words > 0) FERRY_TRY(check(cudaMalloc(&g->scratch, 8 * scratch_words), where + ": graph scratch"));
  cudaStream_t capture = nullptr;
  FERRY_TRY(check(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), where + ": the capture stream"));
  // Thread-local: only this thread's unsafe calls (a program's kernel that
  // synchronizes or allocates) invalidate the capture; other threads go on.
  Result<void> captured = check(cudaStreamBeginCapture(capture, cudaStreamCaptureModeThreadLocal),
                                where + ": cudaStreamBeginCapture");
  const bool begun = captured.ok();
  for (std::size_t i = 0; captured.ok() && i < ops.size(); ++i) {
    captured = capture_op(stream, capture, ops[i], static_cast<std::uint64_t*>(g->scratch));
    if (!captured.ok()) {
      Error e = std::move(captured).error();
      e.message = where + ", op " + std::to_string(i + 1) + " (" + std::string(op_name(ops[i])) + "): " + e.message;
      captured = std::move(e);
    }
  }
  if (begun) {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(capture, &graph);
    g->graph = graph;
    if (captured.ok() && ended != cudaSuccess) {
      captured = cuda_error(ended, where + ": cudaStreamEndCapture (work the capture could not hold)");
    }
  }
  (void)cudaStreamDestroy(capture);  // nothing ran on it: a capture only records
  if (!captured.ok()) return std::move(captured).error();
  FERRY_TRY(check(cudaGraphInstantiateWithFlags(&g->exec, g->graph, 0), where + ": cudaGraphInstantiate"));

  NativeGraph out = graph_figures(ops);
  std::shared_ptr<CudaGraph> shared(g.release(), [retired = retired_graphs_](CudaGraph* p) { retired->retire(p); });
  out.launch = [shared](const KernelLaunch& launch) -> Result<void> {
    // Only run_user calls it, under mu_, which guards `launched`. Each launch
    // is ordered after the stream's work and after the graph's previous launch.
    shared->launched[launch.point.stream] = launch.point.ticket;
    const cudaError_t err = cudaGraphLaunch(shared->exec, static_cast<cudaStream_t>(launch.stream));
    if (err != cudaSuccess) return cuda_error(err, "cudaGraphLaunch");
    return {};
  };
  return out;
}

std::vector<CudaGraph*> CudaBackend::finished_graphs() {
  std::vector<CudaGraph*> done;
  std::lock_guard lock(mu_);
  std::lock_guard retired_lock(retired_graphs_->mu);  // a leaf: mu_, then it
  std::erase_if(retired_graphs_->graphs, [&](CudaGraph* g) {
    for (const auto& [s, ticket] : g->launched) {
      poll(streams_[s]);
      if (streams_[s].completed < ticket) return false;
    }
    done.push_back(g);
    return true;
  });
  return done;
}

}  // namespace ferry::cuda_detail
