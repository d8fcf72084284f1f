// ferry — the seed reports' workloads, end to end on ferry, with their outputs
// checked against a reference computed on the host without the pool
// (docs/spec.md §7).
//
//   dense-stream   report 003: a dense transformer forward (36 layers, hidden
//                  2560, bf16, 4096 tokens), each layer's weights uploaded ->
//                  used by its matmuls -> dropped, the next layer's prefetched on
//                  a copy stream; then a full-vocabulary logits projection (vocab
//                  151936) in chunks of at most 65536 rows, each reduced.
//   moe-offload    report 000: 4 MoE layers x 16 experts (hidden 1024,
//                  intermediate 512, bf16, top-4), the experts in host banks, a
//                  device expert cache (OffloadCache), a seeded Zipf-skewed routing
//                  trace (4 tokens per step, 64 steps), prefetch of the experts a
//                  pre-gate predicts for the next layer (right 80% of the time),
//                  and optionally host execution of misses instead of fetching.
//   dequant-train  report 003's second account: 260 frozen int8 weights (65 blocks
//                  of qkv/o/up/down, hidden 4096, 4096 tokens, LoRA rank 16), each
//                  uploaded, dequantized for one matmul and dropped, forward and
//                  backward, with the inputs of every matmul saved for backward,
//                  in a pool sized so that peak live is ~83% of its capacity.
//
// Every weight matmul (the projections, the experts, the dequantized weights
// forward and backward) is an Exec::matmul; everything else (attention,
// activations, residual adds, LoRA, reductions) is a "kernel", a ComputeOp: its
// output is mix_kernel(inputs) (content.hpp), it carries the modeled FLOPs and
// bytes of the real operation, so the virtual clock gives realistic times, and
// any ordering or reuse bug changes the bytes. A residual add or LoRA term after
// a matmul is an in-place kernel over the matmul's output. Every fill and
// every kernel output is in the small_bf16 pattern (integers in [-2, 2]); GEMM
// outputs are larger integers, read only by kernels.
// --matmul picks what a matmul is:
//   gemm  a real bf16 GEMM (a user op): cuBLAS on cuda, the host definition
//         (gemm.hpp) on sim. Its operands are small_bf16, so FP32 sums them
//         exactly and the host reference agrees to the bit; the reference
//         computes every GEMM on the host (its cost grows as scale^3). Weights
//         from a file must then hold bf16 integers in [-2, 2] too.
//   mix   a ComputeOp like the other kernels, charged the matmul's FLOPs: cheap
//         on a CPU, any weights, same schedule and memory.
//   Default: gemm on cuda, mix on sim.
// Every workload ends in a small digest kernel over its outputs, downloaded and
// compared with the host reference.
//
// Scale (--scale S, 0 < S <= 1): every width (hidden, intermediate, vocab,
// chunk) and every token count except MoE's is multiplied by S (rounded to a
// multiple of 8); layer, expert, weight and step counts do not change. So every
// buffer shrinks by ~S^2 and the allocation pattern and pressure are kept. Each
// kernel is charged the cost of its scaled shape at the nominal token count
// (FLOPs / S where the token count was scaled), so compute time shrinks like
// transfer time (~S^2) and the compute/transfer balance — hence the overlap
// figures — are those of the full shape (fixed per-op latencies excepted).
// Throughput is reported at full shape: nominal tokens / (virtual wall / S^2).
//
// Overlap efficiency = max(transfer busy, compute busy) / wall, on the virtual
// clock. Busy times are summed per engine from each operation's modeled
// duration (the sim's own formula: latency + bytes / bandwidth for copies;
// latency + max(FLOPs / rate, bytes / memory bandwidth) for kernels, hashes
// included) by an adaptor in front of the backend that sees every operation
// enqueued — the transfer engine's hashes, canaries and retries included.
// Injected completion delays are not counted as busy time. Over N devices
// (WorkloadOptions::devices) the busy times are summed over the devices and
// overlap = max(transfer, compute) / (N x wall); each device's own figures are in
// WorkloadReport::devices (docs/workloads.md, "Several devices").
//
// Thread safety: run_workload is reentrant (each call builds its own backend,
// pool, arena, engine and cache); it blocks for the whole run. The progress
// callback is called from the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/devices.hpp"
#include "ferry/integrity.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/result.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/weight_bank.hpp"

