// ferry — the CUDA backend: ferry's Backend interface over CUDA streams, events and
// the driver's virtual memory management.
//
// Streams. Stream s of the interface is a non-blocking CUDA stream (never the legacy
// default stream), created on first use. Every operation gets its ticket at enqueue;
// once it is issued to CUDA a pooled event is recorded behind it, and completed(s)
// polls those events in ticket order. Held streams, tickets and the op contract are
// the HoldingBackend layer's (holding_backend.hpp): this file implements only the
// primitives — admit, issue, poll, wait, synchronize.
//
// Host memory the device does not own. Copies whose host side lies in a pinned
// block or a registered range of this backend go straight to cudaMemcpyAsync. Any
// other host pointer is pageable: cudaMemcpyAsync would block the caller on device
// work there, so the bytes travel through the stream's two pinned staging buffers
// and host functions enqueued on the stream copy them between the staging buffer
// and the caller's memory, in stream order, when the device reaches them. The same
// mechanism writes a HashOp's result to a pageable pointer. Hence every host pointer
// in an operation has been read or written by the time its ticket completes.
//
// GEMMs. A GemmOp runs on cuBLAS, loaded at run time by the first GemmOp
// (cublas_api.hpp). Each stream has its own cuBLAS handle, bound to that stream
// once, so GEMMs on different streams never share a workspace; the handle is made
// at the stream's first GemmOp enqueue (outside `mu_`: creating one initializes the
// library) and destroyed before the stream.
//
// Locks. `mu_` guards streams, events and scratch; under it we make only calls that
// enqueue without waiting for the device (kernel launches, cuBLAS GEMMs, copies from
// or to pinned memory, host-function launches, event record/query, stream waits,
// stream-ordered allocation). A stream's first GEMM may stall briefly under it while
// cuBLAS loads its kernels; it cannot deadlock (host functions never take `mu_`).
// cuBLAS keeps a default workspace per handle, outside the pool's accounting. Everything that may block on the device
// (synchronizing, freeing pinned or device memory) runs with no lock of ours held.
// `host_mu_` (pinned and registered ranges, counters) is a leaf: nothing is locked
// while it is held.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/address_space.hpp"
#include "cuda/cublas_api.hpp"
#include "cuda/cuda_error.hpp"
#include "cuda/driver_api.hpp"
#include "cuda/kernels.hpp"
#include "ferry/content.hpp"
#include "core/text.hpp"
#include "ferry/cuda_backend.hpp"
#include "ferry/gemm.hpp"
#include "ferry/holding_backend.hpp"
#include "ferry/op_contract.hpp"

namespace ferry {
namespace cuda_detail {
namespace {

constexpr std::uint64_t kFallbackGranularity = 2ull << 20;  // without VMM: the usual large page
constexpr std::uint64_t kStagingBytes = 4ull << 20;         // per buffer, two per stream
constexpr std::uint64_t kMinScratchBytes = 64ull << 10;

void* device_ptr(std::uint64_t addr) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)); }

std::string ticket_name(StreamId s, Ticket t) { return text::point({s, t}); }

// A host-side copy run by the driver in stream order (cudaLaunchHostFunc). It must
// not call CUDA; it frees itself.
struct HostCopy {
  void* dst;
  const void* src;
  std::size_t bytes;
};
void CUDART_CB run_host_copy(void* data) {
  auto* job = static_cast<HostCopy*>(data);
  std::memcpy(job->dst, job->src, job->bytes);
  delete job;
}

cudaError_t launch_host_copy(cudaStream_t stream, void* dst, const void* src, std::size_t bytes) {
  auto* job = new HostCopy{dst, src, bytes};
  const cudaError_t err = cudaLaunchHostFunc(stream, run_host_copy, job);
  if (err != cudaSuccess) delete job;
  return err;
}

// One stream-ordered batched host->device copy. The runtime's signature changed:
// 12.8 and 12.9 take a trailing failIdx and non-const arrays, 13.0 drops failIdx.
cudaError_t memcpy_batch_to_device(std::vector<void*>& dsts, std::vector<void*>& srcs,
                                   std::vector<std::size_t>& sizes, int device,
                                   cudaStream_t stream) {
#if CUDART_VERSION >= 12080
  // A zeroed attribute struct is rejected: the source order must be named.
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.srcLocHint.type = cudaMemLocationTypeHost;
  attr.srcLocHint.id = 0;
  attr.dstLocHint.type = cudaMemLocationTypeDevice;
  attr.dstLocHint.id = device;
  attr.flags = cudaMemcpyFlagDefault;
  // numAttrs is 1, so one index is read; the array is as long as the batch because
  // some drivers have been seen reading one index per copy.
  std::vector<std::size_t> attr_index(dsts.size(), 0);
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr,
                              attr_index.data(), 1, stream);
#else
  std::size_t fail_index = std::numeric_limits<std::size_t>::max();
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr,
                              attr_index.data(), 1, &fail_index, stream);
#endif
#else
  (void)dsts;
  (void)srcs;
  (void)sizes;
  (void)device;
  (void)stream;
  return cudaErrorNotSupported;
#endif
}

