#include "workloads/exec.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>

#include "ferry/cost_model.hpp"
#include "ferry/make_backend.hpp"

namespace ferry::workloads {

std::uint64_t scaled(std::uint64_t full, double s) {
  const double v = std::round(static_cast<double>(full) * s / 8.0) * 8.0;
  return std::max<std::uint64_t>(8, static_cast<std::uint64_t>(v));
}

bool uses_gemm(const WorkloadOptions& options) noexcept {
  return options.matmul == MatmulKind::gemm ||
         (options.matmul == MatmulKind::automatic && !capabilities_of(options.backend).modeled_time);
}

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// --- Exec --------------------------------------------------------------------------

Exec::Exec(const WorkloadOptions& options)
    : options_(options), gemm_(uses_gemm(options)), dry_live_(options.devices), dry_peak_(options.devices),
      host_busy_ns_(options.devices), peer_(options.devices) {}
Exec::Exec(const WorkloadOptions& options, Env& env)
    : options_(options), env_(&env), gemm_(uses_gemm(options)), dry_live_(options.devices),
      dry_peak_(options.devices), host_busy_ns_(options.devices), peer_(options.devices) {}

std::uint32_t Exec::device_of(DeviceHandle handle) const {
  auto it = pool_device_.find(handle.pool);
  return it == pool_device_.end() ? device_ : it->second;
}

Result<DeviceHandle> Exec::alloc(std::uint64_t bytes, StreamId stream) { return alloc_on(device_, bytes, stream); }

Result<DeviceHandle> Exec::alloc_on(std::uint32_t device, std::uint64_t bytes, StreamId stream) {
  if (env_ != nullptr) {
    Result<DeviceHandle> h = env_->at(device).pool->allocate(bytes, stream);
    if (h.ok()) pool_device_.emplace(h->pool, device);
    return h;
  }
  // A dry handle's pool names its device: UINT32_MAX - device.
  const DeviceHandle h{UINT32_MAX - device, dry_next_++, 1};
  pool_device_.emplace(h.pool, device);
  dry_sizes_[h.slot] = bytes;
  dry_live_[device] += bytes;
  dry_peak_[device] = std::max(dry_peak_[device], dry_live_[device]);
  return h;
}

Result<void> Exec::free(DeviceHandle handle) {
  const std::uint32_t device = device_of(handle);
  if (env_ != nullptr) return env_->at(device).pool->free(handle);
  auto it = dry_sizes_.find(handle.slot);
  if (it == dry_sizes_.end()) return make_error(ErrorCode::stale_handle, "dry run: double free");
  dry_live_[device] -= it->second;
  dry_sizes_.erase(it);
  return {};
}

void Exec::dry_hold(std::uint64_t bytes) {
  if (env_ != nullptr) return;
  dry_live_[device_] += bytes;
  dry_peak_[device_] = std::max(dry_peak_[device_], dry_live_[device_]);
}

std::uint64_t Exec::dry_peak() const noexcept {
  std::uint64_t peak = 0;
  for (std::uint64_t p : dry_peak_) peak = std::max(peak, p);
  return peak;
}

Result<Exec::Moved> Exec::copy_to(std::uint32_t device, DeviceHandle src, StreamId stream) {
  const std::uint32_t from = device_of(src);
  std::uint64_t bytes = 0;
  if (env_ != nullptr) {
    Result<DeviceSpan> span = env_->at(from).pool->resolve(src);
    if (!span.ok()) return std::move(span).error();
    bytes = span->bytes;
    FERRY_TRY(env_->at(from).pool->make_ready(src, stream));
  } else {
    auto it = dry_sizes_.find(src.slot);
    if (it == dry_sizes_.end()) return make_error(ErrorCode::stale_handle, "dry run: copy of a freed block");
    bytes = it->second;
  }
  Result<DeviceHandle> dst = alloc_on(device, bytes, stream);
  if (!dst.ok()) return std::move(dst).error();
  if (env_ == nullptr) return Moved{*dst, StreamPoint{stream, 0}};
  Result<PeerCopyReceipt> r = env_->runtime->copy_peer(*dst, 0, src, 0, bytes, stream);
  if (!r.ok()) {
    (void)free(*dst);
    return std::move(r).error();
  }
  PeerTraffic &in = peer_[device], &out = peer_[from];
  ++in.copies_in, in.bytes_in += bytes, in.direct_in += r->direct ? 1 : 0;
  ++out.copies_out, out.bytes_out += bytes;
  return Moved{*dst, r->done};
}

Result<StreamPoint> Exec::fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) {
  if (env_ == nullptr) return StreamPoint{stream, 0};
  Result<Ticket> t = enqueue_fill(*dev().pool, stream, dst, seed, kPattern);
  if (!t.ok()) return std::move(t).error();
  return StreamPoint{stream, *t};
}

