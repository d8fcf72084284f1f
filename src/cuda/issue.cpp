// ferry — the CUDA backend's admission and issue of operations: what this device
// refuses beyond the op contract, and each Op turned into CUDA calls on its stream
// (fill, copies, the batched copy, compute, hash, waits, user kernels).
#include "cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/text.hpp"
#include "cuda/cuda_error.hpp"
#include "cuda/hash_grid.hpp"
#include "cuda/kernels.hpp"
#include "ferry/op_contract.hpp"

namespace ferry::cuda_detail {
namespace {

constexpr std::uint64_t kMinScratchBytes = 64ull << 10;

}  // namespace

// The runtime's signature changed: 12.8 and 12.9 take a trailing failIdx and
// non-const arrays, 13.0 drops failIdx.
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

Result<void> CudaBackend::admit(StreamId stream, const Op& op) {
  FERRY_TRY(validate(op));
  const DeviceScope bound = bind();
  std::lock_guard lock(mu_);
  if (fault_) return *fault_;
  return ensure_stream(streams_[stream], stream);
}

Result<Ticket> CudaBackend::issue(StreamId stream, Op op) {
  const DeviceScope bound = bind();
  std::unique_lock lock(mu_);
  if (fault_) return *fault_;
  Stream& st = streams_[stream];
  FERRY_TRY(ensure_stream(st, stream));
  const Ticket ticket = st.submitted + 1;
  // On failure the device does not number the op (the hold layer then fills
  // the ticket with a no-op or refuses it).
  auto issued = issue_op(stream, st, op, ticket);
  if (!issued.ok()) {
    // Part of the operation may be on the stream already (a host function among
    // it): drain it before reporting, so nothing touches the caller's memory after
    // the error is returned. The wait holds no lock of this backend's, but the hold
    // layer's is held (Device::issue runs under it): a failed issue is rare, and
    // other streams' enqueues stall until the drain (docs/architecture.md notes it).
    cudaEvent_t drained = nullptr;
    bool recorded = false;
    if (cudaEventCreateWithFlags(&drained, cudaEventDisableTiming) == cudaSuccess) {
      recorded = cudaEventRecord(drained, st.handle) == cudaSuccess;
    } else {
      drained = nullptr;
    }
    const cudaStream_t handle = st.handle;
    lock.unlock();
    // No event to wait for: the whole stream, rather than not drain at all.
    const cudaError_t err = recorded ? cudaEventSynchronize(drained) : cudaStreamSynchronize(handle);
    if (drained != nullptr) (void)cudaEventDestroy(drained);
    (void)cudaGetLastError();
    if (err != cudaSuccess) {
      // Not drained: the stream may still run this op's jobs. The backend refuses
      // everything from now on, and the worker stops before the error is returned.
      lock.lock();
      if (!fault_) fault_ = cuda_error(err, "the device (draining a failed issue)");
      host_jobs_.abandon();
    }
    return std::move(issued).error();
  }
  FERRY_TRY(record(stream, st, ticket));
  st.submitted = ticket;
  return ticket;
}

Result<void> CudaBackend::validate(const Op& op) const {
  Result<void> r;
  if (const auto* peer = std::get_if<PeerCopyOp>(&op)) r = check_peer_source(*peer);
  for_each_device_range(op, [&](const DeviceOperand& d) {
    if (r.ok()) r = space_.check_mapped(d.addr, d.bytes, d.role.data());  // roles are literals
  });
  if (r.ok()) return r;
  Error e = std::move(r).error();
  e.message = std::string(op_name(op)) + " " + e.message;
  return e;
}

Result<std::uint64_t*> CudaBackend::scratch(Stream& st, std::uint64_t bytes) {
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

Result<void> CudaBackend::batch_to_device(StreamId s, Stream& st, const BatchCopyToDeviceOp& op) {
  std::vector<void*> dsts;
  std::vector<void*> srcs;
  std::vector<std::size_t> sizes;
  for (const CopyToDeviceOp& c : op.copies) {
    if (c.dst.bytes == 0) continue;  // the batch call rejects empty entries
    if (host_pinned(c.src, c.dst.bytes)) {  // check_op refused the op where the device has no batched copy
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
  // A rejected batch enqueued nothing: the same copies one by one, counted so that a
  // test of the batched path can tell it did not run.
  (void)cudaGetLastError();
  batch_fallbacks_.fetch_add(1, std::memory_order_relaxed);
  for (std::size_t i = 0; i < dsts.size(); ++i) {
    FERRY_TRY(check(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyHostToDevice, st.handle),
                    "cudaMemcpyAsync host->device (after cudaMemcpyBatchAsync failed: " +
                        describe(err) + ")"));
  }
  return {};
}

Result<void> CudaBackend::hash(StreamId s, Stream& st, const HashOp& op) {
  auto buf = scratch(st, 8 * (1 + hash_block_count(op.src.bytes)));
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

std::uint64_t compute_scratch_words(const ComputeOp& op) {
  std::uint64_t max_blocks = 0;
  for (const DeviceRange& in : op.inputs) max_blocks = std::max(max_blocks, hash_block_count(in.bytes));
  return 1 + op.inputs.size() + max_blocks;
}

// mix_kernel: every input hashed on the device, the hashes folded into the seed,
// the output filled from it; all in stream order, nothing returns to the host.
// Every hash is enqueued before the fill, so an output that overlaps an input (an
// in-place epilogue) is read in full before it is written.
cudaError_t launch_compute(const ComputeOp& op, std::uint64_t* scratch, cudaStream_t stream) {
  const std::uint64_t k = op.inputs.size();
  std::uint64_t* seed = scratch;
  std::uint64_t* hashes = seed + 1;
  std::uint64_t* partials = hashes + k;
  for (std::uint64_t i = 0; i < k; ++i) {
    const cudaError_t err =
        launch_content_hash(device_ptr(op.inputs[i].addr), op.inputs[i].bytes, partials, hashes + i, stream);
    if (err != cudaSuccess) return err;
  }
  if (const cudaError_t err = launch_mix_seed(hashes, k, seed, stream); err != cudaSuccess) return err;
  return launch_fill(device_ptr(op.output.addr), op.output.bytes, op.pattern, 0, seed, stream);
}

Result<void> CudaBackend::compute(Stream& st, const ComputeOp& op) {
  auto buf = scratch(st, 8 * compute_scratch_words(op));
  if (!buf.ok()) return std::move(buf).error();
  return check(launch_compute(op, *buf, st.handle), "launching the compute kernels");
}

Result<void> CudaBackend::wait_on(StreamId s, Stream& st, const WaitOp& op) {
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
                   "cudaStreamWaitEvent on " + text::point(p));
    }
  }
  return make_error(ErrorCode::backend_error, "WaitOp: no event for " + text::point(p));
}

void CudaBackend::run_user(StreamId s, Stream& st, const UserOp& op, Ticket ticket) {
  std::vector<KernelArg> args;
  args.reserve(op.operands.size());
  for (const UserOperand& o : op.operands) args.push_back(KernelArg{o.range.addr, o.range.bytes, o.access, {}, {}});
  Result<void> r = call_user_kernel(op.kernel, KernelLaunch{st.handle, args, {s, ticket}, op.tag});
  if (!r.ok()) st.fault.record(ticket, std::move(r).error());
}

Result<void> CudaBackend::issue_op(StreamId s, Stream& st, Op& op, Ticket ticket) {
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
          [&](const HashOp& o) { return hash(s, st, o); },
          [&](const WaitOp& o) {
            // A user kernel fails at dispatch, so the waited stream's failure is known here.
            if (o.point.stream != s) {
              if (Result<void> failed = streams_[o.point.stream].fault.passed_on(o.point); !failed.ok()) {
                st.fault.record(ticket, std::move(failed).error());
              }
            }
            return wait_on(s, st, o);
          },
          [&](const NativeWaitOp& o) {
            return check(cudaStreamWaitEvent(st.handle, static_cast<cudaEvent_t>(o.event), 0),
                         "cudaStreamWaitEvent on a native event");
          },
          [&](const UserOp& o) -> Result<void> {
            run_user(s, st, o, ticket);
            return {};
          },
          [&](const NopOp&) -> Result<void> { return {}; },
          [&](const PeerCopyOp& o) -> Result<void> {
            if (o.dst.bytes == 0) return {};
            // Unified addressing names the source's device by its address (no need
            // for cudaMemcpyPeerAsync's ordinals). validate refused a source whose
            // access connect_peer did not open, where either call would stage
            // through the host unasked; so this is the direct pull over the link,
            // on the destination's stream, in its order.
            return check(cudaMemcpyAsync(device_ptr(o.dst.addr), device_ptr(o.src_addr), o.dst.bytes,
                                         cudaMemcpyDeviceToDevice, st.handle),
                         "cudaMemcpyAsync from a peer device");
          },
      },
      op);
  if (!r.ok()) {
    Error e = std::move(r).error();
    e.message = text::point({s, ticket}) + ": " + e.message;
    return e;
  }
  return {};
}

}  // namespace ferry::cuda_detail
