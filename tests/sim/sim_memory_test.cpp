// The sim's address space, its device "kernels" (bytes must match content.hpp
// exactly), illegal accesses, host memory, and inputs that must be refused.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <random>

#include "core/text.hpp"
#include "ferry/gemm.hpp"
#include "sim_fixture.hpp"

namespace ferry::testing {
namespace {

constexpr std::uint64_t kGranule = 64 * 1024;  // tiny's granularity
constexpr std::uint64_t kBlock = kGranule;

using SimMemory = SimTest;

TEST(SimProfiles, PresetsExistAndAreConsistent) {
  const std::vector<std::string> names = profile_names();
  for (const char* want : {"h200", "rtx4090", "rtx3090", "tiny"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  for (const std::string& name : names) {
    const auto p = find_profile(name);
    ASSERT_TRUE(p.has_value()) << name;
    EXPECT_EQ(p->name, name);
    EXPECT_GT(p->capacity, 0u);
    EXPECT_EQ(p->granularity & (p->granularity - 1), 0u) << name;
    EXPECT_EQ(p->capacity % p->granularity, 0u) << name;
    EXPECT_GT(p->mem_bytes_per_s, p->h2d_bytes_per_s) << name;
    EXPECT_GT(p->h2d_bytes_per_s, p->pageable_bytes_per_s) << name;
    EXPECT_GT(p->flops_per_s, 0) << name;
    EXPECT_GE(p->copy_engines, 1u) << name;
  }
  EXPECT_LE(find_profile("h200")->capacity, 141'000'000'000ull);
  EXPECT_GT(find_profile("h200")->capacity, 140'900'000'000ull);
  EXPECT_EQ(find_profile("tiny")->capacity, 64ull << 20);
  EXPECT_EQ(find_profile("tiny")->copy_engines, 1u);
  EXPECT_FALSE(find_profile("gtx480").has_value());
  EXPECT_FALSE(find_profile("").has_value());
}

TEST_F(SimMemory, DeviceInfoDescribesTheProfile) {
  const DeviceInfo& info = sim->info();
  EXPECT_EQ(info.backend, BackendKind::sim);
  EXPECT_TRUE(info.modeled_time);
  EXPECT_EQ(info.device, "tiny");
  EXPECT_EQ(info.capacity, sim_profile().capacity);
  EXPECT_EQ(info.granularity, kGranule);
  EXPECT_TRUE(info.virtual_memory);
  EXPECT_TRUE(info.batched_copy);
  EXPECT_TRUE(info.host_register);
  EXPECT_EQ(info.h2d_bytes_per_s, sim_profile().h2d_bytes_per_s);
}

TEST_F(SimMemory, ReservationsAreAlignedDisjointAndNeverZero) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = {{base, kRegion}};
  for (const std::uint64_t bytes : std::initializer_list<std::uint64_t>{1, kGranule, 3 * kGranule + 5, 1ull << 30}) {
    auto r = sim->reserve_address(bytes);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_NE(*r, 0u);
    EXPECT_EQ(*r % kGranule, 0u);
    for (const auto& [b, n] : ranges) EXPECT_TRUE(*r >= b + n || *r + bytes <= b);
    ranges.emplace_back(*r, bytes);
  }
  // Released ranges are not handed out again.
  const std::uint64_t old = ranges[1].first;
  ASSERT_TRUE(sim->release_address(old, 1).ok());
  auto again = sim->reserve_address(1);
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, old);
}

TEST_F(SimMemory, MapBeyondCapacityIsOutOfMemory) {
  const std::uint64_t capacity = sim_profile().capacity;
  const std::uint64_t big = sim->reserve_address(capacity).value();
  ASSERT_TRUE(sim->map(big, capacity - kRegion).ok());
  EXPECT_EQ(sim->mapped_bytes(), capacity);
  const auto r = sim->map(big + capacity - kRegion, kGranule);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  EXPECT_EQ(sim->mapped_bytes(), capacity);
  // Unmapping makes room again.
  ASSERT_TRUE(sim->unmap(big, kGranule).ok());
  EXPECT_TRUE(sim->map(big + capacity - kRegion, kGranule).ok());
}

TEST(SimFaultsMap, TheChosenMapCallFails) {
  SimFaults faults;
  faults.fail_map_call = 2;
  auto sim = make_sim_backend(tiny_options(1, faults));
  const std::uint64_t base = sim->reserve_address(4 * kGranule).value();
  EXPECT_TRUE(sim->map(base, kGranule).ok());
  const auto r = sim->map(base + kGranule, kGranule);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(r.error().message.find("injected"), std::string::npos);
  EXPECT_EQ(sim->mapped_bytes(), kGranule);
  EXPECT_TRUE(sim->map(base + kGranule, kGranule).ok());  // only call 2 fails
}

TEST_F(SimMemory, MapAndUnmapRulesAreChecked) {
  const auto code = [](const Result<void>& r) { return r.ok() ? std::optional<ErrorCode>() : r.error().code; };
  const std::uint64_t r = sim->reserve_address(4 * kGranule).value();
  EXPECT_EQ(code(sim->map(r + 1, kGranule)), ErrorCode::invalid_argument);          // unaligned
  EXPECT_EQ(code(sim->map(r, kGranule + 1)), ErrorCode::invalid_argument);          // unaligned size
  EXPECT_EQ(code(sim->map(r, 0)), ErrorCode::invalid_argument);                     // empty
  EXPECT_EQ(code(sim->map(r, 5 * kGranule)), ErrorCode::invalid_argument);          // overruns
  EXPECT_EQ(code(sim->map(r + 4 * kGranule, kGranule)), ErrorCode::invalid_argument);
  EXPECT_EQ(code(sim->map(kGranule, kGranule)), ErrorCode::invalid_argument);       // not reserved
  EXPECT_EQ(code(sim->map(UINT64_MAX - kGranule + 1, kGranule)), ErrorCode::invalid_argument);
  ASSERT_TRUE(sim->map(r + kGranule, 2 * kGranule).ok());
  EXPECT_EQ(code(sim->map(r, 2 * kGranule)), ErrorCode::invalid_argument);          // overlaps
  EXPECT_EQ(code(sim->unmap(r, 2 * kGranule)), ErrorCode::invalid_argument);        // partly unmapped
  EXPECT_EQ(code(sim->release_address(r, 4 * kGranule)), ErrorCode::invalid_argument);  // still mapped
  EXPECT_EQ(sim->mapped_bytes(), kRegion + 2 * kGranule);
  ASSERT_TRUE(sim->unmap(r + kGranule, 2 * kGranule).ok());
  EXPECT_EQ(code(sim->release_address(r + kGranule, 3 * kGranule)), ErrorCode::invalid_argument);
  EXPECT_EQ(code(sim->release_address(r, 8 * kGranule)), ErrorCode::invalid_argument);
  EXPECT_TRUE(sim->release_address(r, 4 * kGranule).ok());
  EXPECT_EQ(code(sim->release_address(r, 4 * kGranule)), ErrorCode::invalid_argument);  // twice
  EXPECT_EQ(code(sim->map(r, kGranule)), ErrorCode::invalid_argument);  // released
}

TEST_F(SimMemory, ReserveRefusesZeroAndAbsurdSizes) {
  auto zero = sim->reserve_address(0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code, ErrorCode::invalid_argument);
  for (const std::uint64_t bytes : std::initializer_list<std::uint64_t>{1ull << 62, 1ull << 63, UINT64_MAX}) {
    auto r = sim->reserve_address(bytes);
    ASSERT_FALSE(r.ok()) << bytes;
    EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  }
}

TEST_F(SimMemory, FreshlyMappedMemoryReadsAsZeros) {
  EXPECT_EQ(device_bytes(base, kRegion), zeros(kRegion));
  ASSERT_TRUE(sim->unmap(base, kGranule).ok());
  ASSERT_TRUE(sim->map(base, kGranule).ok());
  EXPECT_EQ(device_bytes(base, kGranule), zeros(kGranule));
  std::vector<std::byte> out(16);
  EXPECT_FALSE(sim->peek(base + kRegion, out).ok());
  EXPECT_FALSE(sim->peek(0, out).ok());
}

TEST_F(SimMemory, FillsAndCopiesSpanGranules) {
  // Odd offsets and lengths that straddle granule boundaries.
  const std::uint64_t a = base + kGranule - 123;
  const std::uint64_t n = 2 * kGranule + 1000;
  ASSERT_TRUE(sim->enqueue(0, FillOp{{a, n}, 42}).ok());
  const std::uint64_t b = base + 5 * kGranule + 7;
  ASSERT_TRUE(sim->enqueue(0, CopyOnDeviceOp{{b, n}, a}).ok());
  // A partly overlapping device copy has no defined result on a GPU: the op
  // contract refuses it (op_contract.hpp), the same range is a no-op.
  const auto overlapping = sim->enqueue(0, CopyOnDeviceOp{{b + 1000, n}, b});
  ASSERT_FALSE(overlapping.ok());
  EXPECT_EQ(overlapping.error().code, ErrorCode::invalid_argument);
  ASSERT_TRUE(sim->enqueue(0, CopyOnDeviceOp{{b, n}, b}).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(device_bytes(a, n), pattern(42, n));
  EXPECT_EQ(device_bytes(b, n), pattern(42, n));
}

TEST_F(SimMemory, ComputeWritesTheMixOfItsInputs) {
  const std::uint64_t a = base + 100;            // crosses a granule, > one hash chunk
  const std::uint64_t na = kGranule + 5000;
  const std::uint64_t b = base + 3 * kGranule;
  const std::uint64_t nb = 777;
  const std::uint64_t out = base + 6 * kGranule + 3;
  const std::uint64_t nout = kGranule + 9;
  ASSERT_TRUE(sim->enqueue(0, FillOp{{a, na}, 5}).ok());
  ASSERT_TRUE(sim->enqueue(0, FillOp{{b, nb}, 6}).ok());
  ASSERT_TRUE(sim->enqueue(0, ComputeOp{{{a, na}, {b, nb}}, {out, nout}, 1e6, 0}).ok());
  ASSERT_TRUE(sim->synchronize().ok());

  std::uint64_t mix = kMixStart;
  mix = mix_step(mix, 0, content_hash(pattern(5, na)));
  mix = mix_step(mix, 1, content_hash(pattern(6, nb)));
  EXPECT_EQ(device_bytes(out, nout), pattern(mix, nout));
  // The output depends on every input byte: change one and it changes.
  ASSERT_TRUE(sim->enqueue(0, FillOp{{b + 776, 1}, 1}).ok());
  ASSERT_TRUE(sim->enqueue(0, ComputeOp{{{a, na}, {b, nb}}, {out, nout}}).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_NE(device_bytes(out, nout), pattern(mix, nout));
}

TEST_F(SimMemory, ComputeWithoutInputsWritesTheStartPattern) {
  ASSERT_TRUE(sim->enqueue(0, ComputeOp{{}, {base, 100}}).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(device_bytes(base, 100), pattern(kMixStart, 100));
}

TEST_F(SimMemory, HashOpAgreesWithTheHostHash) {
  const std::uint64_t a = base + kGranule / 2;
  const std::uint64_t n = 3 * kGranule + 17;  // several hash chunks, unaligned
  std::uint64_t zero_hash = 0, fill_hash = 0;
  ASSERT_TRUE(sim->enqueue(0, HashOp{{a, n}, &zero_hash}).ok());
  ASSERT_TRUE(sim->enqueue(0, FillOp{{a, n}, 77}).ok());
  ASSERT_TRUE(sim->enqueue(0, HashOp{{a, n}, &fill_hash}).ok());
  EXPECT_EQ(zero_hash, 0u);  // written at completion, not before
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(zero_hash, content_hash(zeros(n)));
  EXPECT_EQ(fill_hash, content_hash(pattern(77, n)));
  EXPECT_EQ(fill_hash, content_hash(device_bytes(a, n)));
}

TEST_F(SimMemory, UnmappedAccessIsCountedAndMakesTheBackendFail) {
  ASSERT_TRUE(sim->enqueue(0, FillOp{{base, kBlock}, 1}).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  // Unmapped between enqueue and completion: the I2 violation the pool must avoid.
  const Ticket t = sim->enqueue(0, FillOp{{base, 2 * kBlock}, 2}).value();
  ASSERT_TRUE(sim->unmap(base + kBlock, kBlock).ok());
  const auto r = sim->wait({0, t}, std::chrono::seconds(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::backend_error);
  EXPECT_NE(r.error().message.find("stream 0 ticket 2"), std::string::npos) << r.error().message;
  EXPECT_EQ(sim->illegal_accesses(), 1u);
  EXPECT_EQ(device_bytes(base, kBlock), pattern(1, kBlock));  // the effect was skipped

  // Sticky: later calls fail too, naming the first bad access.
  const auto again = sim->enqueue(0, NopOp{});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, ErrorCode::backend_error);
  EXPECT_NE(again.error().message.find("stream 0 ticket 2"), std::string::npos);
  EXPECT_EQ(sim->synchronize().error().code, ErrorCode::backend_error);
}

// Memory that is not mapped when its op is enqueued is refused then, as on cuda
// (op_contract_test runs the case on every backend); nothing runs, nothing fails.
TEST_F(SimMemory, AccessOutsideAnyReservationIsRefusedAtEnqueue) {
  std::uint64_t h = 0;
  const auto r = sim->enqueue(2, HashOp{{0x1000, 64}, &h});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("not mapped"), std::string::npos) << r.error().message;
  EXPECT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(sim->illegal_accesses(), 0u);
  EXPECT_EQ(h, 0u);
}

TEST_F(SimMemory, GemmOnUnmappedMemoryIsAnIllegalAccess) {
  const GemmShape shape{32, 32, 32};  // 2 KiB per matrix
  const std::uint64_t a = base, b = base + kGranule, c = base + 2 * kGranule;
  ASSERT_TRUE(sim->enqueue(0, FillOp{{c, shape.c_bytes()}, 4}).ok());
  ASSERT_TRUE(sim->synchronize().ok());
  // b is unmapped between enqueue and completion (an I2 violation).
  const Ticket t = put(0, gemm(0, {a, shape.a_bytes()}, {b, shape.b_bytes()}, {c, shape.c_bytes()}, shape));
  ASSERT_TRUE(sim->unmap(b, kGranule).ok());
  const auto r = sim->wait({0, t}, std::chrono::seconds(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::backend_error);
  // b, the second operand, is read: the GEMM is a user op.
  const std::string named_b = "(user) read " + text::range(b, shape.b_bytes());
  EXPECT_NE(r.error().message.find(named_b), std::string::npos) << r.error().message;
  EXPECT_EQ(sim->illegal_accesses(), 1u);
  EXPECT_EQ(device_bytes(c, shape.c_bytes()), pattern(4, shape.c_bytes()));  // effect skipped
}

TEST_F(SimMemory, GemmWritesTheHostProduct) {
  const GemmShape shape{24, 40, 56, true, false};
  const std::uint64_t a = base + 3 * kGranule - 100;  // operands straddle granules
  const std::uint64_t b = base + 5 * kGranule - 1000;
  const std::uint64_t c = base + 7 * kGranule - 2;
  ASSERT_TRUE(sim->enqueue(0, FillOp{{a, shape.a_bytes()}, 8, Pattern::small_bf16}).ok());
  ASSERT_TRUE(sim->enqueue(0, FillOp{{b, shape.b_bytes()}, 9, Pattern::small_bf16}).ok());
  const Ticket t = put(0, gemm(0, {a, shape.a_bytes()}, {b, shape.b_bytes()}, {c, shape.c_bytes()}, shape));
  EXPECT_EQ(device_bytes(c, shape.c_bytes()), zeros(shape.c_bytes()));  // only at completion
  wait_for(0, t);
  std::vector<std::byte> ha(shape.a_bytes()), hb(shape.b_bytes()), hc(shape.c_bytes());
  fill_small_bf16(8, 0, ha);
  fill_small_bf16(9, 0, hb);
  ASSERT_TRUE(gemm_bf16(shape, ha, hb, hc).ok());
  EXPECT_EQ(device_bytes(c, shape.c_bytes()), hc);
  EXPECT_NE(hc, zeros(shape.c_bytes()));
}

TEST_F(SimMemory, MalformedGemmMessagesNameTheProblem) {
  const GemmShape shape{8, 8, 8};  // 128 B per matrix
  const DeviceRange a{base, 128}, b{base + 1024, 128};
  // make_gemm_op's refusals, then the op contract's at enqueue.
  const auto message = [&](DeviceRange ga, DeviceRange gb, DeviceRange gc, UserCost cost = {}) {
    Result<UserOp> op = make_gemm_op(*sim, 3, ga, gb, gc, shape, cost);
    if (!op.ok()) return op.error().message;
    auto t = sim->enqueue(3, std::move(op).value());
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.error().message;
  };
  const std::string size = message(a, {b.addr, 126}, {base + 2048, 128});
  EXPECT_NE(size.find("stream 3: gemm 8 x 8 x 8 (A, B)"), std::string::npos) << size;
  EXPECT_NE(size.find("b holds 126 B, the shape needs 128 B"), std::string::npos) << size;
  const std::string overlap = message(a, b, {b.addr + 126, 128});
  EXPECT_NE(overlap.find("overlaps b"), std::string::npos) << overlap;
  const std::string zero = message({0, 128}, b, {base + 2048, 128});
  EXPECT_NE(zero.find("enqueue(user) on stream 3: read [0x0"), std::string::npos) << zero;
  const std::string flops = message(a, b, {base + 2048, 128}, {-1.0, 0});
  EXPECT_NE(flops.find("flops"), std::string::npos) << flops;
  EXPECT_EQ(sim->submitted(3), 0u);
}

TEST_F(SimMemory, AnUnknownPatternIsRefusedAtEnqueue) {
  const auto bogus = static_cast<Pattern>(7);
  auto fill = sim->enqueue(3, FillOp{{base, 128}, 1, bogus});
  ASSERT_FALSE(fill.ok());
  EXPECT_EQ(fill.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(fill.error().message.find("unknown pattern 7"), std::string::npos) << fill.error().message;
  auto compute = sim->enqueue(3, ComputeOp{{{base, 128}}, {base + 1024, 128}, 0, 0, bogus});
  ASSERT_FALSE(compute.ok());
  EXPECT_EQ(compute.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(sim->submitted(3), 0u);
}

TEST_F(SimMemory, PinnedMemoryIsCountedAndUsable) {
  auto a = sim->allocate_pinned(1000);
  auto b = sim->allocate_pinned(3 * kBlock);
  ASSERT_TRUE(a.ok() && b.ok());
  std::memset(*a, 0x5a, 1000);  // really writable
  HostMemoryStats s = sim->host_stats();
  EXPECT_EQ(s.pinned_allocs, 2u);
  EXPECT_EQ(s.pinned_bytes, 1000 + 3 * kBlock);
  ASSERT_TRUE(sim->free_pinned(*a).ok());
  s = sim->host_stats();
  EXPECT_EQ(s.pinned_frees, 1u);
  EXPECT_EQ(s.pinned_bytes, 3 * kBlock);

  std::vector<std::byte> range(5000);
  ASSERT_TRUE(sim->register_host(range.data(), range.size()).ok());
  EXPECT_FALSE(sim->register_host(range.data() + 10, 10).ok());  // overlaps
  EXPECT_FALSE(sim->register_host(*b + kBlock, 10).ok());        // inside a pinned buffer
  ASSERT_TRUE(sim->unregister_host(range.data()).ok());
  s = sim->host_stats();
  EXPECT_EQ(s.registrations, 1u);
  EXPECT_EQ(s.unregistrations, 1u);
  ASSERT_TRUE(sim->free_pinned(*b).ok());
}

TEST_F(SimMemory, PinnedBufferStillUsedByQueuedWorkCannotBeFreed) {
  auto buf = sim->allocate_pinned(kBlock);
  ASSERT_TRUE(buf.ok());
  sim->set_hold(0, true);
  const Ticket t = sim->enqueue(0, CopyToDeviceOp{{base, kBlock}, *buf}).value();
  const auto r = sim->free_pinned(*buf);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message.find("stream 0 ticket 1"), std::string::npos) << r.error().message;
  ASSERT_TRUE(sim->wait({0, t}, std::chrono::seconds(1)).ok());
  EXPECT_TRUE(sim->free_pinned(*buf).ok());
}

TEST_F(SimMemory, BadInputsAreErrorsNotCrashes) {
  const auto code_of = [](const auto& r) { return r.ok() ? std::optional<ErrorCode>() : r.error().code; };
  constexpr auto kInvalid = ErrorCode::invalid_argument;
  const std::chrono::nanoseconds second = std::chrono::seconds(1);

  // Streams out of range.
  EXPECT_EQ(code_of(sim->enqueue(kMaxStreams, NopOp{})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(UINT32_MAX, NopOp{})), kInvalid);
  EXPECT_EQ(code_of(sim->flush(kMaxStreams)), kInvalid);
  EXPECT_EQ(code_of(sim->wait({kMaxStreams, 1}, second)), kInvalid);
  EXPECT_EQ(sim->submitted(kMaxStreams), 0u);
  EXPECT_EQ(sim->completed(kMaxStreams), 0u);
  sim->set_hold(kMaxStreams, true);
  EXPECT_FALSE(sim->held(kMaxStreams));

  // Host memory.
  EXPECT_EQ(code_of(sim->allocate_pinned(0)), kInvalid);
  EXPECT_EQ(code_of(sim->allocate_pinned(1ull << 62)), kInvalid);
  EXPECT_EQ(code_of(sim->allocate_pinned(UINT64_MAX)), kInvalid);
  std::byte local[16];
  EXPECT_EQ(code_of(sim->free_pinned(local)), kInvalid);
  EXPECT_EQ(code_of(sim->free_pinned(nullptr)), kInvalid);
  auto buf = sim->allocate_pinned(64);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(code_of(sim->free_pinned(*buf + 1)), kInvalid);  // interior pointer
  ASSERT_TRUE(sim->free_pinned(*buf).ok());
  EXPECT_EQ(code_of(sim->free_pinned(*buf)), kInvalid);  // double free
  EXPECT_EQ(code_of(sim->register_host(nullptr, 16)), kInvalid);
  EXPECT_EQ(code_of(sim->register_host(local, 0)), kInvalid);
  EXPECT_EQ(code_of(sim->register_host(local, 1ull << 62)), kInvalid);
  EXPECT_EQ(code_of(sim->unregister_host(local)), kInvalid);

  // Malformed operations consume no ticket.
  std::uint64_t h = 0;
  EXPECT_EQ(code_of(sim->enqueue(0, CopyToDeviceOp{{base, 16}, nullptr})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, CopyToHostOp{nullptr, {base, 16}})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, FillOp{{0, 16}, 1})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, FillOp{{UINT64_MAX - 4, 16}, 1})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, CopyOnDeviceOp{{base, 16}, UINT64_MAX - 4})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, HashOp{{base, 16}, nullptr})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, ComputeOp{{}, {base, 16}, -1.0})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, ComputeOp{{{0, 8}}, {base, 16}})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, WaitOp{{1, 1}})), kInvalid);            // never enqueued
  EXPECT_EQ(code_of(sim->enqueue(0, WaitOp{{kMaxStreams, 0}})), kInvalid);
  EXPECT_EQ(code_of(sim->enqueue(0, BatchCopyToDeviceOp{{{{base, 8}, nullptr}}})), kInvalid);
  EXPECT_EQ(code_of(sim->wait({0, 1}, second)), kInvalid);                  // never enqueued
  EXPECT_EQ(sim->submitted(0), 0u);
  EXPECT_EQ(sim->enqueue(0, HashOp{{base, 16}, &h}).value_or(0), 1u);
  ASSERT_TRUE(sim->synchronize().ok());

