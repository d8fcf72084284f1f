// ferry — the CUDA backend: ferry's Backend interface over CUDA streams, events and
// the driver's virtual memory management. One class, CudaBackend, declared here and
// defined by job: streams.cpp (streams, events, polls, waits), host_memory.cpp
// (pinned blocks, registered ranges, staged copies of pageable memory), issue.cpp
// (admission, and each Op turned into CUDA calls), setup.cpp (device discovery,
// construction, teardown, make_cuda_backend), peers.cpp (the link to another
// device, peer access opened for its copies).
//
// Streams. Stream s of the interface is a non-blocking CUDA stream (never the legacy
// default stream), created on first use, or a program's adopted stream, which is
// never destroyed or synchronized here (release adopted streams before destroying
// the backend). Exported events are the pooled events themselves, kept out of the
// pool until released. Every operation gets its ticket at enqueue;
// once it is issued to CUDA a pooled event is recorded behind it, and completed(s)
// polls those events in ticket order. Held streams, tickets and the op contract are
// the HoldingBackend layer's (holding_backend.hpp): this backend implements only the
// primitives — admit, issue, poll, wait, synchronize.
//
// Host memory the device does not own. Copies whose host side lies in a pinned
// block or a registered range of this backend go straight to cudaMemcpyAsync. Any
// other host pointer is pageable: cudaMemcpyAsync would block the caller on device
// work there, so the bytes travel through the stream's two pinned staging buffers.
// An upload's chunks are copied into them by a worker thread, each behind the DMA
// that last read its buffer, while a host function on the stream holds the DMA of
// the chunk until its copy is done (host_jobs.hpp); so chunk k's DMA overlaps chunk
// k + 1's copy. A download's chunks are copied out by host functions enqueued after
// their DMAs. Host functions also write a HashOp's result to a pageable pointer.
// Hence every host pointer in an operation has been read or written by the time
// its ticket completes.
//
// GEMMs. The core has no GEMM op: the GEMM is a user operation of the backends
// layer (ferry/gemm.hpp) whose kernel enqueues cublasGemmEx on the op's native
// stream (cublas_gemm.hpp). cuBLAS is loaded at run time by the first GEMM
// (cublas_api.hpp). Each native stream has its own cuBLAS handle, bound to it
// once, so GEMMs on different streams never share a workspace; the handle is made
// at the stream's first GEMM enqueue, in prepare_cublas (outside `mu_` and the
// hold layer's lock: creating one initializes the library), and destroyed with
// the stream, the release of an adopted stream, or the backend.
//
// Locks. `mu_` guards streams, events and scratch; under it we make only calls that
// enqueue without waiting for the device (kernel launches, cuBLAS GEMMs, copies from
// or to pinned memory, host-function launches, event record/query, stream waits,
// stream-ordered allocation; a user kernel's enqueues, cuBLAS GEMMs among them). A
// stream's first GEMM may stall briefly under it while cuBLAS loads its kernels; it
// cannot deadlock (host functions never take `mu_`).
// cuBLAS keeps a default workspace per handle, outside the pool's accounting.
// Everything that may block on the device (synchronizing, freeing pinned or device
// memory) runs with no lock of ours held. `host_mu_` (pinned and registered ranges,
// counters), `cublas_handles_mu_` (the handle of each native stream) and `peers_mu_`
// (the devices this one may read) are leaves:
// nothing is locked while one is held. Lock order: the hold layer's lock (held
// around issue), then `cublas_mu_`, then `mu_`.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cuda/address_space.hpp"
#include "cuda/cublas_api.hpp"
#include "cuda/cuda_error.hpp"
#include "cuda/device_scope.hpp"
#include "cuda/driver_api.hpp"
#include "cuda/host_jobs.hpp"
#include "ferry/backend.hpp"
#include "ferry/holding_backend.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry::cuda_detail {

inline void* device_ptr(std::uint64_t addr) {
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr));
}

// One stream-ordered batched host->device copy; cudaErrorNotSupported on runtimes
// before 12.8 (issue.cpp). The arrays are the runtime's, hence not const.
cudaError_t memcpy_batch_to_device(std::vector<void*>& dsts, std::vector<void*>& srcs,
                                   std::vector<std::size_t>& sizes, int device,
                                   cudaStream_t stream);