// The start-up probe of the batched path: two small batches in a row (some drivers
// honour only the first batch of a process), each verified byte by byte.
bool probe_batched_copy(int device, std::string& note) {
#if CUDART_VERSION < 12080
  (void)device;
  note = "this CUDA runtime has no cudaMemcpyBatchAsync";
  return false;
#else
  constexpr std::size_t kPieces = 4;
  constexpr std::size_t kPiece = 4096 + 8;  // not a power of two on purpose
  constexpr std::size_t kBytes = kPieces * kPiece;
  cudaStream_t stream = nullptr;
  void* dev = nullptr;
  void* host = nullptr;  // pinned: [0, kBytes) source, [kBytes, 2 kBytes) read-back
  bool ok = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMalloc(&dev, kBytes) == cudaSuccess &&
            cudaHostAlloc(&host, 2 * kBytes, cudaHostAllocPortable) == cudaSuccess;
  if (!ok) note = "probe set-up failed: " + describe(cudaGetLastError());
  auto* src = static_cast<std::byte*>(host);
  for (int round = 0; ok && round < 2; ++round) {
    fill_pattern(0xba7c4ull + static_cast<std::uint64_t>(round), 0, {src, kBytes});
    std::memset(src + kBytes, 0, kBytes);
    std::vector<void*> dsts;
    std::vector<void*> srcs;
    std::vector<std::size_t> sizes;
    for (std::size_t i = 0; i < kPieces; ++i) {  // in reverse: order inside a batch is free
      const std::size_t piece = kPieces - 1 - i;
      dsts.push_back(static_cast<std::byte*>(dev) + piece * kPiece);
      srcs.push_back(src + piece * kPiece);
      sizes.push_back(kPiece);
    }
    cudaError_t err = cudaMemsetAsync(dev, 0, kBytes, stream);
    if (err == cudaSuccess) err = memcpy_batch_to_device(dsts, srcs, sizes, device, stream);
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(src + kBytes, dev, kBytes, cudaMemcpyDeviceToHost, stream);
    }
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      note = "batch " + std::to_string(round + 1) + " failed: " + describe(err);
      ok = false;
    } else if (std::memcmp(src, src + kBytes, kBytes) != 0) {
      note = "batch " + std::to_string(round + 1) + " returned success but did not copy";
      ok = false;
    }
  }
  if (ok) note = "two verified batches";
  if (stream != nullptr) (void)cudaStreamSynchronize(stream);
  if (host != nullptr) (void)cudaFreeHost(host);
  if (dev != nullptr) (void)cudaFree(dev);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  (void)cudaGetLastError();
  return ok;
#endif
}

int device_attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

