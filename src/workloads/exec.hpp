// Internal to the workloads: the device facade every workload runs against
// (Exec) and the interface of one workload. The run environment is env.hpp, the
// busy-time meter meter.hpp, the host reference reference.hpp.
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
#include "ferry/content.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/gemm.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/workload.hpp"
#include "workloads/env.hpp"
#include "workloads/reference.hpp"

namespace ferry::workloads {

inline constexpr std::uint64_t kDigestBytes = 256;

// Whether `options` make a matmul a real GEMM (MatmulKind::automatic: on cuda).
bool uses_gemm(const WorkloadOptions& options) noexcept;

// A width scaled by s, rounded to a multiple of 8, at least 8.
std::uint64_t scaled(std::uint64_t full, double s);
std::uint64_t fnv1a(std::string_view text);

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

  // The devices (options.devices) and the one every call below acts on (0 at
  // first): its handles, streams and clock. free() and copy_to() find a handle's
  // device themselves.
  std::uint32_t device_count() const noexcept { return options_.devices; }
  void on(std::uint32_t device) noexcept { device_ = device; }
  std::uint32_t current() const noexcept { return device_; }
  DeviceEnv& dev() { return env_->at(device_); }

  Result<DeviceHandle> alloc(std::uint64_t bytes, StreamId stream);
  Result<void> free(DeviceHandle handle);
  // Dry only: bytes that stay live for the rest of the schedule (cache slots).
  void dry_hold(std::uint64_t bytes);

  // A copy of the whole of `src` (any device's) in a new block on `device`,
  // allocated on `stream` there: Runtime::copy_peer on `stream`, after src's
  // writers on that stream of its device, verified under verify (I5).
  // `done`: the point on `device` after which the copy has completed.
  struct Moved {
    DeviceHandle handle{};
    StreamPoint done{};
  };
  Result<Moved> copy_to(std::uint32_t device, DeviceHandle src, StreamId stream);
  // The copy_to calls of one device: those that landed on it (and how many of
  // them went over the pair's link rather than through the host) and those that read it.
  struct PeerTraffic {
    std::uint64_t copies_in = 0, bytes_in = 0, direct_in = 0, copies_out = 0, bytes_out = 0;
  };
  const std::vector<PeerTraffic>& peer_traffic() const noexcept { return peer_; }

  Result<StreamPoint> fill(StreamId stream, DeviceHandle dst, std::uint64_t seed);
  // A kernel: output = mix_kernel(inputs). A slice of 0 bytes means the whole
  // allocation. `flops` and `mem_bytes` are the modeled cost.
  // Returns the kernel's point (dry: ticket 0).
  Result<StreamPoint> kernel(StreamId stream, const std::vector<DeviceSlice>& inputs, DeviceHandle output,
                             double flops, std::uint64_t mem_bytes);
  // A weight matmul, c = op(a) . op(b) (see workload.hpp for what it is):
  // the GEMM user op (gemm.hpp's enqueue_gemm), or a ComputeOp over {a, b}
  // charged `flops`. Slices of 0 bytes mean the whole allocation; each must hold
  // exactly its matrix.
  Result<StreamPoint> matmul(StreamId stream, DeviceSlice a, DeviceSlice b, DeviceHandle c, GemmShape shape,
                             double flops);
  bool gemm() const noexcept { return gemm_; }
  // Makes `stream` wait for `point` (another stream's work) unless done.
  Result<void> after(StreamId stream, StreamPoint point);

  // An upload of bank tensors being planned (add_weights): its plan and the
  // ranges it staged. Dropped before begin_upload, it releases them unread.
  class WeightUpload {
   public:
    explicit WeightUpload(const WeightBank& bank) : bank_(&bank) {}
    WeightUpload(WeightUpload&&) noexcept = default;
    WeightUpload& operator=(WeightUpload&&) = delete;
    ~WeightUpload();