// A ComputeOp's device scratch, in words: its seed, one hash per input, the
// partial sums of the largest input. launch_compute enqueues its kernels on
// `stream` over that scratch (issue.cpp).
std::uint64_t compute_scratch_words(const ComputeOp& op);
cudaError_t launch_compute(const ComputeOp& op, std::uint64_t* scratch, cudaStream_t stream);

// A native graph (graphs.cpp): the CUDA graph of a stream's kept ops, its
// instantiation and the scratch of its computes.
struct CudaGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  void* scratch = nullptr;
  // The last launch of it on each stream. Written by its launch kernel, which
  // only run_user calls, under the backend's mu_; read under mu_.
  std::map<StreamId, Ticket> launched;
};

// Graphs whose last NativeGraph::launch copy is gone, freed once their launches
// have completed. Shared with the deleters of the graphs it receives, so a graph
// dropped after its backend still finds it. `mu` is a leaf.
struct RetiredGraphs {
  std::mutex mu;
  std::vector<CudaGraph*> graphs;
  void retire(CudaGraph* g) {
    std::lock_guard lock(mu);
    graphs.push_back(g);
  }
  // Destroys the graph, its instantiation and scratch. Blocks (cudaFree).
  static void destroy(CudaGraph* g) noexcept;
  ~RetiredGraphs();
};

class CudaBackend final : public HoldingBackend<Backend> {
 public:
  struct Setup {
    int device = 0;
    DeviceInfo info;
    std::unique_ptr<DriverApi> driver;  // null without VMM
    CUdevice cu_device = 0;
    bool memory_pools = false;
    bool register_read_only = false;
  };

  explicit CudaBackend(Setup setup);
  ~CudaBackend() override;

  // Allocates what every stream shares. Called once, before the backend is published.
  Result<void> init();

  const DeviceInfo& info() const noexcept override { return info_; }

  // --- Address space ------------------------------------------------------------
  Result<std::uint64_t> reserve_address(std::uint64_t bytes) override {
    const DeviceScope bound = bind();
    return space_.reserve(bytes);
  }
  Result<void> release_address(std::uint64_t base, std::uint64_t bytes) override {
    const DeviceScope bound = bind();
    return space_.release(base, bytes);
  }
  Result<void> map(std::uint64_t addr, std::uint64_t bytes) override {
    const DeviceScope bound = bind();
    return space_.map(addr, bytes);
  }
  Result<void> unmap(std::uint64_t addr, std::uint64_t bytes) override {
    const DeviceScope bound = bind();
    return space_.unmap(addr, bytes);
  }
  std::uint64_t mapped_bytes() const override { return space_.mapped_bytes(); }

  // --- Host memory (host_memory.cpp) -------------------------------------------
  Result<std::byte*> allocate_pinned(std::uint64_t bytes) override;
  Result<void> free_pinned(std::byte* ptr) override;
  Result<void> register_host(std::byte* ptr, std::uint64_t bytes) override;
  Result<void> unregister_host(std::byte* ptr) override;
  HostMemoryStats host_stats() const override;

  // --- cuBLAS handles for the GEMM user op (cublas_gemm.cpp, cublas_gemm.hpp) ---
  // Makes the handle of `native` (one of this backend's streams) unless it has
  // one. No lock held on entry: creating a handle initializes the library on the
  // device, far too slow to do under mu_. Errors: unsupported (no cuBLAS),
  // invalid_argument (not our stream), backend_error.
  Result<void> prepare_cublas(cudaStream_t native);
  // The handle bound to `native`, or null. Takes only cublas_handles_mu_, so a user
  // kernel may call it under mu_.
  cublasHandle_t cublas_handle(cudaStream_t native) const;

  // --- Peers (peers.cpp) ---------------------------------------------------------
  // The link to `peer` (another CudaBackend) by the driver's rule (peers.cpp);
  // where there is one, opens this device's access to the peer's memory
  // (cudaDeviceEnablePeerAccess here, the peer's granules granted to this device).
  // Errors: invalid_argument (not another CUDA device), backend_error.
  Result<std::optional<PeerLink>> connect_peer(Backend& peer) override;

