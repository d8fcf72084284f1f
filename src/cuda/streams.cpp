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
#include "cuda/cuda_error.hpp"

namespace ferry::cuda_detail {

Ticket CudaBackend::issued_completed(StreamId stream) {
  if (stream >= kMaxStreams) return 0;
  std::lock_guard lock(mu_);
  poll(streams_[stream]);
  return streams_[stream].completed;
}

Result<void> CudaBackend::wait_issued(StreamPoint point, std::chrono::nanoseconds timeout) {
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
                        "wait for " + text::point(point) + " timed out after " +
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

Result<void> CudaBackend::synchronize_issued() {
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

}  // namespace ferry::cuda_detail