namespace ferry FERRY_API {

enum class WorkloadKind : std::uint8_t { dense_stream, moe_offload, dequant_train };

// What a workload's matmul is (see above). automatic: gemm on cuda, mix on sim.
enum class MatmulKind : std::uint8_t { automatic, mix, gemm };
std::string_view to_string(MatmulKind kind) noexcept;  // "auto", "mix", "gemm"
// Errors: invalid_argument naming the text and the choices.
Result<MatmulKind> parse_matmul_kind(std::string_view text);

std::string_view to_string(WorkloadKind kind) noexcept;  // "dense-stream", ...
// Errors: invalid_argument naming the text and the workloads.
Result<WorkloadKind> parse_workload(std::string_view text);
std::vector<std::string> workload_names();
// The scale `ferry run` uses when none is given: small enough that the workload
// runs in seconds on a 2-core machine under a sanitized debug build.
double default_scale(WorkloadKind kind) noexcept;
// The smallest --scale the workload accepts: below it the sim's scaled pool can
// no longer be planned (granules stop shrinking at 4 KiB) and runs end in
// out_of_memory or worse, so run_workload refuses it (invalid_argument).
double min_scale(WorkloadKind kind) noexcept;

struct WorkloadProgress {
  std::string_view phase;  // "forward", "backward", "logits", "step", ...
  std::uint64_t done = 0;  // units finished (layers, weights, steps)
  std::uint64_t total = 0;
};

struct WorkloadOptions {
  BackendKind backend = BackendKind::sim;
  std::string profile = "h200";     // sim device profile (scaled, see above)
  double scale = 0;                 // 0: default_scale(kind)
  std::uint64_t capacity = 0;       // pool bytes; 0: planned peak live / target_pressure
  double target_pressure = 0.83;    // used only when capacity == 0
  IntegrityPolicy integrity = IntegrityPolicy::verify;
  SimFaults faults{};               // sim only
  EvictionPolicy policy = EvictionPolicy::lru;  // moe-offload's expert cache
  bool prefetch = true;
  bool host_exec = false;           // moe-offload: run misses on the host
  MatmulKind matmul = MatmulKind::automatic;
  std::uint32_t cache_slots = 0;    // moe-offload: 0 = 32 (of 64 experts)
  std::string weights_path;         // a safetensors file; empty: synthetic bank
  BankPlacement placement = BankPlacement::registered;
  std::uint64_t seed = 1;           // weights, routing trace and the sim's schedule
  bool race_check = false;          // sim: report stream races (race.hpp); a race fails the run
  // Host model for moe-offload's host execution (sim): a missed expert costs
  // max(FLOPs / host_flops_per_s, expert bytes / host_bytes_per_s) + 2 us
  // (cost_model.hpp's roofline_ns).
  double host_flops_per_s = 1.0e12;
  double host_bytes_per_s = 40e9;
  // Devices (docs/workloads.md, "Several devices"): 1 runs as it always did. N > 1
  // (up to kMaxWorkloadDevices) builds one Runtime over N devices of `profile`,
  // each with its own pool (of `capacity` each, or planned per device),
  // arena, engine and, for moe-offload, expert cache: moe-offload places every
  // layer's experts over them with one MultiDeviceCache (expert e of layer l on
  // device (16 l + e) mod N, a layer's excess moved to the least loaded device,
  // which fills it from a peer or the host), dense-stream its layers
  // (contiguous runs, a pipeline); activations cross with Runtime::copy_peer.
  // dequant-train runs on one device only.
  std::uint32_t devices = 1;
  // With devices > 1: the one device `faults` are injected on (the others get
  // none); unset: every device gets them.
  std::optional<std::uint32_t> fault_device;
  // With devices > 1 on the sim: the peer links between them (devices.hpp). Unset:
  // every pair NVLink-connected when the profile has NVLink (an HGX board's
  // NVSwitch: h200; rtx3090, tiny), none otherwise (rtx4090: no NVLink, and its
  // driver gives no PCIe peer access), so copies stage through the host. An
  // empty list: no link. A real backend takes none (cuda refuses links: its
  // driver says which pairs are linked).
  std::optional<std::vector<PeerLinkSpec>> links;
  std::function<void(const WorkloadProgress&)> progress;  // optional
};

// The most devices `ferry run` spreads a workload over.
inline constexpr std::uint32_t kMaxWorkloadDevices = 8;

// What one device of a several-device run did (WorkloadReport::devices).
struct WorkloadDeviceReport {
  std::uint32_t index = 0;
  std::string device;                      // its profile / device name
  std::string faults;                      // the faults injected on it ("none")
  // Its pool.
  std::uint64_t capacity = 0, planned_peak_live = 0, peak_live_bytes = 0, peak_reserved_bytes = 0;
  std::uint64_t ooms = 0, ooms_survived = 0, reclaims = 0;
  // Its transfer engine and its backend's injected-fault counters.
  IntegrityCounters integrity;
  std::uint64_t swallowed_copies = 0, failed_maps = 0, illegal_accesses = 0;
  std::uint64_t peer_copies_in = 0;        // copy_peer calls that landed on it
  std::uint64_t peer_bytes_in = 0;
  std::uint64_t peer_direct_in = 0;        // of them, over the pair's link (the rest staged through the host)
  std::uint64_t peer_copies_out = 0;       // copy_peer calls that read it
  std::uint64_t peer_bytes_out = 0;
  // Its clock: from the run's start to its last completion (wall_ns), its engines' busy time.
  std::uint64_t wall_ns = 0, transfer_busy_ns = 0, compute_busy_ns = 0, host_busy_ns = 0;
  double overlap_efficiency = 0;           // max(transfer, compute) / its wall
  std::uint64_t units = 0;                 // layers (dense-stream) / expert runs (moe-offload) it ran
  std::string unit_name;
  std::uint64_t tokens = 0;                // nominal tokens of its work (docs/workloads.md)
  // What `tokens` counts: "tokens" (dense-stream: every token passes every device),
  // "token-expert passes" (moe-offload: a token counts once per expert it visits).
  std::string tokens_unit;
  double tokens_per_s = 0;                 // tokens / its wall, at full shape; 0 unless completed
  bool has_cache = false;
  CacheStats cache;  // fills: entries filled from another device's copy (moe-offload)
  std::uint32_t cache_slots = 0;
};

struct WorkloadReport {
  std::string workload, backend, device, shape, weights;
  double scale = 1;
  std::uint64_t seed = 0;
  std::string integrity_policy, eviction_policy, faults;
  bool prefetch = true, host_exec = false;
  std::string matmul;  // "gemm" or "mix", as it ran
  bool modeled_time = false;  // the backend's clock is virtual: figures are modeled