  // Zero-length work is legal and does nothing.
  EXPECT_TRUE(sim->enqueue(0, CopyToDeviceOp{{0, 0}, nullptr}).ok());
  EXPECT_TRUE(sim->enqueue(0, BatchCopyToDeviceOp{}).ok());
  EXPECT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(sim->illegal_accesses(), 0u);
}

TEST(SimOptionsDefault, AnEmptyProfileMeansTiny) {
  auto sim = make_sim_backend(SimOptions{});
  EXPECT_EQ(sim->info().device, "tiny");
  EXPECT_TRUE(sim->validate());
}

// Issue 15 item 1: device memory is sparse and lazy (a fill kept as its pattern,
// granules stored only when written by bytes or in part). Whatever the
// representation, the bytes must be those of a dense model: every kind of write,
// whole granules and odd pieces, against a dense shadow.
TEST_F(SimMemory, SparseBytesMatchADenseShadowThroughEveryKindOfWrite) {
  std::vector<std::byte> shadow(kRegion);  // freshly mapped: zeros
  std::mt19937_64 rng(15);
  const auto pick = [&](std::uint64_t max_bytes) {  // [off, off + n) inside the region
    std::uint64_t n = 0, off = 0;
    if (rng() % 2 == 0) {  // whole granules
      n = kGranule * (1 + rng() % (max_bytes / kGranule));
      off = kGranule * (rng() % ((kRegion - n) / kGranule + 1));
    } else {
      n = 1 + rng() % max_bytes;
      off = rng() % (kRegion - n + 1);
    }
    return std::pair{off, n};
  };
  for (int step = 0; step < 200; ++step) {
    const int kind = static_cast<int>(rng() % 5);
    const auto [off, n] = pick(4 * kGranule);
    std::string what = "step " + std::to_string(step) + " kind " + std::to_string(kind);
    if (kind == 0) {
      const std::uint64_t seed = rng();
      const Pattern p = rng() % 2 == 0 ? Pattern::bytes : Pattern::small_bf16;
      put(0, FillOp{{base + off, n}, seed, p});
      fill_with(p, seed, 0, std::span<std::byte>(shadow.data() + off, n));
    } else if (kind == 1) {
      std::vector<std::byte> src = pattern(rng(), n);
      put(0, CopyToDeviceOp{{base + off, n}, src.data()});
      ASSERT_TRUE(sim->synchronize().ok()) << what;  // src is read at completion
      std::copy(src.begin(), src.end(), shadow.begin() + static_cast<std::ptrdiff_t>(off));
    } else if (kind == 2) {
      std::uint64_t from = 0;  // a source apart from [off, off + n): the op contract refuses overlap
      bool found = false;
      for (int tries = 0; tries < 20 && !found; ++tries) {
        from = rng() % 2 == 0 ? kGranule * (rng() % (kRegion / kGranule)) : rng() % kRegion;
        found = from + n <= kRegion && (from + n <= off || off + n <= from);
      }
      if (!found) continue;
      put(0, CopyOnDeviceOp{{base + off, n}, base + from});
      std::copy_n(shadow.begin() + static_cast<std::ptrdiff_t>(from), n,
                  shadow.begin() + static_cast<std::ptrdiff_t>(off));
    } else if (kind == 3) {
      const auto [in, in_n] = pick(2 * kGranule);
      put(0, ComputeOp{{{base + in, in_n}}, {base + off, n}});
      const std::uint64_t mix =
          mix_step(kMixStart, 0, content_hash({shadow.data() + in, static_cast<std::size_t>(in_n)}));
      fill_pattern(mix, 0, std::span<std::byte>(shadow.data() + off, n));
    } else {
      std::uint64_t h = 0;
      put(0, HashOp{{base + off, n}, &h});
      ASSERT_TRUE(sim->synchronize().ok()) << what;
      EXPECT_EQ(h, content_hash({shadow.data() + off, static_cast<std::size_t>(n)})) << what;
    }
    ASSERT_TRUE(sim->synchronize().ok()) << what;
    ASSERT_EQ(device_bytes(base, kRegion), shadow) << what;
  }
}

// Gigabytes on the h200 profile inside a model limit of 4 granules: a whole
// fill, a compute and a whole-granule copy cost no host bytes; a small partial
// fill stores one granule; every byte reads as a dense model would have it.
TEST_F(SimMemory, AFillOfGigabytesIsKeptAsItsPattern) {
  constexpr std::uint64_t kGiB = 1ull << 30, kMiB = 1ull << 20;
  SimOptions o = tiny_options();
  o.profile = *find_profile("h200");
  o.model_bytes_limit = 8 * kMiB;
  options = o;
  sim = make_sim_backend(o);  // start() maps less than one h200 granule
  const std::uint64_t n = 8 * kGiB;
  const std::uint64_t big = sim->reserve_address(n).value();
  ASSERT_TRUE(sim->map(big, n).ok());
  put(0, FillOp{{big, n}, 3});
  put(0, FillOp{{big + 5 * kGiB + 7, 100}, 4});
  put(0, CopyOnDeviceOp{{big + 6 * kGiB, 2 * kMiB}, big + kGiB});
  put(0, ComputeOp{{{big + 7, 1000}}, {big + 7 * kGiB, kGiB}});
  const std::uint64_t at = 5 * kGiB - kMiB - 5;
  std::uint64_t h = 0;
  put(0, HashOp{{big + at, 3 * kMiB}, &h});
  ASSERT_TRUE(sim->synchronize().ok());

  std::vector<std::byte> want(3 * kMiB);
  fill_pattern(3, at, want);
  fill_pattern(4, 0, std::span<std::byte>(want.data() + (5 * kGiB + 7 - at), 100));
  EXPECT_EQ(h, content_hash(want));
  EXPECT_EQ(device_bytes(big + at, 3 * kMiB), want);
  std::vector<std::byte> copied(2 * kMiB);
  fill_pattern(3, kGiB, copied);
  EXPECT_EQ(device_bytes(big + 6 * kGiB, 2 * kMiB), copied);
  std::vector<std::byte> input(1000);
  fill_pattern(3, 7, input);
  const std::uint64_t mix = mix_step(kMixStart, 0, content_hash(input));
  std::vector<std::byte> tail(4096);
  fill_pattern(mix, kGiB - 4096, tail);
  EXPECT_EQ(device_bytes(big + 8 * kGiB - 4096, 4096), tail);
}

// Where the model cannot store the bytes (its limit, or a host that refuses),
// the enqueue is refused with out_of_memory, said plainly; every byte keeps its
// value and the storage the attempt took is given back, so other work goes on.
TEST_F(SimMemory, NoHostMemoryForTheModelIsOutOfMemoryAndChangesNoByte) {
  SimOptions o = tiny_options();
  o.model_bytes_limit = 2 * kGranule;
  start(o);
  put(0, FillOp{{base, kRegion}, 9});
  std::vector<std::byte> src = pattern(10, 4 * kGranule);
  const auto refused = sim->enqueue(0, CopyToDeviceOp{{base + kGranule, 4 * kGranule}, src.data()});
  ASSERT_FALSE(refused.ok());
  const Error& e = refused.error();
  EXPECT_EQ(e.code, ErrorCode::out_of_memory);
  EXPECT_NE(e.message.find("host memory for the simulated device's bytes is exhausted"), std::string::npos)
      << e.message;
  EXPECT_NE(e.message.find("limit"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find("copy_to_device"), std::string::npos) << e.message;
  ASSERT_TRUE(sim->synchronize().ok());
  EXPECT_EQ(device_bytes(base, kRegion), pattern(9, kRegion));
  // Two partial writes fit the limit: nothing of the refused copy is kept.
  put(1, FillOp{{base + 3, 10}, 11});
  put(1, FillOp{{base + 5 * kGranule + 3, 10}, 12});
  ASSERT_TRUE(sim->synchronize().ok());
  std::vector<std::byte> want = pattern(9, kRegion);
  fill_pattern(11, 0, std::span<std::byte>(want.data() + 3, 10));
  fill_pattern(12, 0, std::span<std::byte>(want.data() + 5 * kGranule + 3, 10));
  EXPECT_EQ(device_bytes(base, kRegion), want);
}

// The storage an enqueue took can be gone by completion (a later whole fill of
// the granules made them a pattern again): then the op itself fails, as its
// stream's sticky fault with the same plain out_of_memory, its bytes unwritten.
TEST_F(SimMemory, NoHostMemoryAtCompletionIsTheStreamsOutOfMemoryFault) {
  SimOptions o = tiny_options();
  o.model_bytes_limit = 2 * kGranule;
  start(o);
  sim->set_hold(0, true);
  std::vector<std::byte> src = pattern(10, 2 * kGranule);
  const Ticket copy = put(0, CopyToDeviceOp{{base + kGranule, 2 * kGranule}, src.data()});  // stores 2
  put(1, FillOp{{base + kGranule, 2 * kGranule}, 9});  // a pattern again: their storage is dropped
  ASSERT_TRUE(sim->wait({1, sim->submitted(1)}, kLong).ok());
  put(1, FillOp{{base + 5 * kGranule + 3, 10}, 11});  // the limit's two granules, elsewhere
  put(1, FillOp{{base + 6 * kGranule + 3, 10}, 12});
  ASSERT_TRUE(sim->wait({1, sim->submitted(1)}, kLong).ok());
  sim->set_hold(0, false);
  const auto r = sim->wait({0, copy}, kLong);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(r.error().message.find("host memory for the simulated device's bytes is exhausted"),
            std::string::npos)
      << r.error().message;
  EXPECT_EQ(device_bytes(base + kGranule, 2 * kGranule), pattern(9, 2 * kGranule));
}
}  // namespace
}  // namespace ferry::testing