  FaultCounters fault_counters() const override {
    FaultCounters f;
    f.batch_fallbacks = batch_fallbacks_.load(std::memory_order_relaxed);
    return f;
  }

  std::uint64_t now_ns() const override {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }

 protected:
  // --- HoldQueues::Device: the primitives under the hold layer ------------------
  // admit and issue: issue.cpp; the rest: streams.cpp.
  Result<void> admit(StreamId stream, const Op& op) override;
  Result<Ticket> issue(StreamId stream, Op op) override;
  Ticket issued_completed(StreamId stream) override;
  Result<void> wait_issued(StreamPoint point, std::chrono::nanoseconds timeout) override;
  Result<void> synchronize_issued() override;
  // Native streams and events: streams.cpp.
  Result<NativeStream> native_of(StreamId stream) override;
  Result<void> bind_stream(StreamId stream, NativeStream native) override;
  Result<void> unbind_stream(StreamId stream) override;
  Result<NativeEvent> export_issued(StreamPoint point) override;
  Result<void> release_export(NativeEvent event) override;
  // Native graphs: graphs.cpp. Captures `ops` on a private stream (thread-local
  // capture mode, so other threads' CUDA calls are untouched) into a CUDA graph,
  // instantiated once.
  Result<NativeGraph> build_graph(StreamId stream, std::vector<Op> ops) override;

 private:
  struct Inflight {
    Ticket ticket;
    cudaEvent_t event;
  };
  struct Stream {
    cudaStream_t handle = nullptr;
    Ticket submitted = 0;  // last ticket issued
    Ticket completed = 0;  // last ticket whose event has been seen complete
    std::deque<Inflight> inflight;  // issued, in ticket order
    void* scratch = nullptr;        // device scratch of the hash kernels, stream-ordered
    std::uint64_t scratch_bytes = 0;
    std::array<std::byte*, 2> staging{};  // pinned, for pageable host memory
    unsigned next_staging = 0;
    HostJobs::Lane lane;  // uses of `staging`, for host_jobs_'s worker
    bool adopted = false;   // `handle` is the program's: never destroyed or synchronized here
    StreamFault fault;      // a user kernel that failed (user_kernel.hpp)
  };

  // Makes the device current on the calling thread (and its primary context, which
  // the driver calls need) until the scope ends, then the caller's again.
  [[nodiscard]] DeviceScope bind() const { return DeviceScope(device_); }

  Result<void> check(cudaError_t err, const std::string& what) const {
    if (err == cudaSuccess) return {};
    return cuda_error(err, what);
  }

  // --- Admission (issue.cpp): what this device refuses beyond the op contract
  // (check_op has already passed): ranges that are not mapped, a peer copy from
  // a device connect_peer did not open.
  Result<void> validate(const Op& op) const;
  // peers.cpp. The peer copy's source: another CudaBackend whose memory this
  // device may read, with [src_addr, +bytes) mapped there; invalid_argument or
  // unsupported naming what is wrong otherwise.
  Result<void> check_peer_source(const PeerCopyOp& op) const;

  // host_mu_ held. Whether [p, p + bytes) overlaps a registered range.
  bool overlaps_registered(const std::byte* p, std::uint64_t bytes) const;
  // Takes host_mu_ (a leaf, so callers may hold mu_). Whether [p, p + bytes) lies
  // inside one pinned block or registered range.
  bool host_pinned(const void* p, std::uint64_t bytes) const;

  // graphs.cpp, no lock held. Enqueues `op`'s work on the capturing stream `capture`.
  Result<void> capture_op(StreamId s, cudaStream_t capture, const Op& op, std::uint64_t* scratch);
  // Takes mu_. The retired graphs whose every launch has completed, taken out of
  // retired_graphs_ for the caller to destroy with no lock held.
  std::vector<CudaGraph*> finished_graphs();

  // --- Everything below runs with mu_ held.