Result<DeviceRange> Exec::lease(const DeviceSlice& s, StreamPoint at) {
  // The lease is what keeps the block from reuse until the op at `at` completes (I2).
  Result<DeviceSpan> span = dev().pool->lease(s.handle, at);
  if (!span.ok()) return std::move(span).error();
  const std::uint64_t bytes = s.bytes == 0 ? span->bytes - std::min(s.offset, span->bytes) : s.bytes;
  if (s.offset > span->bytes || bytes > span->bytes - s.offset || bytes == 0) {
    return make_error(ErrorCode::invalid_argument,
                      "operand [" + std::to_string(s.offset) + ", +" + std::to_string(bytes) +
                          ") lies outside its " + std::to_string(span->bytes) + "-byte allocation");
  }
  return DeviceRange{span->addr + s.offset, bytes};
}

Result<StreamPoint> Exec::kernel(StreamId stream, const std::vector<DeviceSlice>& inputs,
                                 DeviceHandle output, double flops, std::uint64_t mem_bytes) {
  if (env_ == nullptr) return StreamPoint{stream, 0};
  DevicePool& pool = *dev().pool;
  for (const DeviceSlice& s : inputs) FERRY_TRY(pool.make_ready(s.handle, stream));
  FERRY_TRY(pool.make_ready(output, stream));
  Result<Ticket> t = dev().order->submit(stream, [&](Ticket ticket) -> Result<Op> {
    ComputeOp op;
    op.flops = flops;
    op.mem_bytes = mem_bytes;
    op.pattern = kPattern;
    const StreamPoint at{stream, ticket};
    for (const DeviceSlice& s : inputs) {
      Result<DeviceRange> r = lease(s, at);
      if (!r.ok()) return std::move(r).error();
      op.inputs.push_back(*r);
    }
    Result<DeviceRange> out = lease({output}, at);
    if (!out.ok()) return std::move(out).error();
    op.output = *out;
    return Op{std::move(op)};
  });
  if (!t.ok()) return std::move(t).error();
  return StreamPoint{stream, *t};
}

Result<StreamPoint> Exec::matmul(StreamId stream, DeviceSlice a, DeviceSlice b, DeviceHandle c,
                                 GemmShape shape, double flops) {
  const std::uint64_t mem_bytes = shape.a_bytes() + shape.b_bytes() + shape.c_bytes();
  if (!gemm_) return kernel(stream, {a, b}, c, flops, mem_bytes);
  if (env_ == nullptr) return StreamPoint{stream, 0};
  // A slice of 0 bytes is the whole allocation here, the rest of the block there.
  const auto matrix = [](const DeviceSlice& s) {
    return MatrixSlice(s.handle, s.offset, s.bytes == 0 ? kRestOfBlock : s.bytes);
  };
  Result<Ticket> t = enqueue_gemm(*dev().pool, stream, matrix(a), matrix(b), c, shape, {flops, mem_bytes});
  if (!t.ok()) return std::move(t).error();
  return StreamPoint{stream, *t};
}

Result<void> Exec::after(StreamId stream, StreamPoint point) {
  if (env_ == nullptr) return {};
  Result<Ticket> t = dev().order->order_after(stream, point);
  if (!t.ok()) return std::move(t).error();
  return {};
}

Exec::WeightUpload::~WeightUpload() {
  for (const StagedRange& r : staged_) bank_->release(r);  // never enqueued: nothing read it
}