  // Time (virtual on sim), from the first operation of the run to the digest's download.
  std::uint64_t wall_ns = 0;
  std::uint64_t transfer_busy_ns = 0;  // copy engines (H2D and D2H), summed
  std::uint64_t compute_busy_ns = 0;   // compute engine: kernels, fills, hashes
  std::uint64_t host_busy_ns = 0;      // moe-offload host execution (modeled)
  double overlap_efficiency = 0;       // max(transfer, compute) / wall
  std::uint64_t tokens = 0;            // nominal tokens processed (full shape)
  double tokens_per_s = 0;             // at full shape, see the header comment; 0 unless completed
  std::uint64_t units = 0;             // layers / steps / weight passes run
  std::string unit_name;

  // Memory.
  std::uint64_t capacity = 0;              // the pool's capacity as it ran
  std::uint64_t planned_peak_live = 0;     // from a dry run of the same schedule
  std::uint64_t peak_live_bytes = 0;       // pool peak of requested live bytes
  std::uint64_t peak_reserved_bytes = 0;   // pool peak of mapped memory
  double fragmentation_ratio = 0;          // peak reserved / peak live
  double pressure = 0;                     // peak live / capacity
  std::uint64_t ooms = 0;                  // out_of_memory answers the pool gave
  std::uint64_t ooms_survived = 0;         // failed fits a reclaim turned into success
  std::uint64_t reclaims = 0;
  std::uint64_t prefetch_skipped = 0;      // weight prefetches skipped for lack of memory
  // The weight bank (WeightBank::stats): "file", "resident" or "lazy" (synthetic
  // on the sim for workloads that stage every weight: generated per upload).
  std::string weights_storage;
  std::uint64_t weights_bytes = 0;            // sum of its tensors
  std::uint64_t weights_peak_host_bytes = 0;  // peak host bytes holding them