   private:
    friend class Exec;
    const WeightBank* bank_;
    TransferPlan plan_;
    std::vector<StagedRange> staged_;
  };
  struct Upload {
    std::optional<PendingUpload> pending;
    StreamId stream = 0;
    std::uint32_t device = 0;  // whose engine runs it
    // Released at finish() once it succeeded; after a failure (copies may still
    // read them) they stay until the bank is unplaced.
    const WeightBank* bank = nullptr;
    std::vector<StagedRange> staged;
  };
  // Adds bytes [offset, offset + bytes) of bank tensor `tensor` to the upload,
  // into dst at dst_offset. Live: staged first (WeightBank::stage). Dry: nothing.
  Result<void> add_weights(WeightUpload& up, std::size_t tensor, std::uint64_t offset, std::uint64_t bytes,
                           DeviceHandle dst, std::uint64_t dst_offset);
  Result<Upload> begin_upload(StreamId stream, WeightUpload&& weights);
  Result<Upload> begin_upload(StreamId stream, const TransferPlan& plan);
  // Returns the point after which the copies are complete (and verified under verify).
  Result<StreamPoint> finish(Upload&& upload);

  // Copies the whole allocation back (after `stream`'s work so far; the caller
  // orders it after other streams' writers with after()). Dry: zeros.
  Result<std::vector<std::byte>> download(StreamId stream, DeviceHandle src);

  // Host work that takes `ns` (moe host execution) for the current device:
  // advances the sim's clock (the host's, with several devices).
  void host_busy(std::uint64_t ns);
  std::uint64_t host_busy_ns() const noexcept;  // every device's
  const std::vector<std::uint64_t>& device_host_busy_ns() const noexcept { return host_busy_ns_; }

  // Reports progress (live only) and remembers it, so that a failed run can say where it stopped.
  void progress(std::string_view phase, std::uint64_t done, std::uint64_t total);
  // The last progress reported; total 0 before the first.
  const WorkloadProgress& last_progress() const noexcept { return last_progress_; }

  // The schedule's peak of live bytes on the device that needs most, and on each.
  std::uint64_t dry_peak() const noexcept;
  const std::vector<std::uint64_t>& dry_peaks() const noexcept { return dry_peak_; }

 private:
  // Leases `slice` for the op at `at` and returns its device range.
  Result<DeviceRange> lease(const DeviceSlice& slice, StreamPoint at);
  Result<DeviceHandle> alloc_on(std::uint32_t device, std::uint64_t bytes, StreamId stream);
  // The device whose pool made `handle` (through this Exec); the current one if none did.
  std::uint32_t device_of(DeviceHandle handle) const;

  const WorkloadOptions& options_;
  Env* env_ = nullptr;
  bool gemm_ = false;
  std::uint32_t device_ = 0;
  std::unordered_map<std::uint32_t, std::uint32_t> pool_device_;  // handle.pool -> device
  std::unordered_map<std::uint32_t, std::uint64_t> dry_sizes_;  // by slot
  std::uint32_t dry_next_ = 1;
  std::vector<std::uint64_t> dry_live_, dry_peak_;  // by device
  std::vector<std::uint64_t> host_busy_ns_;  // by device
  std::vector<PeerTraffic> peer_;            // by device
  WorkloadProgress last_progress_;  // phase points at a string literal of the workload's
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
  // Whether every weight reaches the device through Exec::add_weights, so a
  // lazy synthetic bank can serve it; false: the workload needs the bank's bytes
  // in place for the whole run.
  virtual bool stages_weights() const { return true; }
  // Refuses options this workload cannot serve, before anything is built.
  // Errors: invalid_argument naming the option and what would work.
  virtual Result<void> check_options() const { return {}; }
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
  // Filled by execute (live) for workloads with a cache: the sum of the
  // devices' caches, and each's (several devices only).
  std::optional<CacheStats> cache_stats;
  std::uint32_t cache_slots = 0;
  std::vector<CacheStats> device_cache_stats;
  std::vector<std::uint32_t> device_cache_slots;
  // Filled by execute (live) with several devices: what each device ran (units
  // of device_unit_name()) and the nominal tokens of that work.
  std::vector<std::uint64_t> device_units;
  std::vector<std::uint64_t> device_tokens;
  virtual std::string device_unit_name() const { return unit_name(); }
  // What device_tokens counts (WorkloadDeviceReport::tokens_unit).
  virtual std::string device_tokens_unit() const { return "tokens"; }
  std::uint64_t host_executed = 0;
  std::uint64_t prefetch_skipped = 0;
};

std::unique_ptr<Workload> make_dense_stream(const WorkloadOptions& options, double scale);
std::unique_ptr<Workload> make_moe_offload(const WorkloadOptions& options, double scale);
std::unique_ptr<Workload> make_dequant_train(const WorkloadOptions& options, double scale);


}  // namespace ferry::workloads
