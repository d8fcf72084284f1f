// Internal to the workloads: the device facade every workload runs against, the
// busy-time meter, and the host reference helpers.
//
// A workload's device schedule is written once, against Exec. Exec runs it for
// real (pool, engine, streams) or "dry": handles are fake, nothing is enqueued,
// and only the live bytes are counted. The dry run gives the exact peak live
// bytes of the schedule before the pool exists, so the pool can be sized for a
// target pressure.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/backend.hpp"
#include "ferry/forwarding_backend.hpp"
#include "ferry/content.hpp"
#include "ferry/gemm.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/workload.hpp"

namespace ferry::workloads {

// Streams every workload uses. Every host->device upload of weights runs on
// kUpload: the host link is one resource, whatever number of copy engines the
// device has.
inline constexpr StreamId kCompute = 0;
inline constexpr StreamId kUpload = 1;
inline constexpr StreamId kPrefetch = 2;
inline constexpr StreamId kHostIo = 3;  // moe host execution: activations out, results in

inline constexpr std::uint64_t kDigestBytes = 256;
// Every value a workload writes (fills, kernels) is in this pattern, so any of
// them can be a GEMM operand (see workload.hpp).
inline constexpr Pattern kPattern = Pattern::small_bf16;

// Whether `options` make a matmul a real GEMM (MatmulKind::automatic: on cuda).
bool uses_gemm(const WorkloadOptions& options) noexcept;

// A width scaled by s, rounded to a multiple of 8, at least 8.
std::uint64_t scaled(std::uint64_t full, double s);
std::uint64_t fnv1a(std::string_view text);

// --- Busy time ---------------------------------------------------------------

// A Backend adaptor that forwards everything and adds each enqueued operation's
// modeled duration to its engine's busy time (the one cost model, cost_model.hpp,
// that the sim's clock runs on). It tracks pinned and registered host ranges itself, since copy
// bandwidth depends on them.
class BusyMeter final : public ForwardingBackend {
 public:
  BusyMeter(Backend& inner, DeviceProfile profile);
  Result<Ticket> enqueue(StreamId stream, Op op) override;
  Result<std::byte*> allocate_pinned(std::uint64_t bytes) override;
  Result<void> free_pinned(std::byte* ptr) override;
  Result<void> register_host(std::byte* ptr, std::uint64_t bytes) override;
  Result<void> unregister_host(std::byte* ptr) override;

  void reset();
  std::uint64_t transfer_ns() const;
  std::uint64_t compute_ns() const;

 private:
  bool pinned(const std::byte* host, std::uint64_t bytes) const;  // under mu_

  DeviceProfile profile_;
  mutable std::mutex mu_;
  std::map<std::uintptr_t, std::uint64_t> pinned_;  // start -> bytes
  std::uint64_t transfer_ns_ = 0, compute_ns_ = 0;
};

// --- The run environment -------------------------------------------------------

struct Env {
  std::unique_ptr<Backend> owned;  // the real backend
  std::unique_ptr<BusyMeter> meter;
  std::unique_ptr<StreamOrder> order;
  std::unique_ptr<DevicePool> pool;
  std::unique_ptr<HostArena> arena;
  std::unique_ptr<TransferEngine> engine;

  ~Env();
};

// The sim profile a run at scale `s` models: per-operation latencies and the
// mapping granularity shrink by s^2 like every buffer does, so the timeline and
// the granule-level layout are the full shape's, shrunk (see workload.hpp).
DeviceProfile scaled_profile(DeviceProfile profile, double s);

// Builds backend, meter, order, pool (of `capacity`), arena and engine. On sim
// the profile is scaled_profile(options.profile, scale), and the pool's
// small-block limit and release threshold shrink by scale^2 too.
// Errors: invalid_argument (profile), unsupported (backend), backend_error.
Result<std::unique_ptr<Env>> make_env(const WorkloadOptions& options, double scale, std::uint64_t capacity,
                                      std::uint64_t arena_budget);

// --- The device facade -------------------------------------------------------------

class Exec {
 public:
  // Dry: counts live bytes only.
  explicit Exec(const WorkloadOptions& options);
  // Live: runs on env.
  Exec(const WorkloadOptions& options, Env& env);

  bool dry() const noexcept { return env_ == nullptr; }
  Env& env() { return *env_; }
  const WorkloadOptions& options() const noexcept { return options_; }

  Result<DeviceHandle> alloc(std::uint64_t bytes, StreamId stream);
  Result<void> free(DeviceHandle handle);
  // Dry only: bytes that stay live for the rest of the schedule (cache slots).
  void dry_hold(std::uint64_t bytes);

  Result<StreamPoint> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed);
  // A kernel: output = mix_kernel(inputs). A slice of 0 bytes means the whole
  // allocation. `flops` and `mem_bytes` are the modeled cost.
  // Returns the kernel's point (dry: ticket 0).
  Result<StreamPoint> kernel(StreamId stream, const std::vector<DeviceSlice>& inputs, DeviceHandle output,
                             double flops, std::uint64_t mem_bytes);
  // A weight matmul, c = op(a) . op(b) (see workload.hpp for what it is):
  // a GemmOp, or a ComputeOp over {a, b} charged `flops`. Slices of 0 bytes
  // mean the whole allocation; each must hold exactly its matrix.
  Result<StreamPoint> matmul(StreamId stream, DeviceSlice a, DeviceSlice b, DeviceHandle c, GemmShape shape,
                             double flops);
  bool gemm() const noexcept { return gemm_; }
  // Makes `stream` wait for `point` (another stream's work) unless done.
  Result<void> after(StreamId stream, StreamPoint point);