Result<void> Exec::add_weights(WeightUpload& up, std::size_t tensor, std::uint64_t offset, std::uint64_t bytes,
                               DeviceHandle dst, std::uint64_t dst_offset) {
  if (env_ == nullptr) return {};
  Result<StagedRange> r = up.bank_->stage(tensor, offset, bytes);
  if (!r.ok()) return std::move(r).error();
  up.staged_.push_back(*r);
  up.plan_.add(r->bytes.data(), dst, dst_offset, bytes);
  return {};
}

Result<Exec::Upload> Exec::begin_upload(StreamId stream, WeightUpload&& weights) {
  Result<Upload> up = begin_upload(stream, weights.plan_);
  // Past this point copies may read the ranges even on error: only finish() releases them.
  std::vector<StagedRange> staged = std::move(weights.staged_);
  weights.staged_.clear();
  if (!up.ok()) return up;
  up->bank = weights.bank_;
  up->staged = std::move(staged);
  return up;
}

Result<Exec::Upload> Exec::begin_upload(StreamId stream, const TransferPlan& plan) {
  Upload up;
  up.stream = stream;
  up.device = device_;
  if (env_ == nullptr) return up;
  // The engine leases the destinations on `stream`; order that stream after any
  // same-stream reuse of them first (I3), as every other enqueue does.
  for (const TransferRange& r : plan.ranges()) FERRY_TRY(dev().pool->make_ready(r.dst, stream));
  Result<PendingUpload> p = dev().engine->begin_upload(stream, plan);
  if (!p.ok()) return std::move(p).error();
  up.pending = std::move(p).value();
  return up;
}

Result<StreamPoint> Exec::finish(Upload&& upload) {
  if (env_ == nullptr || !upload.pending) return StreamPoint{upload.stream, 0};
  Result<TransferReceipt> r = env_->at(upload.device).engine->finish(std::move(*upload.pending));
  upload.pending.reset();
  if (!r.ok()) return std::move(r).error();
  for (const StagedRange& s : upload.staged) upload.bank->release(s, r->done);
  return r->done;
}

Result<std::vector<std::byte>> Exec::download(StreamId stream, DeviceHandle src) {
  if (env_ == nullptr) {
    auto it = dry_sizes_.find(src.slot);
    return std::vector<std::byte>(it == dry_sizes_.end() ? 0 : it->second);
  }
  Result<DeviceSpan> span = dev().pool->resolve(src);
  if (!span.ok()) return std::move(span).error();
  FERRY_TRY(dev().pool->make_ready(src, stream));
  std::vector<std::byte> out(span->bytes);
  Result<TransferReceipt> r = dev().engine->download(stream, src, 0, out);
  if (!r.ok()) return std::move(r).error();
  return out;
}

void Exec::host_busy(std::uint64_t ns) {
  if (env_ == nullptr) return;
  host_busy_ns_[device_] += ns;
  Backend& backend = *dev().backend;
  if (!backend.info().modeled_time) return;  // real host work took real time
  if (env_->clock) env_->clock->catch_up(backend);  // the host works from its own time on
  backend.advance(ns);
}

std::uint64_t Exec::host_busy_ns() const noexcept {
  std::uint64_t sum = 0;
  for (std::uint64_t ns : host_busy_ns_) sum += ns;
  return sum;
}

void Exec::progress(std::string_view phase, std::uint64_t done, std::uint64_t total) {
  if (env_ == nullptr) return;
  last_progress_ = WorkloadProgress{phase, done, total};
  if (options_.progress) options_.progress(last_progress_);
}

Result<std::vector<std::size_t>> resolve_tensors(const WeightBank& bank,
                                                 const std::vector<SyntheticTensor>& tensors) {
  std::vector<std::size_t> index;
  index.reserve(tensors.size());
  for (const SyntheticTensor& t : tensors) {
    Result<std::size_t> i = bank.require(t.name, t.dtype, t.shape);
    if (!i.ok()) return std::move(i).error();
    index.push_back(*i);
  }
  return index;
}

}  // namespace ferry::workloads