  // streams.cpp
  Result<void> ensure_stream(Stream& st, StreamId s);
  // Records the completion event of `ticket` behind the work just issued.
  Result<void> record(StreamId s, Stream& st, Ticket ticket);
  // Retires completed events in ticket order. Never blocks. An exported event
  // stays out of the pool until release_event.
  void poll(Stream& st);
  // Frees what is bound to st.handle (scratch in stream order, its cuBLAS
  // handle) before the handle changes hands.
  void detach_resources(Stream& st);

  // host_memory.cpp
  // Enqueues a memcpy of host memory on `stream`, run by the driver in stream order
  // (cudaLaunchHostFunc) when the device reaches it; the job is host_jobs_'s.
  cudaError_t launch_host_copy(cudaStream_t stream, void* dst, const void* src, std::size_t bytes);
  Result<std::byte*> staging_buffer(Stream& st, StreamId s);
  Result<void> copy_to_device(StreamId s, Stream& st, std::uint64_t dst, const std::byte* src,
                              std::uint64_t bytes);
  Result<void> copy_to_host(StreamId s, Stream& st, std::byte* dst, std::uint64_t src,
                            std::uint64_t bytes);

  // issue.cpp
  // Device scratch of at least `bytes`, reused by every operation of the stream
  // (stream order keeps them apart). Growing frees the old buffer in stream order.
  Result<std::uint64_t*> scratch(Stream& st, std::uint64_t bytes);
  Result<void> batch_to_device(StreamId s, Stream& st, const BatchCopyToDeviceOp& op);
  Result<void> hash(StreamId s, Stream& st, const HashOp& op);
  Result<void> compute(Stream& st, const ComputeOp& op);
  Result<void> wait_on(StreamId s, Stream& st, const WaitOp& op);
  // Calls the program's kernel with the native stream; its failure becomes the
  // stream's fault, not the issue's (the ticket still completes).
  void run_user(StreamId s, Stream& st, const UserOp& op, Ticket ticket);
  Result<void> issue_op(StreamId s, Stream& st, Op& op, Ticket ticket);

  const int device_;
  const DeviceInfo info_;
  const std::unique_ptr<DriverApi> driver_;
  CudaAddressSpace space_;
  const bool memory_pools_;
  const bool register_read_only_;

  // Taken before mu_, never inside it: one thread at a time makes a stream's cuBLAS
  // handle, so no second handle is ever made and destroyed (which would synchronize
  // the device inside enqueue).
  std::mutex cublas_mu_;
  // A leaf. Inserted under mu_ too (prepare_cublas), erased under mu_
  // (detach_resources), read by user kernels under mu_ or by anyone.
  mutable std::mutex cublas_handles_mu_;
  std::map<cudaStream_t, cublasHandle_t> cublas_handles_;
  // Handles whose stream was released or replaced: cublasDestroy synchronizes the
  // device, so they wait for the destructor rather than run under our locks.
  std::vector<cublasHandle_t> retired_cublas_;  // guarded by cublas_handles_mu_
  mutable std::mutex mu_;
  std::array<Stream, kMaxStreams> streams_;
  std::vector<cudaEvent_t> free_events_;
  std::map<cudaEvent_t, unsigned> exported_;  // export_event's, with their export counts
  std::vector<void*> retired_scratch_;
  std::uint64_t* result_slots_ = nullptr;  // pinned, one per stream
  std::optional<Error> fault_;             // a sticky device fault
  std::atomic<std::uint64_t> batch_fallbacks_{0};

  // Declared before the streams' teardown needs it, freed after (the destructor).
  HostJobs host_jobs_;
  // Freed by synchronize_issued (no lock held: freeing may block) and the destructor.
  const std::shared_ptr<RetiredGraphs> retired_graphs_ = std::make_shared<RetiredGraphs>();

  // A leaf. The devices (ordinals) whose memory this one may read: connect_peer opened them.
  mutable std::mutex peers_mu_;
  std::set<int> peers_;

  mutable std::mutex host_mu_;
  std::map<std::byte*, std::uint64_t> pinned_;      // allocate_pinned blocks
  std::map<std::byte*, std::uint64_t> registered_;  // register_host ranges
  HostMemoryStats stats_;
};

}  // namespace ferry::cuda_detail
