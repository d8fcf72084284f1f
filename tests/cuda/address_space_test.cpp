// The VMM address space against a fake driver, on the host: which driver calls a
// map makes (one cuMemCreate and cuMemMap per granule, one cuMemSetAccess over the
// whole run), that a failure at any step leaves nothing mapped or allocated, and
// which devices each granule is readable by once a peer is granted access.
#include "cuda/address_space.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace ferry::cuda_detail {
namespace {

constexpr std::uint64_t kGranule = 2u << 20;

// The fake driver's state: live allocations, live mappings, access calls, and the
// call (counted from 1) at which each entry point fails.
struct FakeDriver {
  std::uint64_t next_handle = 1;
  std::set<CUmemGenericAllocationHandle> live;
  std::map<CUdeviceptr, CUmemGenericAllocationHandle> mapped;  // by granule address
  std::vector<std::pair<CUdeviceptr, std::size_t>> access;
  std::map<CUdeviceptr, std::set<int>> readers;  // by granule address: the devices granted access
  int creates = 0, maps = 0;
  int fail_create = 0, fail_map = 0, fail_access = 0;
};
FakeDriver* fake = nullptr;

CUresult CUDAAPI reserve(CUdeviceptr* ptr, std::size_t, std::size_t, CUdeviceptr, unsigned long long) {
  *ptr = 1ull << 40;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI address_free(CUdeviceptr, std::size_t) { return CUDA_SUCCESS; }
CUresult CUDAAPI create(CUmemGenericAllocationHandle* h, std::size_t, const CUmemAllocationProp*,
                        unsigned long long) {
  if (++fake->creates == fake->fail_create) return CUDA_ERROR_OUT_OF_MEMORY;
  *h = fake->next_handle++;
  fake->live.insert(*h);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI release(CUmemGenericAllocationHandle h) {
  return fake->live.erase(h) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI map(CUdeviceptr ptr, std::size_t size, std::size_t, CUmemGenericAllocationHandle h,
                     unsigned long long) {
  if (++fake->maps == fake->fail_map) return CUDA_ERROR_INVALID_VALUE;
  if (size != kGranule || fake->mapped.contains(ptr) || !fake->live.contains(h)) return CUDA_ERROR_INVALID_VALUE;
  fake->mapped.emplace(ptr, h);
  return CUDA_SUCCESS;
}
CUresult CUDAAPI unmap(CUdeviceptr ptr, std::size_t size) {
  fake->readers.erase(ptr);  // the driver's rule: an unmapped range keeps no access
  return size == kGranule && fake->mapped.erase(ptr) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI device_get(CUdevice* device, int ordinal) {
  *device = ordinal;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc, std::size_t count) {
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return CUDA_ERROR_INVALID_VALUE;
  }
  for (std::size_t off = 0; off < size; off += kGranule) {  // the driver's rule: all of it mapped
    if (!fake->mapped.contains(ptr + off)) return CUDA_ERROR_INVALID_VALUE;
  }
  fake->access.emplace_back(ptr, size);
  if (static_cast<int>(fake->access.size()) == fake->fail_access) return CUDA_ERROR_UNKNOWN;
  for (std::size_t off = 0; off < size; off += kGranule) {
    for (std::size_t i = 0; i < count; ++i) fake->readers[ptr + off].insert(desc[i].location.id);
  }
  return CUDA_SUCCESS;
}

class CudaAddressSpaceTest : public ::testing::Test {
 protected:
  CudaAddressSpaceTest() {
    fake = &state;
    api.mem_address_reserve = &reserve;
    api.mem_address_free = &address_free;
    api.mem_create = &create;
    api.mem_release = &release;
    api.mem_map = &map;
    api.mem_unmap = &unmap;
    api.mem_set_access = &set_access;
    api.device_get = &device_get;
  }
  ~CudaAddressSpaceTest() override { fake = nullptr; }

  FakeDriver state;
  DriverApi api;
};

TEST_F(CudaAddressSpaceTest, AMapOfARunSetsAccessOnceOverAllOfIt) {
  CudaAddressSpace space(&api, 0, 0, kGranule);
  auto base = space.reserve(8 * kGranule);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(space.map(*base + kGranule, 4 * kGranule).ok());
  EXPECT_EQ(state.creates, 4);
  EXPECT_EQ(state.mapped.size(), 4u);
  ASSERT_EQ(state.access.size(), 1u);
  EXPECT_EQ(state.access[0], std::make_pair(static_cast<CUdeviceptr>(*base + kGranule), 4 * kGranule));
  EXPECT_EQ(space.mapped_bytes(), 4 * kGranule);
  EXPECT_TRUE(space.check_mapped(*base + kGranule, 4 * kGranule, "test").ok());
  // Each granule is still its own allocation: one can go alone.
  ASSERT_TRUE(space.unmap(*base + 2 * kGranule, kGranule).ok());
  EXPECT_EQ(state.live.size(), 3u);
  EXPECT_EQ(space.mapped_bytes(), 3 * kGranule);
}

TEST_F(CudaAddressSpaceTest, AFailedCreateOrMapLeavesNothingBehind) {
  for (const bool fail_map : {false, true}) {
    FakeDriver fresh;
    state = fresh;
    (fail_map ? state.fail_map : state.fail_create) = 3;  // the third granule fails
    CudaAddressSpace space(&api, 0, 0, kGranule);
    auto base = space.reserve(4 * kGranule);
    ASSERT_TRUE(base.ok());
    auto r = space.map(*base, 4 * kGranule);
    ASSERT_FALSE(r.ok()) << fail_map;
    EXPECT_EQ(r.error().code, fail_map ? ErrorCode::backend_error : ErrorCode::out_of_memory);
    EXPECT_TRUE(state.live.empty()) << "granules leaked";
    EXPECT_TRUE(state.mapped.empty()) << "granules left mapped";
    EXPECT_TRUE(state.access.empty());
    EXPECT_EQ(space.mapped_bytes(), 0u);
    // The granules are unmapped again, not stuck busy: the same map now succeeds.
    state.fail_map = state.fail_create = 0;
    EXPECT_TRUE(space.map(*base, 4 * kGranule).ok());
    EXPECT_EQ(state.live.size(), 4u);
  }
}

// CudaBackendTest.MappingBeyondPhysicalMemoryIsOutOfMemory's bound on the device: a
// run larger than the device is refused before one granule is created.
TEST_F(CudaAddressSpaceTest, ARunLargerThanTheDeviceIsRefusedWithoutADriverCall) {
  CudaAddressSpace space(&api, 0, 0, kGranule, 4 * kGranule);
  auto base = space.reserve(8 * kGranule);
  ASSERT_TRUE(base.ok());
  auto r = space.map(*base, 5 * kGranule);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::out_of_memory);
  EXPECT_EQ(state.creates, 0);
  EXPECT_EQ(state.maps, 0);
  EXPECT_EQ(space.mapped_bytes(), 0u);
  // The whole device in one run, and a granule past its end, are still tried.
  ASSERT_TRUE(space.map(*base, 4 * kGranule).ok());
  ASSERT_TRUE(space.map(*base + 7 * kGranule, kGranule).ok());
  EXPECT_EQ(state.creates, 5);
}

TEST_F(CudaAddressSpaceTest, AFailedSetAccessUnmapsAndReleasesTheWholeRun) {
  state.fail_access = 1;
  CudaAddressSpace space(&api, 0, 0, kGranule);
  auto base = space.reserve(4 * kGranule);
  ASSERT_TRUE(base.ok());
  auto r = space.map(*base, 3 * kGranule);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::backend_error);
  EXPECT_NE(r.error().message.find("cuMemSetAccess"), std::string::npos) << r.error().message;
  EXPECT_TRUE(state.live.empty());
  EXPECT_TRUE(state.mapped.empty());
  EXPECT_EQ(space.mapped_bytes(), 0u);
  EXPECT_FALSE(space.check_mapped(*base, kGranule, "test").ok());
  EXPECT_TRUE(space.map(*base, 3 * kGranule).ok());
}

TEST_F(CudaAddressSpaceTest, ReleaseUnmapsAndFreesEveryGranule) {
  CudaAddressSpace space(&api, 0, 0, kGranule);
  auto base = space.reserve(4 * kGranule);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(space.map(*base, 2 * kGranule).ok());
  ASSERT_TRUE(space.map(*base + 3 * kGranule, kGranule).ok());
  EXPECT_EQ(state.access.size(), 2u);
  ASSERT_TRUE(space.release(*base, 4 * kGranule).ok());
  EXPECT_TRUE(state.live.empty());
  EXPECT_TRUE(state.mapped.empty());
}

// A peer that may read this device (a peer copy's reader) gets access to the
// granules mapped before the grant and to each one mapped after it; an unmapped
// and remapped granule gets it again; a second grant changes nothing.
TEST_F(CudaAddressSpaceTest, AGrantedPeerReadsGranulesMappedBeforeAndAfterTheGrant) {
  CudaAddressSpace space(&api, 0, 0, kGranule);
  auto base = space.reserve(8 * kGranule);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(space.map(*base, 2 * kGranule).ok());
  ASSERT_TRUE(space.map(*base + 3 * kGranule, kGranule).ok());
  EXPECT_EQ(state.readers[*base], (std::set<int>{0}));
  ASSERT_TRUE(space.grant_peer(1).ok());
  for (const std::uint64_t g : {*base, *base + kGranule, *base + 3 * kGranule}) {
    EXPECT_EQ(state.readers[g], (std::set<int>{0, 1})) << "granule " << (g - *base) / kGranule;
  }
  // The two runs mapped before the grant: one call each, not one per granule.
  ASSERT_EQ(state.access.size(), 4u);
  EXPECT_EQ(state.access[2], std::make_pair(static_cast<CUdeviceptr>(*base), 2 * kGranule));
  EXPECT_EQ(state.access[3], std::make_pair(static_cast<CUdeviceptr>(*base + 3 * kGranule), kGranule));
  ASSERT_TRUE(space.map(*base + 5 * kGranule, kGranule).ok());
  EXPECT_EQ(state.readers[*base + 5 * kGranule], (std::set<int>{0, 1}));
  ASSERT_TRUE(space.unmap(*base, kGranule).ok());
  EXPECT_FALSE(state.readers.contains(*base));
  ASSERT_TRUE(space.map(*base, kGranule).ok());
  EXPECT_EQ(state.readers[*base], (std::set<int>{0, 1}));
  const std::size_t calls = state.access.size();
  ASSERT_TRUE(space.grant_peer(1).ok());
  ASSERT_TRUE(space.grant_peer(0).ok());  // the device itself: it has access already
  EXPECT_EQ(state.access.size(), calls);
}

// A grant the driver refuses is an error naming both devices, and the peer is not
// recorded: a later map names only the device itself.
TEST_F(CudaAddressSpaceTest, ARefusedGrantIsAnErrorAndLaterMapsDoNotNameThePeer) {
  CudaAddressSpace space(&api, 0, 0, kGranule);
  auto base = space.reserve(4 * kGranule);
  ASSERT_TRUE(base.ok());
  ASSERT_TRUE(space.map(*base, kGranule).ok());
  state.fail_access = 2;  // the grant's call
  auto granted = space.grant_peer(1);
  ASSERT_FALSE(granted.ok());
  EXPECT_EQ(granted.error().code, ErrorCode::backend_error);
  EXPECT_NE(granted.error().message.find("granting device 1 access to device 0"), std::string::npos)
      << granted.error().message;
  state.fail_access = 0;
  ASSERT_TRUE(space.map(*base + kGranule, kGranule).ok());
  EXPECT_EQ(state.readers[*base + kGranule], (std::set<int>{0}));
}

// Without VMM the space has plain allocations, which peer access covers: nothing to grant.
TEST(CudaAddressSpaceFallback, AGrantWithoutVirtualMemoryDoesNothing) {
  CudaAddressSpace space(nullptr, 0, 0, kGranule);
  EXPECT_TRUE(space.grant_peer(1).ok());
}

}  // namespace
}  // namespace ferry::cuda_detail