// Nominal dense bf16 tensor FLOPs per SM per clock, by architecture (fp16 before bf16
// existed). Estimates for DeviceInfo, not measurements.
double flops_per_sm_clock(int major, int minor) {
  if (major >= 10) return 8192;
  if (major == 9) return 4096;
  if (major == 8) return minor == 0 ? 2048 : 512;
  if (major == 7) return 1024;
  return 256;
}

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

  explicit CudaBackend(Setup setup)
      : device_(setup.device),
        info_(std::move(setup.info)),
        driver_(std::move(setup.driver)),
        space_(driver_.get(), setup.cu_device, setup.device, info_.granularity),
        memory_pools_(setup.memory_pools),
        register_read_only_(setup.register_read_only) {
    start_queues();
  }

  // No other thread may use a backend that is being destroyed, so no lock is taken.
  ~CudaBackend() override {
    bind();
    (void)synchronize();
    for (Stream& st : streams_) {
      if (st.cublas != nullptr) {
        std::string unused;  // a handle exists, so cuBLAS is loaded: no load happens here
        if (const CublasApi* cublas = cublas_api(unused)) (void)cublas->destroy(st.cublas);
      }
      if (st.handle == nullptr) continue;
      if (st.scratch != nullptr) {
        if (memory_pools_) (void)cudaFreeAsync(st.scratch, st.handle);
        else (void)cudaFree(st.scratch);
      }
      (void)cudaStreamSynchronize(st.handle);
      (void)cudaStreamDestroy(st.handle);
      for (std::byte* b : st.staging) {
        if (b != nullptr) (void)cudaFreeHost(b);
      }
    }
    for (void* p : retired_scratch_) (void)cudaFree(p);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
    if (result_slots_ != nullptr) (void)cudaFreeHost(result_slots_);
    for (auto& [ptr, bytes] : registered_) (void)cudaHostUnregister(ptr);
    for (auto& [ptr, bytes] : pinned_) (void)cudaFreeHost(ptr);
    (void)cudaGetLastError();
  }

  // Allocates what every stream shares. Called once, before the backend is published.
  Result<void> init() {
    const cudaError_t err = cudaHostAlloc(reinterpret_cast<void**>(&result_slots_),
                                          kMaxStreams * sizeof(std::uint64_t),
                                          cudaHostAllocPortable);
    if (err != cudaSuccess) return cuda_error(err, "cudaHostAlloc of the result slots");
    return {};
  }

  const DeviceInfo& info() const noexcept override { return info_; }

  // --- Address space ------------------------------------------------------------
  Result<std::uint64_t> reserve_address(std::uint64_t bytes) override {
    bind();
    return space_.reserve(bytes);
  }
  Result<void> release_address(std::uint64_t base, std::uint64_t bytes) override {
    bind();
    return space_.release(base, bytes);
  }
  Result<void> map(std::uint64_t addr, std::uint64_t bytes) override {
    bind();
    return space_.map(addr, bytes);
  }
  Result<void> unmap(std::uint64_t addr, std::uint64_t bytes) override {
    bind();
    return space_.unmap(addr, bytes);
  }
  std::uint64_t mapped_bytes() const override { return space_.mapped_bytes(); }

  // --- Host memory -----------------------------------------------------------------
  Result<std::byte*> allocate_pinned(std::uint64_t bytes) override {
    if (bytes == 0) return make_error(ErrorCode::invalid_argument, "allocate_pinned of 0 bytes");
    bind();
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      return cuda_error(err, "cudaHostAlloc of " + std::to_string(bytes) + " bytes");
    }
    std::lock_guard lock(host_mu_);
    pinned_.emplace(static_cast<std::byte*>(p), bytes);
    ++stats_.pinned_allocs;
    stats_.pinned_bytes += bytes;
    return static_cast<std::byte*>(p);
  }

  Result<void> free_pinned(std::byte* ptr) override {
    {
      std::lock_guard lock(host_mu_);
      auto it = pinned_.find(ptr);
      if (it == pinned_.end()) {
        return make_error(ErrorCode::invalid_argument,
                          "free_pinned: not a live pinned allocation of this backend "
                          "(double free, or a pointer into a block rather than its start)");
      }
      stats_.pinned_bytes -= it->second;
      ++stats_.pinned_frees;
      pinned_.erase(it);
    }
    bind();
    const cudaError_t err = cudaFreeHost(ptr);  // may synchronize: no lock held
    if (err != cudaSuccess) return cuda_error(err, "cudaFreeHost");
    return {};
  }

  Result<void> register_host(std::byte* ptr, std::uint64_t bytes) override {
    if (ptr == nullptr || bytes == 0) {
      return make_error(ErrorCode::invalid_argument, "register_host of a null or empty range");
    }
    if (reinterpret_cast<std::uintptr_t>(ptr) > std::numeric_limits<std::uintptr_t>::max() - bytes) {
      return make_error(ErrorCode::invalid_argument, "register_host: the range overflows");
    }
    {
      std::lock_guard lock(host_mu_);
      if (overlaps_registered(ptr, bytes)) {
        return make_error(ErrorCode::invalid_argument,
                          "register_host: the range overlaps one already registered");
      }
    }
    bind();
    // The copies take the host address, which the runtime translates; no kernel of
    // ferry reads host memory, so the range's device alias (cudaHostGetDevicePointer,
    // which can differ from the host address) is never needed.
    cudaError_t err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess && register_read_only_) {
      (void)cudaGetLastError();  // a read-only mapping (an mmap'd weight file) needs the flag
      err = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    }
    if (err != cudaSuccess) {
      Error e = cuda_error(err, "cudaHostRegister of " + std::to_string(bytes) + " bytes");
      if (err == cudaErrorHostMemoryAlreadyRegistered) e.code = ErrorCode::invalid_argument;
      return e;
    }
    std::lock_guard lock(host_mu_);
    registered_.emplace(ptr, bytes);
    ++stats_.registrations;
    return {};
  }

  Result<void> unregister_host(std::byte* ptr) override {
    {
      std::lock_guard lock(host_mu_);
      if (registered_.erase(ptr) == 0) {
        return make_error(ErrorCode::invalid_argument,
                          "unregister_host: not the start of a range registered with this backend");
      }
      ++stats_.unregistrations;
    }
    bind();
    const cudaError_t err = cudaHostUnregister(ptr);
    if (err != cudaSuccess) return cuda_error(err, "cudaHostUnregister");
    return {};
  }

  HostMemoryStats host_stats() const override {
    std::lock_guard lock(host_mu_);
    return stats_;
  }

  std::uint64_t now_ns() const override {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }

 protected:
  // --- HoldQueues::Device: the primitives under the hold layer ------------------
  Result<void> admit(StreamId stream, const Op& op) override {
    FERRY_TRY(validate(op));
    bind();
    // Before the ticket: a held GemmOp is issued later, under the lock, where the
    // handle must already exist.
    if (std::holds_alternative<GemmOp>(op)) FERRY_TRY(ensure_cublas(stream));
    std::lock_guard lock(mu_);
    if (fault_) return *fault_;
    return ensure_stream(streams_[stream], stream);
  }

  Result<Ticket> issue(StreamId stream, Op op) override {
    bind();
    std::unique_lock lock(mu_);
    if (fault_) return *fault_;
    Stream& st = streams_[stream];
    FERRY_TRY(ensure_stream(st, stream));
    const Ticket ticket = st.submitted + 1;
    // On failure the ticket is not handed out.
    auto issued = issue_op(stream, st, op, ticket);
    if (!issued.ok()) {
      // Part of the operation may be on the stream already (a host function among
      // it): drain it before reporting, so nothing touches the caller's memory after
      // the error is returned. The wait holds no lock.
      cudaEvent_t drained = nullptr;
      if (cudaEventCreateWithFlags(&drained, cudaEventDisableTiming) == cudaSuccess) {
        if (cudaEventRecord(drained, st.handle) == cudaSuccess) {
          lock.unlock();
          (void)cudaEventSynchronize(drained);
        }
        (void)cudaEventDestroy(drained);
      }
      (void)cudaGetLastError();
      return std::move(issued).error();
    }
    FERRY_TRY(record(stream, st, ticket));
    st.submitted = ticket;
    return ticket;
  }

  Ticket issued_completed(StreamId stream) override {
    if (stream >= kMaxStreams) return 0;
    std::lock_guard lock(mu_);
    poll(streams_[stream]);
    return streams_[stream].completed;
  }

  Result<void> wait_issued(StreamPoint point, std::chrono::nanoseconds timeout) override {
    bind();
    const auto start = std::chrono::steady_clock::now();
    const auto budget = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::min(timeout, std::chrono::nanoseconds(std::chrono::hours(24 * 365))));
    // Poll with backoff; no lock is held while sleeping.
    for (unsigned round = 0;; ++round) {
      {
        std::lock_guard lock(mu_);
        Stream& st = streams_[point.stream];
        poll(st);
        if (st.completed >= point.ticket) return {};
        if (fault_) return *fault_;
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= budget) {
        return make_error(ErrorCode::timeout,
                          "wait for " + ticket_name(point.stream, point.ticket) + " timed out after " +
                              std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                                                 waited).count()) + " us");
      }
      if (round < 64) {
        std::this_thread::yield();
      } else {
        const auto nap = std::chrono::microseconds(std::min(200u, 1u << std::min(round - 64u, 8u)));
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(nap, budget - waited));
      }
    }
  }

  Result<void> synchronize_issued() override {
    bind();
    std::array<Ticket, kMaxStreams> last{};
    {
      std::lock_guard lock(mu_);
      for (StreamId s = 0; s < kMaxStreams; ++s) last[s] = streams_[s].submitted;
    }
    Result<void> first;
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      if (last[s] == 0) continue;
      auto r = wait_issued(StreamPoint{s, last[s]}, std::chrono::nanoseconds::max());
      if (!r.ok() && first.ok()) first = std::move(r);
    }
    return first;
  }

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
    cublasHandle_t cublas = nullptr;  // bound to `handle`; made by the first GemmOp
  };


  // Makes the device current on the calling thread (and its primary context, which
  // the driver calls need).
  void bind() const { (void)cudaSetDevice(device_); }

  // --- Admission: what this device refuses beyond the op contract (check_op has
  // already passed): ranges that are not mapped, GEMMs cuBLAS cannot run here.
  Result<void> validate(const Op& op) const {
    return std::visit(
        Overloaded{
            [&](const FillOp& o) { return space_.check_mapped(o.dst.addr, o.dst.bytes, "FillOp"); },
            [&](const CopyToDeviceOp& o) {
              return space_.check_mapped(o.dst.addr, o.dst.bytes, "CopyToDeviceOp destination");
            },
            [&](const CopyToHostOp& o) {
              return space_.check_mapped(o.src.addr, o.src.bytes, "CopyToHostOp source");
            },
            [&](const CopyOnDeviceOp& o) -> Result<void> {
              FERRY_TRY(space_.check_mapped(o.dst.addr, o.dst.bytes, "CopyOnDeviceOp destination"));
              return space_.check_mapped(o.src_addr, o.dst.bytes, "CopyOnDeviceOp source");
            },
            [&](const BatchCopyToDeviceOp& o) -> Result<void> {
              for (const CopyToDeviceOp& c : o.copies) {
                FERRY_TRY(space_.check_mapped(c.dst.addr, c.dst.bytes, "BatchCopyToDeviceOp destination"));
              }
              return {};
            },
            [&](const ComputeOp& o) -> Result<void> {
              for (const DeviceRange& in : o.inputs) {
                FERRY_TRY(space_.check_mapped(in.addr, in.bytes, "ComputeOp input"));
              }
              return space_.check_mapped(o.output.addr, o.output.bytes, "ComputeOp output");
            },
            [&](const GemmOp& o) { return validate_gemm(o); },
            [&](const HashOp& o) { return space_.check_mapped(o.src.addr, o.src.bytes, "HashOp source"); },
            [&](const WaitOp&) -> Result<void> { return {}; },
            [&](const NopOp&) -> Result<void> { return {}; },
        },
        op);
  }

  Result<void> validate_gemm(const GemmOp& o) const {
    const GemmShape& g = o.shape;
    // cublasGemmEx takes int dimensions (check_gemm already bounds k).
    constexpr std::uint32_t kMaxDim = std::numeric_limits<int>::max();
    if (g.m > kMaxDim || g.n > kMaxDim) {
      return make_error(ErrorCode::unsupported,
                        "GemmOp " + g.text() + ": m and n must be below 2^31 on cuda");
    }
    FERRY_TRY(space_.check_mapped(o.a.addr, o.a.bytes, "GemmOp a"));
    FERRY_TRY(space_.check_mapped(o.b.addr, o.b.bytes, "GemmOp b"));
    FERRY_TRY(space_.check_mapped(o.c.addr, o.c.bytes, "GemmOp c"));
    std::string why;
    if (cublas_api(why) == nullptr) {
      return make_error(ErrorCode::unsupported, "GemmOp " + g.text() + ": " + why);
    }
    return {};
  }

  // Gives stream s its cuBLAS handle if it has none. No lock held on entry: creating
  // a handle initializes the library on the device, far too slow to do under mu_.
  Result<void> ensure_cublas(StreamId s) {
    {
      std::lock_guard lock(mu_);
      if (fault_) return *fault_;
      if (streams_[s].cublas != nullptr) return {};
    }
    std::lock_guard making(cublas_mu_);
    {
      std::lock_guard lock(mu_);
      if (streams_[s].cublas != nullptr) return {};  // another thread made it meanwhile
    }
    std::string why;
    const CublasApi* cublas = cublas_api(why);
    if (cublas == nullptr) return make_error(ErrorCode::unsupported, "GemmOp: " + why);
    cublasHandle_t handle = nullptr;
    cublasStatus_t status = cublas->create(&handle);
    if (status != CUBLAS_STATUS_SUCCESS) {
      return make_error(ErrorCode::backend_error, "cublasCreate for stream " + std::to_string(s) +
                                                      " failed: " + cublas->describe(status));
    }
    // Partial sums stay FP32 even when cuBLAS splits k: the result is rounded to
    // bf16 once, as gemm.hpp defines it.
    status = cublas->set_math_mode(handle, static_cast<cublasMath_t>(
                                               CUBLAS_DEFAULT_MATH |
                                               CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    Result<void> result;
    if (status != CUBLAS_STATUS_SUCCESS) {
      result = make_error(ErrorCode::backend_error,
                          "cublasSetMathMode failed: " + cublas->describe(status));
    } else {
      std::lock_guard lock(mu_);
      Stream& st = streams_[s];
      result = ensure_stream(st, s);
      if (result.ok()) {
        status = cublas->set_stream(handle, st.handle);
        if (status == CUBLAS_STATUS_SUCCESS) {
          st.cublas = handle;
          handle = nullptr;
        } else {
          result = make_error(ErrorCode::backend_error,
                              "cublasSetStream for stream " + std::to_string(s) +
                                  " failed: " + cublas->describe(status));
        }
      }
    }
    if (handle != nullptr) (void)cublas->destroy(handle);
    return result;
  }

  // --- Everything below runs with mu_ held.

  Result<void> ensure_stream(Stream& st, StreamId s) {
    if (st.handle != nullptr) return {};
    const cudaError_t err = cudaStreamCreateWithFlags(&st.handle, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      st.handle = nullptr;
      return cuda_error(err, "creating CUDA stream for stream " + std::to_string(s));
    }
    return {};
  }

  // Records the completion event of `ticket` behind the work just issued.
  Result<void> record(StreamId s, Stream& st, Ticket ticket) {
    cudaEvent_t ev = nullptr;
    if (!free_events_.empty()) {
      ev = free_events_.back();
      free_events_.pop_back();
    } else {
      const cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
      if (err != cudaSuccess) return cuda_error(err, "cudaEventCreateWithFlags");
    }
    const cudaError_t err = cudaEventRecord(ev, st.handle);
    if (err != cudaSuccess) {
      free_events_.push_back(ev);
      return cuda_error(err, "cudaEventRecord for " + ticket_name(s, ticket));
    }
    st.inflight.push_back(Inflight{ticket, ev});
    return {};
  }

  // Retires completed events in ticket order. Never blocks.
  void poll(Stream& st) {
    while (!st.inflight.empty()) {
      const cudaError_t err = cudaEventQuery(st.inflight.front().event);
      if (err == cudaErrorNotReady) return;
      if (err != cudaSuccess) {
        // A device fault is sticky: every later operation would fail too.
        if (!fault_) fault_ = cuda_error(err, "the device (cudaEventQuery)");
        return;
      }
      st.completed = st.inflight.front().ticket;
      free_events_.push_back(st.inflight.front().event);
      st.inflight.pop_front();
    }
    st.completed = st.submitted;  // every issued ticket has completed
  }

  bool host_pinned(const void* p, std::uint64_t bytes) const {
    std::lock_guard lock(host_mu_);
    auto inside = [&](const std::map<std::byte*, std::uint64_t>& ranges) {
      auto it = ranges.upper_bound(static_cast<std::byte*>(const_cast<void*>(p)));
      if (it == ranges.begin()) return false;
      --it;
      const auto begin = reinterpret_cast<std::uintptr_t>(it->first);
      const auto at = reinterpret_cast<std::uintptr_t>(p);
      return at - begin <= it->second && bytes <= it->second - (at - begin);
    };
    return inside(pinned_) || inside(registered_);
  }

  bool overlaps_registered(const std::byte* p, std::uint64_t bytes) const {
    const auto begin = reinterpret_cast<std::uintptr_t>(p);
    const std::uintptr_t end = begin + bytes;
    for (const auto& [q, n] : registered_) {
      const auto qb = reinterpret_cast<std::uintptr_t>(q);
      if (begin < qb + n && qb < end) return true;
    }
    return false;
  }

  Result<std::byte*> staging_buffer(Stream& st, StreamId s) {
    const unsigned i = st.next_staging;
    st.next_staging ^= 1u;
    if (st.staging[i] == nullptr) {
      void* p = nullptr;
      const cudaError_t err = cudaHostAlloc(&p, kStagingBytes, cudaHostAllocPortable);
      if (err != cudaSuccess) {
        return cuda_error(err, "cudaHostAlloc of a staging buffer for stream " + std::to_string(s));
      }
      st.staging[i] = static_cast<std::byte*>(p);
    }
    return st.staging[i];
  }

  // Device scratch of at least `bytes`, reused by every operation of the stream
  // (stream order keeps them apart). Growing frees the old buffer in stream order.
  Result<std::uint64_t*> scratch(Stream& st, std::uint64_t bytes) {
    if (st.scratch_bytes < bytes) {
      std::uint64_t size = std::max(kMinScratchBytes, st.scratch_bytes);
      while (size < bytes) size *= 2;
      void* p = nullptr;
      cudaError_t err;
      if (memory_pools_) {
        if (st.scratch != nullptr) (void)cudaFreeAsync(st.scratch, st.handle);
        err = cudaMallocAsync(&p, size, st.handle);
      } else {
        if (st.scratch != nullptr) retired_scratch_.push_back(st.scratch);  // freed at the end
        err = cudaMalloc(&p, size);
      }
      st.scratch = nullptr;
      st.scratch_bytes = 0;
      if (err != cudaSuccess) {
        return cuda_error(err, "allocating " + std::to_string(size) + " bytes of hash scratch");
      }
      st.scratch = p;
      st.scratch_bytes = size;
    }
    return static_cast<std::uint64_t*>(st.scratch);
  }

  Result<void> check(cudaError_t err, const std::string& what) const {
    if (err == cudaSuccess) return {};
    return cuda_error(err, what);
  }

  Result<void> copy_to_device(StreamId s, Stream& st, std::uint64_t dst, const std::byte* src,
                              std::uint64_t bytes) {
    if (bytes == 0) return {};
    if (host_pinned(src, bytes)) {
      return check(cudaMemcpyAsync(device_ptr(dst), src, bytes, cudaMemcpyHostToDevice, st.handle),
                   "cudaMemcpyAsync host->device");
    }
    for (std::uint64_t off = 0; off < bytes; off += kStagingBytes) {
      const std::uint64_t n = std::min(kStagingBytes, bytes - off);
      auto buf = staging_buffer(st, s);
      if (!buf.ok()) return std::move(buf).error();
      FERRY_TRY(check(launch_host_copy(st.handle, *buf, src + off, n), "cudaLaunchHostFunc"));
      FERRY_TRY(check(cudaMemcpyAsync(device_ptr(dst + off), *buf, n, cudaMemcpyHostToDevice,
                                      st.handle),
                      "cudaMemcpyAsync host->device (staged)"));
    }
    return {};
  }

  Result<void> copy_to_host(StreamId s, Stream& st, std::byte* dst, std::uint64_t src,
                            std::uint64_t bytes) {
    if (bytes == 0) return {};
    if (host_pinned(dst, bytes)) {
      return check(cudaMemcpyAsync(dst, device_ptr(src), bytes, cudaMemcpyDeviceToHost, st.handle),
                   "cudaMemcpyAsync device->host");
    }
    for (std::uint64_t off = 0; off < bytes; off += kStagingBytes) {
      const std::uint64_t n = std::min(kStagingBytes, bytes - off);
      auto buf = staging_buffer(st, s);
      if (!buf.ok()) return std::move(buf).error();
      FERRY_TRY(check(cudaMemcpyAsync(*buf, device_ptr(src + off), n, cudaMemcpyDeviceToHost,
                                      st.handle),
                      "cudaMemcpyAsync device->host (staged)"));
      FERRY_TRY(check(launch_host_copy(st.handle, dst + off, *buf, n), "cudaLaunchHostFunc"));
    }
    return {};
  }

  Result<void> batch_to_device(StreamId s, Stream& st, const BatchCopyToDeviceOp& op) {
    std::vector<void*> dsts;
    std::vector<void*> srcs;
    std::vector<std::size_t> sizes;
    for (const CopyToDeviceOp& c : op.copies) {
      if (c.dst.bytes == 0) continue;  // the batch call rejects empty entries
      if (info_.batched_copy && host_pinned(c.src, c.dst.bytes)) {
        dsts.push_back(device_ptr(c.dst.addr));
        srcs.push_back(const_cast<std::byte*>(c.src));
        sizes.push_back(c.dst.bytes);
      } else {
        FERRY_TRY(copy_to_device(s, st, c.dst.addr, c.src, c.dst.bytes));
      }
    }
    if (dsts.empty()) return {};
    const cudaError_t err = memcpy_batch_to_device(dsts, srcs, sizes, device_, st.handle);
    if (err == cudaSuccess) return {};
    // A rejected batch enqueued nothing: the same copies one by one.
    (void)cudaGetLastError();
    for (std::size_t i = 0; i < dsts.size(); ++i) {
      FERRY_TRY(check(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyHostToDevice, st.handle),
                      "cudaMemcpyAsync host->device (after cudaMemcpyBatchAsync failed: " +
                          describe(err) + ")"));
    }
    return {};
  }

  Result<void> hash(StreamId s, Stream& st, const HashOp& op) {
    const std::uint64_t chunks = hash_chunk_count(op.src.bytes);
    auto buf = scratch(st, 8 * (1 + chunks));
    if (!buf.ok()) return std::move(buf).error();
    std::uint64_t* result = *buf;
    FERRY_TRY(check(launch_content_hash(device_ptr(op.src.addr), op.src.bytes, result + 1, result,
                                        st.handle),
                    "launching the hash kernel"));
    if (host_pinned(op.result, sizeof(std::uint64_t))) {
      return check(cudaMemcpyAsync(op.result, result, sizeof(std::uint64_t),
                                   cudaMemcpyDeviceToHost, st.handle),
                   "cudaMemcpyAsync of the hash");
    }
    // A pageable result: through the stream's pinned slot, then a host function.
    std::uint64_t* slot = result_slots_ + s;
    FERRY_TRY(check(cudaMemcpyAsync(slot, result, sizeof(std::uint64_t), cudaMemcpyDeviceToHost,
                                    st.handle),
                    "cudaMemcpyAsync of the hash"));
    return check(launch_host_copy(st.handle, op.result, slot, sizeof(std::uint64_t)),
                 "cudaLaunchHostFunc");
  }

  // mix_kernel: every input hashed on the device, the hashes folded into the seed,
  // the output filled from it; all in stream order, nothing returns to the host.
  // Every hash is enqueued before the fill, so an output that overlaps an input (an
  // in-place epilogue) is read in full before it is written.
  Result<void> compute(Stream& st, const ComputeOp& op) {
    std::uint64_t max_chunks = 0;
    for (const DeviceRange& in : op.inputs) max_chunks = std::max(max_chunks, hash_chunk_count(in.bytes));
    const std::uint64_t k = op.inputs.size();
    auto buf = scratch(st, 8 * (1 + k + max_chunks));
    if (!buf.ok()) return std::move(buf).error();
    std::uint64_t* seed = *buf;
    std::uint64_t* hashes = seed + 1;
    std::uint64_t* chunk_hashes = hashes + k;
    for (std::uint64_t i = 0; i < k; ++i) {
      FERRY_TRY(check(launch_content_hash(device_ptr(op.inputs[i].addr), op.inputs[i].bytes,
                                          chunk_hashes, hashes + i, st.handle),
                      "launching the hash kernel"));
    }
    FERRY_TRY(check(launch_mix_seed(hashes, k, seed, st.handle), "launching the mix kernel"));
    return check(launch_fill(device_ptr(op.output.addr), op.output.bytes, op.pattern, 0, seed,
                             st.handle),
                 "launching the fill kernel");
  }

  // C = op(A) . op(B) on the stream's cuBLAS handle (ensure_cublas made it at enqueue).
  Result<void> gemm(Stream& st, const GemmOp& op) {
    std::string why;
    const CublasApi* cublas = cublas_api(why);
    if (cublas == nullptr || st.cublas == nullptr) {
      return make_error(ErrorCode::backend_error, "GemmOp issued without a cuBLAS handle");
    }
    const GemmShape& g = op.shape;
    const auto m = static_cast<int>(g.m);
    const auto n = static_cast<int>(g.n);
    const auto k = static_cast<int>(g.k);
    // cuBLAS is column-major, and a row-major r x c matrix is the column-major c x r
    // matrix of the same bytes (its transpose, leading dimension c). So row-major
    // C = op(A) op(B) is column-major C^T (n x m, ldc n) = op(B)^T op(A)^T:
    //   B stored k x n: its column-major view is B^T = op(B)^T        -> N, ldb n
    //   B stored n x k (trans_b): view is (n x k)^T, op(B)^T = B      -> T, ldb k
    //   A stored m x k: view is A^T = op(A)^T                         -> N, lda k
    //   A stored k x m (trans_a): view is (k x m)^T, op(A)^T = A      -> T, lda m
    const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int ldb = g.trans_b ? k : n;
    const int lda = g.trans_a ? m : k;
    const float alpha = 1.0f;
    const float beta = 0.0f;
    // COMPUTE_32F (not a _FAST_ mode): bf16 products summed in FP32, as gemm.hpp says.
    const cublasStatus_t status =
        cublas->gemm_ex(st.cublas, op_b, op_a, n, m, k, &alpha, device_ptr(op.b.addr),
                        CUDA_R_16BF, ldb, device_ptr(op.a.addr), CUDA_R_16BF, lda, &beta,
                        device_ptr(op.c.addr), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
    if (status != CUBLAS_STATUS_SUCCESS) {
      return make_error(ErrorCode::backend_error,
                        "cublasGemmEx of " + g.text() + " failed: " + cublas->describe(status));
    }
    return {};
  }

  Result<void> wait_on(StreamId s, Stream& st, const WaitOp& op) {
    const StreamPoint p = op.point;
    if (p.stream == s || p.ticket == 0) return {};  // a stream is already FIFO
    // The hold layer issued the point before this wait (holding_backend.hpp).
    Stream& other = streams_[p.stream];
    poll(other);
    if (other.completed >= p.ticket) return {};
    for (const Inflight& f : other.inflight) {
      // The wait binds to the event's current record, so recycling it later is safe.
      if (f.ticket == p.ticket) {
        return check(cudaStreamWaitEvent(st.handle, f.event, 0),
                     "cudaStreamWaitEvent on " + ticket_name(p.stream, p.ticket));
      }
    }
    return make_error(ErrorCode::backend_error,
                      "WaitOp: no event for " + ticket_name(p.stream, p.ticket));
  }

  Result<void> issue_op(StreamId s, Stream& st, Op& op, Ticket ticket) {
    auto r = std::visit(
        Overloaded{
            [&](const FillOp& o) {
              return check(launch_fill(device_ptr(o.dst.addr), o.dst.bytes, o.pattern, o.seed,
                                       nullptr, st.handle),
                           "launching the fill kernel");
            },
            [&](const CopyToDeviceOp& o) {
              return copy_to_device(s, st, o.dst.addr, o.src, o.dst.bytes);
            },
            [&](const CopyToHostOp& o) { return copy_to_host(s, st, o.dst, o.src.addr, o.src.bytes); },
            [&](const CopyOnDeviceOp& o) -> Result<void> {
              if (o.dst.bytes == 0 || o.dst.addr == o.src_addr) return {};
              return check(cudaMemcpyAsync(device_ptr(o.dst.addr), device_ptr(o.src_addr),
                                           o.dst.bytes, cudaMemcpyDeviceToDevice, st.handle),
                           "cudaMemcpyAsync device->device");
            },
            [&](const BatchCopyToDeviceOp& o) { return batch_to_device(s, st, o); },
            [&](const ComputeOp& o) { return compute(st, o); },
            [&](const GemmOp& o) { return gemm(st, o); },
            [&](const HashOp& o) { return hash(s, st, o); },
            [&](const WaitOp& o) { return wait_on(s, st, o); },
            [&](const NopOp&) -> Result<void> { return {}; },
        },
        op);
    if (!r.ok()) {
      Error e = std::move(r).error();
      e.message = ticket_name(s, ticket) + ": " + e.message;
      return e;
    }
    return {};
  }

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
  mutable std::mutex mu_;
  std::array<Stream, kMaxStreams> streams_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<void*> retired_scratch_;
  std::uint64_t* result_slots_ = nullptr;  // pinned, one per stream
  std::optional<Error> fault_;             // a sticky device fault

  mutable std::mutex host_mu_;
  std::map<std::byte*, std::uint64_t> pinned_;      // allocate_pinned blocks
  std::map<std::byte*, std::uint64_t> registered_;  // register_host ranges
  HostMemoryStats stats_;
};

Result<std::unique_ptr<Backend>> create_backend(int device) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaFree(nullptr);  // creates the primary context on older runtimes
  if (err != cudaSuccess) return cuda_error(err, "initializing CUDA device " + std::to_string(device));
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return cuda_error(err, "cudaGetDeviceProperties");

  CudaBackend::Setup setup;
  setup.device = device;
  DeviceInfo& info = setup.info;
  info.backend = BackendKind::cuda;
  info.device = prop.name;
  info.capacity = prop.totalGlobalMem;
  info.host_register = device_attribute(cudaDevAttrHostRegisterSupported, device) != 0;
  setup.register_read_only = device_attribute(cudaDevAttrHostRegisterReadOnlySupported, device) != 0;
  setup.memory_pools = device_attribute(cudaDevAttrMemoryPoolsSupported, device) != 0;

  const double mem_clock_hz = 1e3 * device_attribute(cudaDevAttrMemoryClockRate, device);
  const double bus_bytes = device_attribute(cudaDevAttrGlobalMemoryBusWidth, device) / 8.0;
  info.mem_bytes_per_s = mem_clock_hz > 0 && bus_bytes > 0 ? 2.0 * mem_clock_hz * bus_bytes : 1e12;
  const double sm_clock_hz = 1e3 * device_attribute(cudaDevAttrClockRate, device);
  info.flops_per_s = prop.multiProcessorCount * (sm_clock_hz > 0 ? sm_clock_hz : 1.5e9) *
                     flops_per_sm_clock(prop.major, prop.minor);
  // No attribute gives the host link; nominal pinned rates by generation, and the
  // coherent chip-to-chip link of Grace systems.
  if (prop.integrated != 0) {
    info.h2d_bytes_per_s = info.mem_bytes_per_s;
  } else if (device_attribute(cudaDevAttrPageableMemoryAccessUsesHostPageTables, device) != 0) {
    info.h2d_bytes_per_s = 400e9;
  } else {
    info.h2d_bytes_per_s = prop.major >= 9 ? 50e9 : prop.major == 8 ? 24e9 : 12e9;
  }

  // Virtual memory management, unless the driver lacks it or FERRY_CUDA_VMM=0 asks for
  // the fallback (to exercise it on a machine that has both).
  const char* vmm_env = std::getenv("FERRY_CUDA_VMM");
  const bool want_vmm = vmm_env == nullptr || std::strcmp(vmm_env, "0") != 0;
  info.granularity = kFallbackGranularity;
  std::string vmm_note = want_vmm ? "the device does not support it" : "FERRY_CUDA_VMM=0";
  if (want_vmm) {
    auto driver = std::make_unique<DriverApi>();
    int vmm = 0;
    if (driver->load(vmm_note) && driver->device_get(&setup.cu_device, device) == CUDA_SUCCESS &&
        driver->device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                     setup.cu_device) == CUDA_SUCCESS &&
        vmm != 0) {
      CUmemAllocationProp aprop{};
      aprop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      aprop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      aprop.location.id = setup.cu_device;
      std::size_t granularity = 0;
      if (driver->mem_get_allocation_granularity(&granularity, &aprop,
                                                 CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
          granularity > 0 && (granularity & (granularity - 1)) == 0) {
        info.granularity = granularity;
        info.virtual_memory = true;
        setup.driver = std::move(driver);
        vmm_note = "in use";
      }
    }
  }

  std::string batch_note;
  info.batched_copy = probe_batched_copy(device, batch_note);
  // FERRY_CUDA_VERBOSE=1: one line on what was chosen and why (for tools/gpu-check).
  if (const char* v = std::getenv("FERRY_CUDA_VERBOSE"); v != nullptr && std::strcmp(v, "1") == 0) {
    std::fprintf(stderr, "ferry cuda: %s, %llu MiB, granularity %llu KiB, VMM: %s, batched copy: %s\n",
                 info.device.c_str(), static_cast<unsigned long long>(info.capacity >> 20),
                 static_cast<unsigned long long>(info.granularity >> 10), vmm_note.c_str(),
                 batch_note.c_str());
  }
  auto backend = std::make_unique<CudaBackend>(std::move(setup));
  FERRY_TRY(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace
}  // namespace cuda_detail

bool cuda_backend_built() noexcept { return true; }

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return make_error(ErrorCode::unsupported,
                      std::string("no CUDA device or driver found: ") +
                          (err != cudaSuccess ? cudaGetErrorString(err)
                                              : "the driver reports no devices"));
  }
  if (options.device < 0 || options.device >= count) {
    return make_error(ErrorCode::invalid_argument,
                      "CUDA device " + std::to_string(options.device) + " does not exist (" +
                          std::to_string(count) + " found)");
  }
  return cuda_detail::create_backend(options.device);
}

}  // namespace ferry
