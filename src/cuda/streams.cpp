// ferry — the CUDA backend's streams: made on first use, a pooled event recorded
// behind every issued ticket, events polled in ticket order, and the waits and the
// synchronize of the hold layer's primitives over them.
#include "cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "core/text.hpp"
#include "cuda/cublas_api.hpp"
#include "cuda/cuda_error.hpp"

namespace ferry::cuda_detail {
namespace {

constexpr auto kWaitSpin = std::chrono::microseconds(200);
constexpr auto kWaitNap = std::chrono::microseconds(20);  // the OS adds its timer slack (~50 us on Linux)
constexpr auto kWaitShortNaps = std::chrono::milliseconds(2);  // naps of kWaitNap until then
constexpr auto kWaitMaxNap = std::chrono::microseconds(500);

}  // namespace

Ticket CudaBackend::issued_completed(StreamId stream) {
  if (stream >= kMaxStreams) return 0;
  std::lock_guard lock(mu_);
  poll(streams_[stream]);
  return streams_[stream].completed;
}

Result<void> CudaBackend::wait_issued(StreamPoint point, std::chrono::nanoseconds timeout) {
  const DeviceScope bound = bind();
  const auto start = std::chrono::steady_clock::now();
  const auto budget = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::min(timeout, std::chrono::nanoseconds(std::chrono::hours(24 * 365))));
  // Poll with backoff; no lock is held while sleeping.
  std::chrono::steady_clock::duration nap = kWaitNap;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      Stream& st = streams_[point.stream];
      poll(st);
      if (st.completed >= point.ticket) return st.fault.check(point.ticket);
      if (fault_) return *fault_;
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited >= budget) {
      return make_error(ErrorCode::timeout,
                        "wait for " + text::point(point) + " timed out after " +
                            std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                                               waited).count()) + " us");
    }
    // Yield-polled for the first kWaitSpin, so a wait for a short op (depth 1)
    // returns within microseconds of its completion; then naps of kWaitNap up to
    // kWaitShortNaps, then doubling to kWaitMaxNap, so a long wait does not take the
    // lock and query the event every few microseconds; never past the budget.
    if (waited < kWaitSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::min(nap, budget - waited));
      if (waited >= kWaitShortNaps) {
        nap = std::min<std::chrono::steady_clock::duration>(2 * nap, kWaitMaxNap);
      }
    }
  }
}

Result<void> CudaBackend::synchronize_issued() {
  const DeviceScope bound = bind();
  std::array<Ticket, kMaxStreams> last{};
  {
    std::lock_guard lock(mu_);
    for (StreamId s = 0; s < kMaxStreams; ++s) last[s] = streams_[s].submitted;
  }
  Result<void> first;
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    if (last[s] == 0) continue;
    auto r = wait_issued(StreamPoint{s, last[s]}, std::chrono::nanoseconds::max());
    // A stream's fault (a failed user kernel) is reported by waits on its points,
    // as on the sim, not by synchronize: the work itself has completed.
    if (!r.ok() && issued_completed(s) >= last[s]) continue;
    if (!r.ok() && first.ok()) first = std::move(r);
  }
  for (CudaGraph* g : finished_graphs()) RetiredGraphs::destroy(g);
  return first;
}

Result<void> CudaBackend::ensure_stream(Stream& st, StreamId s) {
  if (st.handle != nullptr) return {};
  const cudaError_t err = cudaStreamCreateWithFlags(&st.handle, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    st.handle = nullptr;
    return cuda_error(err, "creating CUDA stream for stream " + std::to_string(s));
  }
  return {};
}

Result<void> CudaBackend::record(StreamId s, Stream& st, Ticket ticket) {
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
    return cuda_error(err, "cudaEventRecord for " + text::point({s, ticket}));
  }
  st.inflight.push_back(Inflight{ticket, ev});
  return {};
}

void CudaBackend::poll(Stream& st) {
  while (!st.inflight.empty()) {
    const cudaError_t err = cudaEventQuery(st.inflight.front().event);
    if (err == cudaErrorNotReady) return;
    if (err != cudaSuccess) {
      // A device fault is sticky: every later operation would fail too, and the
      // host functions still queued never run.
      if (!fault_) {
        fault_ = cuda_error(err, "the device (cudaEventQuery)");
        host_jobs_.abandon();  // before the error is reported: no copy reads the caller's memory after
      }
      return;
    }
    st.completed = st.inflight.front().ticket;
    if (!exported_.contains(st.inflight.front().event)) free_events_.push_back(st.inflight.front().event);
    st.inflight.pop_front();
  }
  st.completed = st.submitted;  // every issued ticket has completed
}

