// The seed workloads at small scales: each matches its host reference, also
// under report 000's fault with verify; the schedule's dry run predicts the
// pool's peak; a weights file reproduces the synthetic run; bad inputs are
// clear errors; pressure beyond the pool is a report, not a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>

#include "backend_fixture.hpp"
#include "ferry/cuda_backend.hpp"
#include "ferry/workload.hpp"

namespace ferry {

// Readable parameters in gtest's messages: "dense-stream".
void PrintTo(WorkloadKind k, std::ostream* os) { *os << to_string(k); }

namespace {

double small_scale(WorkloadKind k) {
  switch (k) {
    case WorkloadKind::dense_stream: return 0.03125;
    case WorkloadKind::moe_offload: return 0.0625;
    case WorkloadKind::dequant_train: return 0.03125;
  }
  return 0.03125;
}

WorkloadOptions small(WorkloadKind k) {
  WorkloadOptions o;
  o.scale = small_scale(k);
  return o;
}

std::string temp_file(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("ferry_workload_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

WorkloadReport run_ok(WorkloadKind k, const WorkloadOptions& o) {
  auto r = run_workload(k, o);
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : WorkloadReport{};
}

class EachWorkload : public ::testing::TestWithParam<WorkloadKind> {};

// Instance names: All/EachWorkload.Test/dense_stream.
std::string kind_name(const ::testing::TestParamInfo<WorkloadKind>& info) {
  std::string n(to_string(info.param));
  for (char& c : n) c = c == '-' ? '_' : c;
  return n;
}

TEST_P(EachWorkload, MatchesTheHostReference) {
  std::uint64_t last_done = 0, last_total = 0;
  WorkloadOptions o = small(GetParam());
  o.progress = [&](const WorkloadProgress& p) {
    last_done = p.done;
    last_total = p.total;
  };
  const WorkloadReport r = run_ok(GetParam(), o);
  EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
  EXPECT_EQ(r.expected_digest, r.actual_digest);
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.illegal_accesses, 0u);
  EXPECT_EQ(r.integrity.mismatches, 0u);
  EXPECT_GT(r.integrity.bytes_verified, 0u);
  EXPECT_LE(r.integrity.bytes_verified, r.integrity.bytes_moved);
  EXPECT_GT(r.wall_ns, 0u);
  EXPECT_GT(r.tokens_per_s, 0);
  EXPECT_GT(r.overlap_efficiency, 0.3);
  EXPECT_LE(r.overlap_efficiency, 1.05);
  // The dry run predicts the pool's peak (the engine's own scratch aside).
  EXPECT_GE(r.peak_live_bytes, r.planned_peak_live);
  EXPECT_LE(r.peak_live_bytes, r.planned_peak_live + r.planned_peak_live / 50);
  // Default capacity: planned peak / 0.83, in whole granules.
  EXPECT_NEAR(r.pressure, 0.83, 0.04);
  EXPECT_GE(r.fragmentation_ratio, 1.0);
  EXPECT_EQ(last_done, last_total);
  EXPECT_GT(last_total, 0u);
  // Issue 15 item 1: on the sim a workload that stages every weight generates each
  // tensor when it is uploaded and drops it after, so its synthetic bank never
  // sits whole in host memory (dense-stream at scale 1 needed 7.5 GiB for it).
  EXPECT_GT(r.weights_bytes, 0u);
  if (GetParam() == WorkloadKind::moe_offload) {
    EXPECT_EQ(r.weights_storage, "resident") << "the expert cache holds its host pieces for the run";
    EXPECT_GE(r.weights_peak_host_bytes, r.weights_bytes);
  } else {
    EXPECT_EQ(r.weights_storage, "lazy");
    EXPECT_LT(r.weights_peak_host_bytes * 4, r.weights_bytes)
        << "peak " << r.weights_peak_host_bytes << " of " << r.weights_bytes << " bytes";
  }
  const std::string json = workload_report_json(r);
  EXPECT_NE(json.find("\"matched\":true"), std::string::npos);
  EXPECT_NE(workload_report_summary(r).find("verdict: MATCHED"), std::string::npos);
}

TEST_P(EachWorkload, MatchesUnderPinnedNoopWithVerify) {
  WorkloadOptions o = small(GetParam());
  o.faults.pinned_noop = 1;
  o.integrity = IntegrityPolicy::verify;
  const WorkloadReport r = run_ok(GetParam(), o);
  EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
  EXPECT_GT(r.swallowed_copies, 0u) << "the fault must have fired";
  EXPECT_GT(r.integrity.mismatches, 0u);
  EXPECT_EQ(r.integrity.corrupt, 0u);
}

// Under the race checker every workload's streams are ordered: the engine's,
// the cache's and the workload's own waits leave no unordered conflicting access.
TEST_P(EachWorkload, HasNoStreamRace) {
  WorkloadOptions o = small(GetParam());
  o.race_check = true;
  const WorkloadReport r = run_ok(GetParam(), o);
  EXPECT_TRUE(r.race_checked);
  EXPECT_EQ(r.races, 0u) << workload_report_summary(r);
  EXPECT_TRUE(r.matched) << r.error;
}

TEST_P(EachWorkload, MatchesWithPrefetchOff) {
  WorkloadOptions o = small(GetParam());
  o.prefetch = false;
  const WorkloadReport r = run_ok(GetParam(), o);
  EXPECT_TRUE(r.matched) << r.error;
  EXPECT_FALSE(r.prefetch);
}

TEST_P(EachWorkload, IsDeterministic) {
  const WorkloadReport a = run_ok(GetParam(), small(GetParam()));
  const WorkloadReport b = run_ok(GetParam(), small(GetParam()));
  EXPECT_EQ(a.wall_ns, b.wall_ns);
  EXPECT_EQ(a.actual_digest, b.actual_digest);
  EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
}

TEST(Workload, AnotherSeedGivesAnotherDigest) {
  WorkloadOptions o = small(WorkloadKind::moe_offload);
  const WorkloadReport a = run_ok(WorkloadKind::moe_offload, o);
  o.seed = 2;
  const WorkloadReport b = run_ok(WorkloadKind::moe_offload, o);
  EXPECT_TRUE(b.matched);
  EXPECT_NE(a.actual_digest, b.actual_digest) << "another seed: other weights and routing";
}

TEST_P(EachWorkload, AWeightsFileReproducesTheSyntheticRun) {
  const std::string path = temp_file(std::string(to_string(GetParam())) + ".safetensors");
  WorkloadOptions o = small(GetParam());
  ASSERT_TRUE(write_workload_weights(GetParam(), o, path).ok());
  const WorkloadReport synthetic = run_ok(GetParam(), o);
  o.weights_path = path;
  o.placement = BankPlacement::arena;
  const WorkloadReport file = run_ok(GetParam(), o);
  EXPECT_TRUE(file.matched) << file.error;
  EXPECT_EQ(file.actual_digest, synthetic.actual_digest);
  EXPECT_EQ(file.weights, path);
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(All, EachWorkload,
                         ::testing::Values(WorkloadKind::dense_stream, WorkloadKind::moe_offload,
                                           WorkloadKind::dequant_train),
                         kind_name);

// --matmul gemm on sim: every weight matmul is a real bf16 GEMM (the host
// definition), checked bit for bit against a reference that runs its own GEMMs.
// Smaller scales than the mix runs: the GEMMs cost scale^3.
WorkloadOptions gemm_small(WorkloadKind k) {
  WorkloadOptions o;
  o.scale = k == WorkloadKind::dequant_train ? 0.015625 : small_scale(k);
  o.matmul = MatmulKind::gemm;
  return o;
}

class EachWorkloadGemm : public ::testing::TestWithParam<WorkloadKind> {};

TEST_P(EachWorkloadGemm, MatchesTheHostReference) {
  const WorkloadReport r = run_ok(GetParam(), gemm_small(GetParam()));
  EXPECT_EQ(r.matmul, "gemm");
  EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
  EXPECT_EQ(r.illegal_accesses, 0u);
  EXPECT_NE(workload_report_json(r).find("\"matmul\":\"gemm\""), std::string::npos);
  EXPECT_NE(workload_report_summary(r).find("host GEMM"), std::string::npos);
  // Same schedule, other values: the digest is not the mix run's.
  WorkloadOptions mix = gemm_small(GetParam());
  mix.matmul = MatmulKind::mix;
  const WorkloadReport m = run_ok(GetParam(), mix);
  EXPECT_TRUE(m.matched) << m.error;
  EXPECT_EQ(m.matmul, "mix");
  EXPECT_NE(m.actual_digest, r.actual_digest);
  EXPECT_EQ(m.planned_peak_live, r.planned_peak_live);
}

TEST_P(EachWorkloadGemm, MatchesUnderPinnedNoopWithVerify) {
  WorkloadOptions o = gemm_small(GetParam());
  o.faults.pinned_noop = 1;
  const WorkloadReport r = run_ok(GetParam(), o);
  EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
  EXPECT_GT(r.swallowed_copies, 0u) << "the fault must have fired";
  EXPECT_EQ(r.integrity.corrupt, 0u);
}

TEST_P(EachWorkloadGemm, IntegrityOffLetsTheFaultThroughAndTheCheckCatchesIt) {
  WorkloadOptions o = gemm_small(GetParam());
  o.faults.pinned_noop = 1;
  o.integrity = IntegrityPolicy::off;
  const WorkloadReport r = run_ok(GetParam(), o);
  EXPECT_GT(r.swallowed_copies, 0u);
  EXPECT_FALSE(r.matched);
}

INSTANTIATE_TEST_SUITE_P(All, EachWorkloadGemm,
                         ::testing::Values(WorkloadKind::dense_stream, WorkloadKind::moe_offload,
                                           WorkloadKind::dequant_train),
                         kind_name);

// On a GPU: the same runs on the cuda backend, where a matmul is a cuBLAS GEMM
// (MatmulKind::automatic) checked bit for bit against the host's GEMMs. SKIP
// without a device.
TEST_P(EachWorkloadGemm, CudaMatchesWithCublas) {
  FERRY_SKIP_WITHOUT_BACKEND("cuda");  // a device whose backend fails to start fails here
  WorkloadOptions o = gemm_small(GetParam());
  o.backend = BackendKind::cuda;
  o.matmul = MatmulKind::automatic;
  const WorkloadReport r = run_ok(GetParam(), o);
  EXPECT_EQ(r.matmul, "gemm");
  EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
  EXPECT_NE(workload_report_summary(r).find("cuBLAS GEMM"), std::string::npos);
  EXPECT_EQ(r.integrity.corrupt, 0u);
}

TEST(Workload, GemmHostExecutionMatches) {
  WorkloadOptions o = gemm_small(WorkloadKind::moe_offload);
  o.host_exec = true;
  o.cache_slots = 16;
  const WorkloadReport r = run_ok(WorkloadKind::moe_offload, o);
  EXPECT_TRUE(r.matched) << r.error;
  EXPECT_GT(r.host_executed, 0u);
}

TEST(Workload, GemmNeedsWeightsItSumsExactlyAndMixTakesAny) {
  const std::string path = temp_file("gemm-weights.safetensors");
  WorkloadOptions o = gemm_small(WorkloadKind::moe_offload);
  ASSERT_TRUE(write_workload_weights(WorkloadKind::moe_offload, o, path).ok());
  {  // The first element of the data section becomes bf16 3.0 (0x4040).
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    unsigned char n[8];
    f.read(reinterpret_cast<char*>(n), 8);
    std::uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | n[i];
    f.seekp(static_cast<std::streamoff>(8 + header));
    const char three[2] = {0x40, 0x40};
    f.write(three, 2);
  }
  o.weights_path = path;
  auto gemm = run_workload(WorkloadKind::moe_offload, o);
  ASSERT_FALSE(gemm.ok());
  EXPECT_EQ(gemm.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(gemm.error().message.find("element 0 is 3"), std::string::npos) << gemm.error().message;
  EXPECT_NE(gemm.error().message.find("--matmul mix"), std::string::npos) << gemm.error().message;
  o.matmul = MatmulKind::mix;
  const WorkloadReport mix = run_ok(WorkloadKind::moe_offload, o);
  EXPECT_TRUE(mix.matched) << mix.error;
  std::filesystem::remove(path);
}

TEST(Workload, IntegrityOffLetsTheFaultThroughAndTheCheckCatchesIt) {
  WorkloadOptions o = small(WorkloadKind::dense_stream);
  o.faults.pinned_noop = 1;
  o.integrity = IntegrityPolicy::off;
  const WorkloadReport r = run_ok(WorkloadKind::dense_stream, o);
  EXPECT_GT(r.swallowed_copies, 0u);
  EXPECT_FALSE(r.matched);
  EXPECT_NE(r.expected_digest, r.actual_digest);
}

TEST(Workload, MoePoliciesAndHostExecutionMatch) {
  double hit[3] = {};
  for (auto p : {EvictionPolicy::lru, EvictionPolicy::lfu, EvictionPolicy::optimal}) {
    WorkloadOptions o = small(WorkloadKind::moe_offload);
    o.policy = p;
    o.prefetch = false;
    const WorkloadReport r = run_ok(WorkloadKind::moe_offload, o);
    EXPECT_TRUE(r.matched) << to_string(p) << ": " << r.error;
    ASSERT_TRUE(r.has_cache);
    hit[static_cast<int>(p)] = r.cache.hit_rate();
  }
  EXPECT_GE(hit[2], hit[0]);
  EXPECT_GE(hit[2], hit[1]);
  WorkloadOptions o = small(WorkloadKind::moe_offload);
  o.host_exec = true;
  o.cache_slots = 16;
  const WorkloadReport r = run_ok(WorkloadKind::moe_offload, o);
  EXPECT_TRUE(r.matched) << r.error;
  EXPECT_GT(r.host_executed, 0u);
  EXPECT_GT(r.host_busy_ns, 0u);
  EXPECT_EQ(r.host_executed, r.cache.misses);
}

TEST(Workload, PressureBeyondThePoolIsAReportNotACrash) {
  WorkloadOptions o = small(WorkloadKind::dequant_train);
  o.capacity = 256 * 1024;
  auto r = run_workload(WorkloadKind::dequant_train, o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->matched);
  EXPECT_NE(r->error.find("out_of_memory"), std::string::npos) << r->error;
  EXPECT_GT(r->ooms, 0u);
}

TEST(Workload, TighterPoolsAreSurvivedByReclaim) {
  WorkloadOptions o = small(WorkloadKind::dense_stream);
  o.target_pressure = 0.97;
  const WorkloadReport r = run_ok(WorkloadKind::dense_stream, o);
  EXPECT_TRUE(r.matched) << r.error;
  EXPECT_GT(r.ooms_survived + r.prefetch_skipped, 0u) << workload_report_summary(r);
}

TEST(Workload, BadInputsAreClearErrors) {
  WorkloadOptions o;
  o.scale = 1.5;
  EXPECT_EQ(run_workload(WorkloadKind::dense_stream, o).error().code, ErrorCode::invalid_argument);
  o = small(WorkloadKind::dense_stream);
  o.profile = "a100";
  EXPECT_EQ(run_workload(WorkloadKind::dense_stream, o).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(parse_backend_kind("tpu").error().code, ErrorCode::invalid_argument);
  o = small(WorkloadKind::dense_stream);
  o.weights_path = "/nonexistent/w.safetensors";
  auto missing = run_workload(WorkloadKind::dense_stream, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(missing.error().message.find("/nonexistent/w.safetensors"), std::string::npos);

  // A valid file for another workload lacks the tensors: the message names one.
  const std::string path = temp_file("moe-for-dense.safetensors");
  ASSERT_TRUE(write_workload_weights(WorkloadKind::moe_offload, small(WorkloadKind::moe_offload), path).ok());
  o.weights_path = path;
  auto wrong = run_workload(WorkloadKind::dense_stream, o);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(wrong.error().message.find("is missing"), std::string::npos) << wrong.error().message;
  // The same file at another scale has the right names and the wrong shapes.
  WorkloadOptions moe = small(WorkloadKind::moe_offload);
  moe.scale = 0.125;
  moe.weights_path = path;
  auto shape = run_workload(WorkloadKind::moe_offload, moe);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.error().message.find("expected BF16"), std::string::npos) << shape.error().message;
  std::filesystem::remove(path);

  if (!cuda_backend_built()) {
    o = small(WorkloadKind::dense_stream);
    o.backend = BackendKind::cuda;
    auto cuda = run_workload(WorkloadKind::dense_stream, o);
    ASSERT_FALSE(cuda.ok());
    EXPECT_EQ(cuda.error().code, ErrorCode::unsupported);
    EXPECT_NE(cuda.error().message.find("not available"), std::string::npos);
  }
}

TEST(Workload, NamesAndDefaults) {
  for (const std::string& n : workload_names()) {
    auto k = parse_workload(n);
    ASSERT_TRUE(k.ok());
    EXPECT_EQ(to_string(*k), n);
    EXPECT_GT(default_scale(*k), 0);
    EXPECT_LE(default_scale(*k), 1);
  }
  EXPECT_FALSE(parse_workload("dense").ok());
  for (MatmulKind k : {MatmulKind::automatic, MatmulKind::mix, MatmulKind::gemm}) {
    auto parsed = parse_matmul_kind(to_string(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(parse_matmul_kind("cublas").error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(run_ok(WorkloadKind::moe_offload, small(WorkloadKind::moe_offload)).matmul, "mix")
      << "auto is mix on sim";
}

// --- Several devices (docs/workloads.md) ---------------------------------------------

WorkloadOptions on_two(WorkloadKind k) {
  WorkloadOptions o = small(k);
  o.devices = 2;
  return o;
}

class TwoDevices : public ::testing::TestWithParam<WorkloadKind> {};

// Split over two devices, a workload computes what it does on one (the host
// reference is the same), and each device's figures add up to the totals.
TEST_P(TwoDevices, MatchTheHostReferenceAndTheirFiguresAddUp) {
  const WorkloadReport one = run_ok(GetParam(), small(GetParam()));
  const WorkloadReport r = run_ok(GetParam(), on_two(GetParam()));
  EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
  EXPECT_EQ(r.expected_digest, one.expected_digest);
  EXPECT_EQ(r.actual_digest, r.expected_digest);
  ASSERT_EQ(r.devices.size(), 2u);
  std::uint64_t moved = 0, verified = 0, capacity = 0, peak = 0, transfer = 0, compute = 0, units = 0, wall = 0;
  for (std::uint32_t i = 0; i < 2; ++i) {
    const WorkloadDeviceReport& d = r.devices[i];
    SCOPED_TRACE("device " + std::to_string(i));
    EXPECT_EQ(d.index, i);
    EXPECT_EQ(d.device, one.device);
    EXPECT_GT(d.integrity.bytes_verified, 0u) << "each device uploads its own weights, verified";
    EXPECT_LE(d.integrity.bytes_verified, d.integrity.bytes_moved);
    EXPECT_EQ(d.integrity.mismatches, 0u);
    EXPECT_GT(d.peak_live_bytes, 0u);
    EXPECT_LE(d.peak_live_bytes, d.capacity);
    EXPECT_GE(d.peak_live_bytes, d.planned_peak_live);
    EXPECT_GT(d.units, 0u);
    EXPECT_GT(d.transfer_busy_ns, 0u);
    EXPECT_GT(d.compute_busy_ns, 0u);
    EXPECT_GT(d.wall_ns, 0u);
    EXPECT_GT(d.overlap_efficiency, 0);
    EXPECT_LE(d.overlap_efficiency, 1.05);
    EXPECT_GT(d.tokens_per_s, 0);
    EXPECT_EQ(d.illegal_accesses, 0u);
    moved += d.integrity.bytes_moved, verified += d.integrity.bytes_verified;
    capacity += d.capacity, peak += d.peak_live_bytes;
    transfer += d.transfer_busy_ns, compute += d.compute_busy_ns;
    units += d.units;
    wall = std::max(wall, d.wall_ns);
  }
  EXPECT_EQ(moved, r.integrity.bytes_moved);
  EXPECT_EQ(verified, r.integrity.bytes_verified);
  EXPECT_EQ(capacity, r.capacity);
  EXPECT_EQ(peak, r.peak_live_bytes);
  EXPECT_EQ(transfer, r.transfer_busy_ns);
  EXPECT_EQ(compute, r.compute_busy_ns);
  EXPECT_EQ(wall, r.wall_ns) << "the run's wall is the latest device clock";
  EXPECT_GT(r.devices[1].peer_copies_in, 0u) << "device 1 works on activations device 0 made";
  EXPECT_EQ(r.devices[0].peer_copies_in + r.devices[1].peer_copies_in,
            r.devices[0].peer_copies_out + r.devices[1].peer_copies_out);
  EXPECT_EQ(r.devices[1].peer_copies_in, r.devices[0].peer_copies_out);
  EXPECT_EQ(r.links, "0-1:nvlink") << "h200 pairs default to NVLink";
  for (const WorkloadDeviceReport& d : r.devices) EXPECT_EQ(d.peer_direct_in, d.peer_copies_in) << "over the link";
  if (GetParam() == WorkloadKind::moe_offload) {
    // A peer fill pins its source once: one acquire more than the expert runs.
    EXPECT_EQ(units + r.cache.fills, r.cache.hits + r.cache.misses) << "one acquire per expert run";
    EXPECT_EQ(r.devices[0].cache.hits + r.devices[1].cache.hits, r.cache.hits);
    EXPECT_EQ(r.devices[0].cache_slots + r.devices[1].cache_slots, r.cache_slots);
    EXPECT_GT(r.devices[0].peer_copies_in, 0u) << "expert outputs come back for the combine";
  } else {
    EXPECT_EQ(units, r.units) << "every layer runs on one device";
    EXPECT_EQ(r.devices[0].peer_copies_in, 0u) << "the pipeline hands over once, forward";
    EXPECT_EQ(r.devices[1].peer_copies_in, 1u);
  }
  const std::string summary = workload_report_summary(r);
  EXPECT_NE(summary.find("device 0"), std::string::npos) << summary;
  EXPECT_NE(summary.find("device 1"), std::string::npos) << summary;
}

// Report 000's fault on one device's pinned path is caught by that device's
// engine; the other device's counters show nothing of it.
TEST_P(TwoDevices, AFaultOnOneDeviceIsCaughtThereOnly) {
  for (std::uint32_t faulty : {0u, 1u}) {
    SCOPED_TRACE("faulty device " + std::to_string(faulty));
    WorkloadOptions o = on_two(GetParam());
    // The modeled fault follows pinned churn: at the smallest scale device 0's 18 layers churn too little.
    o.scale = default_scale(GetParam());
    o.faults.pinned_noop = 1;
    o.fault_device = faulty;
    const WorkloadReport r = run_ok(GetParam(), o);
    EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
    ASSERT_EQ(r.devices.size(), 2u);
    const WorkloadDeviceReport& bad = r.devices[faulty];
    const WorkloadDeviceReport& good = r.devices[1 - faulty];
    EXPECT_GT(bad.swallowed_copies, 0u) << "the fault must have fired";
    EXPECT_GT(bad.integrity.mismatches, 0u);
    EXPECT_GT(bad.integrity.recovered, 0u);
    EXPECT_EQ(bad.integrity.corrupt, 0u);
    EXPECT_EQ(good.swallowed_copies, 0u);
    EXPECT_EQ(good.integrity.mismatches, 0u);
    EXPECT_EQ(good.integrity.retries, 0u);
    EXPECT_EQ(good.integrity.recovered, 0u);
    EXPECT_EQ(good.faults, "none");
    EXPECT_EQ(r.swallowed_copies, bad.swallowed_copies);
  }
}

// The links decide how the devices' copies go (docs/workloads.md): over NVLink
// directly, with moe-offload's moved experts filled from the device holding them;
// over PCIe directly, but an expert comes from the host (the cost model: a PCIe
// pull costs what the host link does); with none, every copy stages through the
// host. The output is the same.
TEST_P(TwoDevices, TheLinksDecideHowCopiesGoAndNotWhatIsComputed) {
  const WorkloadReport nvlink = run_ok(GetParam(), on_two(GetParam()));
  for (const char* links : {"0-1:pcie", ""}) {
    SCOPED_TRACE(std::string("links '") + links + "'");
    WorkloadOptions o = on_two(GetParam());
    o.links = parse_peer_links(links).value();
    const WorkloadReport r = run_ok(GetParam(), o);
    EXPECT_TRUE(r.matched) << r.error << "\n" << workload_report_summary(r);
    EXPECT_EQ(r.actual_digest, nvlink.actual_digest);
    EXPECT_EQ(r.links, *links != 0 ? links : "none");
    ASSERT_EQ(r.devices.size(), 2u);
    for (std::uint32_t i = 0; i < 2; ++i) {
      EXPECT_EQ(r.devices[i].peer_copies_in, nvlink.devices[i].peer_copies_in) << "the same schedule";
      EXPECT_EQ(r.devices[i].peer_direct_in, *links != 0 ? r.devices[i].peer_copies_in : 0u);
    }
    EXPECT_EQ(r.cache.fills, 0u) << "no link faster than the host's";
  }
  if (GetParam() == WorkloadKind::moe_offload) {
    EXPECT_GT(nvlink.cache.fills, 0u) << "a moved expert comes over NVLink from the device holding it";
    EXPECT_EQ(nvlink.devices[0].cache.fills + nvlink.devices[1].cache.fills, nvlink.cache.fills);
  }
}

TEST_P(TwoDevices, AreDeterministic) {
  const WorkloadReport a = run_ok(GetParam(), on_two(GetParam()));
  const WorkloadReport b = run_ok(GetParam(), on_two(GetParam()));
  EXPECT_EQ(workload_report_json(a), workload_report_json(b));
}

INSTANTIATE_TEST_SUITE_P(All, TwoDevices, ::testing::Values(WorkloadKind::dense_stream, WorkloadKind::moe_offload),
                         kind_name);

// A race's sides in the JSON report carry their device (RaceAccess::device), as
// a peer copy's read on the destination's device of the source's bytes has it.
TEST(Workload, TheReportsRaceSidesNameTheirDevices) {
  WorkloadReport r;
  r.race_checked = true;
  r.races = 1;
  Race race;
  race.earlier.device = 1;
  race.earlier.kind = "copy_peer";
  race.later.device = 0;
  race.later.kind = "fill";
  race.later.access = Access::write;
  r.race_list = {race};
  const std::string json = workload_report_json(r);
  EXPECT_NE(json.find(R"("earlier":{"device":1,"stream":0,)"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("later":{"device":0,"stream":0,)"), std::string::npos) << json;
}

// One device, asked for explicitly, is the run it always was: same report, byte for byte.
TEST(Workload, OneDeviceIsTheDefaultRun) {
  WorkloadOptions o = small(WorkloadKind::moe_offload);
  const std::string plain = workload_report_json(run_ok(WorkloadKind::moe_offload, o));
  o.devices = 1;
  o.fault_device = 0;
  const WorkloadReport r = run_ok(WorkloadKind::moe_offload, o);
  EXPECT_EQ(workload_report_json(r), plain);
  EXPECT_TRUE(r.devices.empty());
  EXPECT_EQ(plain.find("\"devices\""), std::string::npos);
}

TEST(Workload, DeviceCountsItCannotRunAreRefused) {
  for (std::uint32_t n : {0u, kMaxWorkloadDevices + 1, 1u << 30}) {
    WorkloadOptions o = small(WorkloadKind::moe_offload);
    o.devices = n;
    auto r = run_workload(WorkloadKind::moe_offload, o);
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message.find("1 to " + std::to_string(kMaxWorkloadDevices)), std::string::npos)
        << r.error().message;
  }
  WorkloadOptions dq = on_two(WorkloadKind::dequant_train);
  auto d = run_workload(WorkloadKind::dequant_train, dq);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(d.error().message.find("one device"), std::string::npos) << d.error().message;
  WorkloadOptions linked = on_two(WorkloadKind::moe_offload);
  linked.links = parse_peer_links("0-2:nvlink").value();
  auto l = run_workload(WorkloadKind::moe_offload, linked);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(l.error().message.find("2"), std::string::npos) << l.error().message;
  WorkloadOptions beyond = on_two(WorkloadKind::dense_stream);
  beyond.fault_device = 2;
  auto f = run_workload(WorkloadKind::dense_stream, beyond);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(f.error().message.find("devices 0 to 1"), std::string::npos) << f.error().message;
}

}  // namespace
}  // namespace ferry
