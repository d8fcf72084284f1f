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

Exec::Exec(const WorkloadOptions& options) : options_(options), gemm_(uses_gemm(options)) {}
Exec::Exec(const WorkloadOptions& options, Env& env) : options_(options), env_(&env), gemm_(uses_gemm(options)) {}

Result<DeviceHandle> Exec::alloc(std::uint64_t bytes, StreamId stream) {
  if (env_ != nullptr) return env_->pool->allocate(bytes, stream);
  const DeviceHandle h{UINT32_MAX, dry_next_++, 1};
  dry_sizes_[h.slot] = bytes;
  dry_live_ += bytes;
  dry_peak_ = std::max(dry_peak_, dry_live_);
  return h;
}

Result<void> Exec::free(DeviceHandle handle) {
  if (env_ != nullptr) return env_->pool->free(handle);
  auto it = dry_sizes_.find(handle.slot);
  if (it == dry_sizes_.end()) return make_error(ErrorCode::stale_handle, "dry run: double free");
  dry_live_ -= it->second;
  dry_sizes_.erase(it);
  return {};
}

void Exec::dry_hold(std::uint64_t bytes) {
  if (env_ != nullptr) return;
  dry_live_ += bytes;
  dry_peak_ = std::max(dry_peak_, dry_live_);
}

Result<StreamPoint> Exec::fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) {
  if (env_ == nullptr) return StreamPoint{stream, 0};
  Result<Ticket> t = enqueue_fill(*env_->pool, stream, dst, seed, kPattern);
  if (!t.ok()) return std::move(t).error();
  return StreamPoint{stream, *t};
}

Result<DeviceRange> Exec::lease(const DeviceSlice& s, StreamPoint at) {
  // The lease is what keeps the block from reuse until the op at `at` completes (I2).
  Result<DeviceSpan> span = env_->pool->lease(s.handle, at);
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
  DevicePool& pool = *env_->pool;
  for (const DeviceSlice& s : inputs) FERRY_TRY(pool.make_ready(s.handle, stream));
  FERRY_TRY(pool.make_ready(output, stream));
  Result<Ticket> t = env_->order->submit(stream, [&](Ticket ticket) -> Result<Op> {
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
  Result<Ticket> t = enqueue_gemm(*env_->pool, stream, matrix(a), matrix(b), c, shape, {flops, mem_bytes});
  if (!t.ok()) return std::move(t).error();
  return StreamPoint{stream, *t};
}

Result<void> Exec::after(StreamId stream, StreamPoint point) {
  if (env_ == nullptr) return {};
  Result<Ticket> t = env_->order->order_after(stream, point);
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
  if (env_ == nullptr) return up;
  // The engine leases the destinations on `stream`; order that stream after any
  // same-stream reuse of them first (I3), as every other enqueue does.
  for (const TransferRange& r : plan.ranges()) FERRY_TRY(env_->pool->make_ready(r.dst, stream));
  Result<PendingUpload> p = env_->engine->begin_upload(stream, plan);
  if (!p.ok()) return std::move(p).error();
  up.pending = std::move(p).value();
  return up;
}

Result<StreamPoint> Exec::finish(Upload&& upload) {
  if (env_ == nullptr || !upload.pending) return StreamPoint{upload.stream, 0};
  Result<TransferReceipt> r = env_->engine->finish(std::move(*upload.pending));
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
  Result<DeviceSpan> span = env_->pool->resolve(src);
  if (!span.ok()) return std::move(span).error();
  FERRY_TRY(env_->pool->make_ready(src, stream));
  std::vector<std::byte> out(span->bytes);
  Result<TransferReceipt> r = env_->engine->download(stream, src, 0, out);
  if (!r.ok()) return std::move(r).error();
  return out;
}

void Exec::host_busy(std::uint64_t ns) {
  if (env_ == nullptr) return;
  host_busy_ns_ += ns;
  if (env_->backend->info().modeled_time) env_->backend->advance(ns);  // real host work took real time
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
