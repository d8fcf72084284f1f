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
         (options.matmul == MatmulKind::automatic && options.backend == BackendKind::cuda);
}

std::uint64_t fnv1a(std::string_view text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// --- BusyMeter ---------------------------------------------------------------------

BusyMeter::BusyMeter(Backend& inner, DeviceProfile profile)
    : ForwardingBackend(inner), profile_(std::move(profile)) {}

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

bool BusyMeter::pinned(const std::byte* host, std::uint64_t bytes) const {
  const auto p = reinterpret_cast<std::uintptr_t>(host);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  return p - it->first <= it->second && bytes <= it->second - (p - it->first);
}

Result<Ticket> BusyMeter::enqueue(StreamId stream, Op op) {
  std::uint64_t ns;
  bool copy;
  {
    std::lock_guard lock(mu_);
    ns = modeled_ns(op, profile_, [&](const std::byte* p, std::uint64_t n) { return pinned(p, n); });
    copy = engine_of(op) == Engine::copy_h2d || engine_of(op) == Engine::copy_d2h;
  }
  Result<Ticket> t = inner_.enqueue(stream, std::move(op));
  if (t.ok()) {
    std::lock_guard lock(mu_);
    (copy ? transfer_ns_ : compute_ns_) += ns;
  }
  return t;
}

Result<std::byte*> BusyMeter::allocate_pinned(std::uint64_t bytes) {
  Result<std::byte*> p = inner_.allocate_pinned(bytes);
  if (p.ok()) {
    std::lock_guard lock(mu_);
    pinned_[reinterpret_cast<std::uintptr_t>(*p)] = bytes;
  }
  return p;
}

Result<void> BusyMeter::free_pinned(std::byte* ptr) {
  Result<void> r = inner_.free_pinned(ptr);
  if (r.ok()) {
    std::lock_guard lock(mu_);
    pinned_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  return r;
}

Result<void> BusyMeter::register_host(std::byte* ptr, std::uint64_t bytes) {
  Result<void> r = inner_.register_host(ptr, bytes);
  if (r.ok()) {
    std::lock_guard lock(mu_);
    pinned_[reinterpret_cast<std::uintptr_t>(ptr)] = bytes;
  }
  return r;
}

Result<void> BusyMeter::unregister_host(std::byte* ptr) {
  Result<void> r = inner_.unregister_host(ptr);
  if (r.ok()) {
    std::lock_guard lock(mu_);
    pinned_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  return r;
}

void BusyMeter::reset() {
  std::lock_guard lock(mu_);
  transfer_ns_ = compute_ns_ = 0;
}

std::uint64_t BusyMeter::transfer_ns() const {
  std::lock_guard lock(mu_);
  return static_cast<std::uint64_t>(transfer_ns_);
}

std::uint64_t BusyMeter::compute_ns() const {
  std::lock_guard lock(mu_);
  return static_cast<std::uint64_t>(compute_ns_);
}

// --- Env ---------------------------------------------------------------------------

Env::~Env() {
  // Users of the engine go first; then the objects in reverse order of making.
  engine.reset();
  arena.reset();
  pool.reset();
  order.reset();
  meter.reset();
  owned.reset();
}

DeviceProfile scaled_profile(DeviceProfile profile, double s) {
  const double s2 = s * s;
  profile.link_latency_ns *= s2;
  profile.kernel_latency_ns *= s2;
  const auto g = static_cast<std::uint64_t>(static_cast<double>(profile.granularity) * s2);
  profile.granularity = std::max<std::uint64_t>(4096, std::bit_floor(std::max<std::uint64_t>(g, 1)));
  return profile;
}

Result<std::unique_ptr<Env>> make_env(const WorkloadOptions& options, double scale, std::uint64_t capacity,
                                      std::uint64_t arena_budget) {
  auto env = std::make_unique<Env>();
  BackendSpec spec;
  spec.kind = options.backend;
  spec.profile = options.profile;
  spec.seed = options.seed;
  spec.faults = options.faults;
  DeviceProfile profile;
  if (spec.kind == BackendKind::sim) {
    Result<DeviceProfile> named = spec_profile(spec);
    if (!named.ok()) return std::move(named).error();
    profile = scaled_profile(*named, scale);
    spec.custom_profile = profile;
  }
  Result<std::unique_ptr<Backend>> made = make_backend(spec);
  if (!made.ok()) {
    Error e = std::move(made).error();
    if (e.code == ErrorCode::unsupported) {
      e.message = "backend " + std::string(to_string(spec.kind)) + " is not available: " + e.message;
    }
    return e;
  }
  env->owned = std::move(made).value();
  if (!env->owned->info().modeled_time) {
    // A real device: no latencies known, the meter charges bandwidth and rate only.
    const DeviceInfo& info = env->owned->info();
    profile.name = info.device;
    profile.capacity = info.capacity;
    profile.mem_bytes_per_s = info.mem_bytes_per_s;
    profile.h2d_bytes_per_s = info.h2d_bytes_per_s;
    profile.pageable_bytes_per_s = info.h2d_bytes_per_s;
    profile.flops_per_s = info.flops_per_s;
  }
  env->meter = std::make_unique<BusyMeter>(*env->owned, profile);
  env->order = std::make_unique<StreamOrder>(*env->meter);
  PoolOptions pool_options;
  pool_options.capacity = capacity;
  if (spec.kind == BackendKind::sim) {
    const double s2 = scale * scale;
    pool_options.small_limit =
        std::max<std::uint64_t>(4096, static_cast<std::uint64_t>(static_cast<double>(pool_options.small_limit) * s2));
    pool_options.release_threshold =
        static_cast<std::uint64_t>(static_cast<double>(pool_options.release_threshold) * s2);
  }
  env->pool = std::make_unique<DevicePool>(*env->order, pool_options);
  if (!env->pool->status().ok()) {
    Error e = env->pool->status().error();
    e.message = "device pool: " + e.message;
    return e;
  }
  ArenaOptions arena_options;
  arena_options.budget_bytes = arena_budget;
  env->arena = std::make_unique<HostArena>(*env->order, arena_options);
  EngineOptions engine_options;
  engine_options.policy = options.integrity;
  engine_options.probe_stream = kCompute;
  env->engine = std::make_unique<TransferEngine>(*env->pool, *env->arena, engine_options);
  if (!env->engine->status().ok()) {
    Error e = env->engine->status().error();
    e.message = "transfer engine: " + e.message;
    return e;
  }
  return env;
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
  DevicePool& pool = *env_->pool;
  FERRY_TRY(pool.make_ready(a.handle, stream));
  FERRY_TRY(pool.make_ready(b.handle, stream));
  FERRY_TRY(pool.make_ready(c, stream));
  Result<Ticket> t = env_->order->submit(stream, [&](Ticket ticket) -> Result<Op> {
    GemmOp op;
    op.shape = shape;
    op.flops = flops;
    op.mem_bytes = mem_bytes;
    const StreamPoint at{stream, ticket};
    Result<DeviceRange> ra = lease(a, at);
    if (!ra.ok()) return std::move(ra).error();
    Result<DeviceRange> rb = lease(b, at);
    if (!rb.ok()) return std::move(rb).error();
    Result<DeviceRange> rc = lease({c}, at);
    if (!rc.ok()) return std::move(rc).error();
    op.a = *ra;
    op.b = *rb;
    op.c = *rc;
    return Op{op};
  });
  if (!t.ok()) return std::move(t).error();
  return StreamPoint{stream, *t};
}

Result<void> Exec::after(StreamId stream, StreamPoint point) {
  if (env_ == nullptr) return {};
  StreamOrder& order = *env_->order;
  if (point.ticket == 0 || point.stream == stream || order.is_complete(point)) return {};
  Result<Ticket> t = order.submit(stream, [&](Ticket) -> Result<Op> { return Op{WaitOp{point}}; });
  if (!t.ok()) return std::move(t).error();
  return {};
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
  if (env_->owned->info().modeled_time) env_->owned->advance(ns);  // real host work took real time
}

void Exec::progress(std::string_view phase, std::uint64_t done, std::uint64_t total) const {
  if (env_ != nullptr && options_.progress) options_.progress(WorkloadProgress{phase, done, total});
}

// --- Reference ---------------------------------------------------------------------

HostValue Reference::owned(std::vector<std::byte> bytes) const {
  HostValue v;
  v.size = bytes.size();
  v.hash = content_hash(bytes);
  auto kept = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  v.bytes = *kept;
  v.owned = std::move(kept);
  return v;
}

HostValue Reference::view(std::span<const std::byte> bytes, std::uint64_t hash) const {
  HostValue v;
  v.hash = hash;
  v.size = bytes.size();
  if (materialize_) v.bytes = bytes;
  return v;
}

HostValue Reference::view(std::span<const std::byte> bytes) const { return view(bytes, content_hash(bytes)); }

std::uint64_t Reference::fill_hash(std::uint64_t seed, std::uint64_t bytes) {
  // In pieces, so a large output never needs a buffer of its size.
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  if (bytes <= kPiece) {
    buffer_.resize(bytes);
    fill_with(kPattern, seed, 0, buffer_);
    return content_hash(buffer_);
  }
  auto hasher = std::make_unique<ContentHasher>();
  buffer_.resize(kPiece);
  for (std::uint64_t off = 0; off < bytes; off += kPiece) {
    const std::uint64_t n = std::min(kPiece, bytes - off);
    fill_with(kPattern, seed, off, {buffer_.data(), n});
    hasher->update({buffer_.data(), n});
  }
  return hasher->finish();
}

HostValue Reference::fill(std::uint64_t seed, std::uint64_t bytes) {
  if (materialize_) {
    std::vector<std::byte> out(bytes);
    fill_with(kPattern, seed, 0, out);
    return owned(std::move(out));
  }
  return HostValue{fill_hash(seed, bytes), bytes, {}, nullptr};
}

HostValue Reference::kernel(const std::vector<HostValue>& inputs, std::uint64_t bytes) {
  return fill(mix(inputs), bytes);
}

HostValue Reference::matmul(const HostValue& a, const HostValue& b, const GemmShape& shape) {
  if (!gemm_) return kernel({a, b}, shape.c_bytes());
  std::vector<std::byte> c(shape.c_bytes());
  // The digest cannot match after a failure; error() says why.
  if (Result<void> r = gemm_bf16(shape, a.bytes, b.bytes, c); !r.ok()) {
    if (error_.empty()) error_ = r.error().message;
    return HostValue{};
  }
  return owned(std::move(c));
}

std::uint64_t Reference::mix(const std::vector<std::uint64_t>& hashes) {
  std::uint64_t acc = kMixStart;
  for (std::size_t k = 0; k < hashes.size(); ++k) acc = mix_step(acc, k, hashes[k]);
  return acc;
}

std::uint64_t Reference::mix(const std::vector<HostValue>& inputs) {
  std::uint64_t acc = kMixStart;
  for (std::size_t k = 0; k < inputs.size(); ++k) acc = mix_step(acc, k, inputs[k].hash);
  return acc;
}

Result<void> check_gemm_weights(const WeightBank& bank, const std::vector<std::size_t>& tensors) {
  for (std::size_t t : tensors) {
    const TensorInfo& info = bank.tensors()[t];
    if (info.dtype != DType::bf16) continue;
    const std::span<const std::byte> bytes = bank.bytes(t);
    for (std::uint64_t i = 0; i + 1 < bytes.size(); i += 2) {
      const auto bits = static_cast<std::uint16_t>(std::to_integer<unsigned>(bytes[i]) |
                                                   std::to_integer<unsigned>(bytes[i + 1]) << 8);
      const float v = bf16_to_float(bits);
      if (!(v >= -2 && v <= 2 && v == std::trunc(v))) {
        char value[32];  // the shortest form that reads back: "3", "0.5"
        const auto printed = std::to_chars(value, value + sizeof value, v);
        return make_error(ErrorCode::invalid_argument,
                          "--matmul gemm checks the output bit for bit, which needs weights a GEMM sums "
                          "exactly (bf16 integers in [-2, 2], as synthetic banks hold), but " + bank.source() +
                              " tensor \"" + info.name + "\" element " + std::to_string(i / 2) + " is " +
                              std::string(value, printed.ptr) + "; run it with --matmul mix");
      }
    }
  }
  return {};
}

}  // namespace ferry::workloads
