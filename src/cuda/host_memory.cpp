// ferry — the CUDA backend's host memory: pinned blocks, registered ranges, and the
// copies between the device and host memory, straight from pinned memory or staged
// through a stream's pinned buffers for pageable memory (host_jobs.hpp: a worker
// fills them for uploads, host functions empty them for downloads).
#include "cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "core/text.hpp"
#include "cuda/cuda_error.hpp"

namespace ferry::cuda_detail {
namespace {

constexpr std::uint64_t kStagingBytes = 4ull << 20;  // per buffer, two per stream

}  // namespace

cudaError_t CudaBackend::launch_host_copy(cudaStream_t stream, void* dst, const void* src,
                                          std::size_t bytes) {
  HostJobs::Job* job = host_jobs_.add_copy(dst, src, bytes);
  const cudaError_t err = cudaLaunchHostFunc(stream, &HostJobs::run, job);
  if (err != cudaSuccess) host_jobs_.cancel(job);
  return err;
}

Result<std::byte*> CudaBackend::allocate_pinned(std::uint64_t bytes) {
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, "allocate_pinned of 0 bytes");
  const DeviceScope bound = bind();
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

Result<void> CudaBackend::free_pinned(std::byte* ptr) {
  // Held work that reads or writes the block would touch freed memory once
  // issued: refused, as on the sim (the arena's leases never get here). The hold
  // layer's lock is taken with no lock of ours held.
  std::uint64_t bytes = 0;
  {
    std::lock_guard lock(host_mu_);
    if (auto it = pinned_.find(ptr); it != pinned_.end()) bytes = it->second;
  }
  if (const auto user = bytes > 0 ? queues().held_user(ptr, bytes) : std::nullopt) {
    return make_error(ErrorCode::invalid_argument,
                      "free_pinned(" + text::hex(ptr) + "): " + text::point(*user) +
                          " is held in the host-side queue and still uses this buffer; wait for it first");
  }
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
  const DeviceScope bound = bind();
  const cudaError_t err = cudaFreeHost(ptr);  // may synchronize: no lock held
  if (err != cudaSuccess) return cuda_error(err, "cudaFreeHost");
  return {};
}

Result<void> CudaBackend::register_host(std::byte* ptr, std::uint64_t bytes) {
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
  const DeviceScope bound = bind();
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

Result<void> CudaBackend::unregister_host(std::byte* ptr) {
  {
    std::lock_guard lock(host_mu_);
    if (registered_.erase(ptr) == 0) {
      return make_error(ErrorCode::invalid_argument,
                        "unregister_host: not the start of a range registered with this backend");
    }
    ++stats_.unregistrations;
  }
  const DeviceScope bound = bind();
  const cudaError_t err = cudaHostUnregister(ptr);
  if (err != cudaSuccess) return cuda_error(err, "cudaHostUnregister");
  return {};
}

HostMemoryStats CudaBackend::host_stats() const {
  std::lock_guard lock(host_mu_);
  return stats_;
}

bool CudaBackend::host_pinned(const void* p, std::uint64_t bytes) const {
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

bool CudaBackend::overlaps_registered(const std::byte* p, std::uint64_t bytes) const {
  const auto begin = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t end = begin + bytes;
  for (const auto& [q, n] : registered_) {
    const auto qb = reinterpret_cast<std::uintptr_t>(q);
    if (begin < qb + n && qb < end) return true;
  }
  return false;
}

Result<std::byte*> CudaBackend::staging_buffer(Stream& st, StreamId s) {
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

Result<void> CudaBackend::copy_to_device(StreamId s, Stream& st, std::uint64_t dst,
                                         const std::byte* src, std::uint64_t bytes) {
  if (bytes == 0) return {};
  if (host_pinned(src, bytes)) {
    return check(cudaMemcpyAsync(device_ptr(dst), src, bytes, cudaMemcpyHostToDevice, st.handle),
                 "cudaMemcpyAsync host->device");
  }
  if (!host_jobs_.start_worker()) {
    return make_error(ErrorCode::backend_error,
                      "copy to device from pageable memory: the staging worker thread could not be started");
  }
  // Chunk k: the worker copies it into staging buffer k % 2 while the DMA of chunk
  // k - 1 runs; the gate holds the stream until the copy is done (host_jobs.hpp).
  for (std::uint64_t off = 0; off < bytes; off += kStagingBytes) {
    const std::uint64_t n = std::min(kStagingBytes, bytes - off);
    const unsigned b = st.next_staging;
    auto buf = staging_buffer(st, s);
    if (!buf.ok()) return std::move(buf).error();
    HostJobs::Job* job = host_jobs_.add_upload(st.lane, b, *buf, src + off, n);
    if (const cudaError_t err = cudaLaunchHostFunc(st.handle, &HostJobs::gate, job); err != cudaSuccess) {
      host_jobs_.cancel(job);
      return check(err, "cudaLaunchHostFunc (staging gate)");
    }
    // Before any other enqueue, which may block until the stream reaches the gate.
    host_jobs_.submit(job);
    cudaError_t err = cudaMemcpyAsync(device_ptr(dst + off), *buf, n, cudaMemcpyHostToDevice, st.handle);
    const char* what = "cudaMemcpyAsync host->device (staged)";
    if (err == cudaSuccess) {
      err = cudaLaunchHostFunc(st.handle, &HostJobs::finish, job);
      what = "cudaLaunchHostFunc (staging release)";
    }
    if (err != cudaSuccess) {
      host_jobs_.end_on_copy(job);  // the gate is on the stream, and no finish() follows it
      return check(err, what);
    }
  }
  return {};
}

Result<void> CudaBackend::copy_to_host(StreamId s, Stream& st, std::byte* dst, std::uint64_t src,
                                       std::uint64_t bytes) {
  if (bytes == 0) return {};
  if (host_pinned(dst, bytes)) {
    return check(cudaMemcpyAsync(dst, device_ptr(src), bytes, cudaMemcpyDeviceToHost, st.handle),
                 "cudaMemcpyAsync device->host");
  }
  for (std::uint64_t off = 0; off < bytes; off += kStagingBytes) {
    const std::uint64_t n = std::min(kStagingBytes, bytes - off);
    const unsigned b = st.next_staging;
    auto buf = staging_buffer(st, s);
    if (!buf.ok()) return std::move(buf).error();
    // A use of the staging buffer, so no upload's worker copy overwrites it first.
    HostJobs::Job* job = host_jobs_.add_copy(dst + off, *buf, n, &st.lane, b);
    if (const cudaError_t err = cudaMemcpyAsync(*buf, device_ptr(src + off), n, cudaMemcpyDeviceToHost,
                                                st.handle);
        err != cudaSuccess) {
      host_jobs_.cancel(job);
      return check(err, "cudaMemcpyAsync device->host (staged)");
    }
    if (const cudaError_t err = cudaLaunchHostFunc(st.handle, &HostJobs::run, job); err != cudaSuccess) {
      host_jobs_.cancel(job);
      return check(err, "cudaLaunchHostFunc");
    }
  }
  return {};
}

}  // namespace ferry::cuda_detail