void CudaBackend::detach_resources(Stream& st) {
  if (st.scratch != nullptr) {
    if (memory_pools_) (void)cudaFreeAsync(st.scratch, st.handle);
    else retired_scratch_.push_back(st.scratch);  // freed at the end
    st.scratch = nullptr;
    st.scratch_bytes = 0;
  }
  // Retired, not destroyed: cublasDestroy synchronizes the device, and the hold
  // layer's lock and mu_ are held here.
  std::lock_guard lock(cublas_handles_mu_);
  if (const auto it = cublas_handles_.find(st.handle); it != cublas_handles_.end()) {
    retired_cublas_.push_back(it->second);
    cublas_handles_.erase(it);
  }
}

Result<NativeStream> CudaBackend::native_of(StreamId stream) {
  const DeviceScope bound = bind();
  std::lock_guard lock(mu_);
  if (fault_) return *fault_;
  Stream& st = streams_[stream];
  FERRY_TRY(ensure_stream(st, stream));
  return static_cast<NativeStream>(st.handle);
}

Result<void> CudaBackend::bind_stream(StreamId stream, NativeStream native) {
  const DeviceScope bound = bind();
  std::lock_guard lock(mu_);
  if (fault_) return *fault_;
  const auto handle = static_cast<cudaStream_t>(native);
  for (StreamId s = 0; s < kMaxStreams; ++s) {
    if (s != stream && streams_[s].handle == handle && !streams_[s].adopted) {
      return make_error(ErrorCode::invalid_argument, "adopt_stream(" + text::hex(native) +
                                                         "): that is ferry's own stream " + std::to_string(s));
    }
  }
  Stream& st = streams_[stream];
  poll(st);
  // The hold layer picks an id with no ferry work in flight, so a stream ferry
  // made for it is idle and can go.
  if (st.handle != nullptr && !st.adopted) {
    detach_resources(st);
    (void)cudaStreamDestroy(st.handle);
  }
  st.handle = handle;
  st.adopted = true;
  return {};
}

Result<void> CudaBackend::unbind_stream(StreamId stream) {
  const DeviceScope bound = bind();
  std::lock_guard lock(mu_);
  Stream& st = streams_[stream];
  poll(st);
  if (!st.inflight.empty()) {
    return make_error(ErrorCode::backend_error, "release_stream(" + std::to_string(stream) + "): " +
                                                    std::to_string(st.inflight.size()) + " tickets still in flight");
  }
  detach_resources(st);
  st.handle = nullptr;  // the program's: not destroyed; a ferry stream is made on next use
  st.adopted = false;
  return {};
}

Result<NativeEvent> CudaBackend::export_issued(StreamPoint point) {
  const DeviceScope bound = bind();
  std::lock_guard lock(mu_);
  if (fault_) return *fault_;
  Stream& st = streams_[point.stream];
  poll(st);
  cudaEvent_t ev = nullptr;
  for (const Inflight& f : st.inflight) {
    if (f.ticket == point.ticket) ev = f.event;  // recorded right behind the point: exact
  }
  if (ev == nullptr) {
    if (point.ticket > st.completed) {
      return make_error(ErrorCode::backend_error, "export_event: no event for " + text::point(point));
    }
    // A completed point: an event never recorded counts as complete (cudaEventQuery
    // answers success, a stream wait on it returns at once).
    const cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (err != cudaSuccess) return cuda_error(err, "cudaEventCreateWithFlags");
  }
  ++exported_[ev];
  return static_cast<NativeEvent>(ev);
}

Result<void> CudaBackend::release_export(NativeEvent event) {
  std::lock_guard lock(mu_);
  const auto it = exported_.find(static_cast<cudaEvent_t>(event));
  if (it == exported_.end()) {
    return make_error(ErrorCode::invalid_argument, "release_event(" + text::hex(event) +
                                                       "): not an event export_event made, or released already");
  }
  if (--it->second > 0) return {};
  exported_.erase(it);
  for (const Stream& st : streams_) {
    for (const Inflight& f : st.inflight) {
      if (f.event == static_cast<cudaEvent_t>(event)) return {};  // poll() pools it once it completes
    }
  }
  free_events_.push_back(static_cast<cudaEvent_t>(event));
  return {};
}

}  // namespace ferry::cuda_detail