  struct Upload {
    std::optional<PendingUpload> pending;
    StreamId stream = 0;
  };
  Result<Upload> begin_upload(StreamId stream, const TransferPlan& plan);
  // Returns the point after which the copies are complete (and verified under verify).
  Result<StreamPoint> finish(Upload&& upload);

  // Copies the whole allocation back (after `stream`'s work so far; the caller
  // orders it after other streams' writers with after()). Dry: zeros.
  Result<std::vector<std::byte>> download(StreamId stream, DeviceHandle src);

  // Host work that takes `ns` (moe host execution): advances the sim's clock.
  void host_busy(std::uint64_t ns);
  std::uint64_t host_busy_ns() const noexcept { return host_busy_ns_; }

  void progress(std::string_view phase, std::uint64_t done, std::uint64_t total) const;

  std::uint64_t dry_peak() const noexcept { return dry_peak_; }

 private:
  // Leases `slice` for the op at `at` and returns its device range.
  Result<DeviceRange> lease(const DeviceSlice& slice, StreamPoint at);

  const WorkloadOptions& options_;
  Env* env_ = nullptr;
  bool gemm_ = false;
  std::unordered_map<std::uint32_t, std::uint64_t> dry_sizes_;
  std::uint32_t dry_next_ = 1;
  std::uint64_t dry_live_ = 0, dry_peak_ = 0;
  std::uint64_t host_busy_ns_ = 0;
};

// --- Host reference ---------------------------------------------------------------

// A value of the host reference: its content hash and size, and when matmuls are
// GEMMs (or the Reference is asked to) its bytes too, which a host GEMM reads:
// viewed where they exist already, else owned (shared, so values copy cheaply).
struct HostValue {
  std::uint64_t hash = 0;
  std::uint64_t size = 0;
  std::span<const std::byte> bytes;
  std::shared_ptr<const std::vector<std::byte>> owned;
};

// The reference model's arithmetic: the same definitions the device uses
// (content.hpp, gemm.hpp), computed on the host without the pool.
class Reference {
 public:
  // Values carry their bytes when matmuls are GEMMs or `materialize` asks.
  explicit Reference(bool gemm, bool materialize = false) : gemm_(gemm), materialize_(gemm || materialize) {}

  // Bytes that exist already (a bank tensor or part of one, a download), viewed:
  // they must outlive the value.
  HostValue view(std::span<const std::byte> bytes, std::uint64_t hash) const;
  HostValue view(std::span<const std::byte> bytes) const;
  // fill_with(kPattern, seed) of `bytes`.
  HostValue fill(std::uint64_t seed, std::uint64_t bytes);
  // A kernel's output of `bytes` over these inputs.
  HostValue kernel(const std::vector<HostValue>& inputs, std::uint64_t bytes);
  // A matmul's output: the host GEMM, or a kernel over {a, b}.
  HostValue matmul(const HostValue& a, const HostValue& b, const GemmShape& shape);

  static std::uint64_t mix(const std::vector<std::uint64_t>& hashes);
  static std::uint64_t mix(const std::vector<HostValue>& inputs);

  // The first host GEMM that failed (a schedule bug, or no host memory); empty if none.
  const std::string& error() const noexcept { return error_; }

 private:
  std::uint64_t fill_hash(std::uint64_t seed, std::uint64_t bytes);
  HostValue owned(std::vector<std::byte> bytes) const;

  bool gemm_, materialize_;
  std::vector<std::byte> buffer_;
  std::string error_;
};

// --- One workload ------------------------------------------------------------------

// The bank index of each tensor, in order (dtype and shape checked).
// Errors: invalid_argument naming the missing or mismatched tensor.
Result<std::vector<std::size_t>> resolve_tensors(const WeightBank& bank,
                                                 const std::vector<SyntheticTensor>& tensors);

class Workload {
 public:
  virtual ~Workload() = default;
  virtual std::string shape() const = 0;
  virtual std::vector<SyntheticTensor> tensors() const = 0;
  // Resolves the tensors it needs in `bank` (dtype and shape checked).
  virtual Result<void> bind(const WeightBank& bank) = 0;
  // The digest's mix seed, computed on the host without the pool (ref knows
  // whether matmuls are GEMMs).
  virtual std::uint64_t reference(Reference& ref, const WeightBank& bank) = 0;
  // The device schedule; returns the digest handle's downloaded bytes.
  virtual Result<std::vector<std::byte>> execute(Exec& exec, const WeightBank& bank) = 0;
  virtual std::uint64_t nominal_tokens() const = 0;
  virtual std::uint64_t units() const = 0;
  virtual std::string unit_name() const = 0;
  // Filled by execute (live) for workloads with a cache.
  std::optional<CacheStats> cache_stats;
  std::uint32_t cache_slots = 0;
  std::uint64_t host_executed = 0;
  std::uint64_t prefetch_skipped = 0;
};

std::unique_ptr<Workload> make_dense_stream(const WorkloadOptions& options, double scale);
std::unique_ptr<Workload> make_moe_offload(const WorkloadOptions& options, double scale);
std::unique_ptr<Workload> make_dequant_train(const WorkloadOptions& options, double scale);

// Under gemm, checks that every element of the bf16 tensors a matmul reads is an
// integer in [-2, 2] (so FP32 sums them exactly; synthetic banks always pass).
// Errors: invalid_argument naming the tensor, the element and its value.
Result<void> check_gemm_weights(const WeightBank& bank, const std::vector<std::size_t>& tensors);

}  // namespace ferry::workloads