  // Integrity (the transfer engine's counters) and the fault that was injected.
  IntegrityCounters integrity;
  std::uint64_t swallowed_copies = 0;      // sim: copies the pinned-noop fault swallowed
  std::uint64_t failed_maps = 0;           // sim: map() calls the fail-map fault failed
  std::uint64_t illegal_accesses = 0;      // sim: device ops on unmapped memory (must be 0)
  bool race_checked = false;               // sim with race_check: the races below were looked for
  std::uint64_t races = 0;                 // unordered conflicting accesses found (must be 0)
  std::vector<Race> race_list;             // the first ones

  // Cache (moe-offload).
  bool has_cache = false;
  CacheStats cache;
  std::uint32_t cache_slots = 0;
  std::uint64_t host_executed = 0;         // experts run on the host

  // Verdict.
  bool matched = false;
  std::string expected_digest, actual_digest;  // hex of the digest's content hash
  std::string error;                           // why the run failed, if it did
  bool completed = false;  // the schedule ran to its digest; false: it stopped at an error
  std::string stopped_at;  // when not completed: where, e.g. "layers 5/36" (the unit that failed)
  std::optional<ErrorCode> stopped_by;  // when not completed: the error's code

  // Several devices (WorkloadOptions::devices > 1): one entry per device; the
  // figures above are then the totals (docs/workloads.md). Empty with one device.
  std::vector<WorkloadDeviceReport> devices;
  std::string links;  // with several devices: the links they ran with (sim: the model's; cuda: the driver's),
                      // "0-1:nvlink,..." (each pair once, lower device first) or "none"
};

// Runs one workload. Errors (nothing ran): invalid_argument (bad option, a scale
// below min_scale, devices 0 or above kMaxWorkloadDevices, a fault_device not
// below devices, devices > 1 for dequant-train, moe-offload --slots below what its routing pins at once, unknown
// profile, a weights file that is malformed or lacks a tensor of the expected
// dtype and shape), unsupported (backend not available here), backend_error
// (the backend, pool or engine could not be set up). An error while running
// (out_of_memory, transfer_corrupt, ...) is not returned: the report says
// matched = false and carries it in `error`.
Result<WorkloadReport> run_workload(WorkloadKind kind, const WorkloadOptions& options);

// Writes the synthetic bank that `options` (scale, seed) would generate to a
// safetensors file, so that `--weights FILE` reproduces a synthetic run.
// Errors: invalid_argument (bad scale, unwritable path).
Result<void> write_workload_weights(WorkloadKind kind, const WorkloadOptions& options,
                                    const std::string& path);

std::string workload_report_json(const WorkloadReport& report);
std::string workload_report_summary(const WorkloadReport& report);

}  // namespace ferry
