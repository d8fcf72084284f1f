// Sub-blocks (DevicePool::sub_block): handles over part of a live block, for a
// graph's private pool. Each resolves to its range and is leased as its block
// (I2), goes stale when freed and when its block is freed or reissued (I1),
// never moves the pool's stats, and refuses bad ranges as values (I7). Written
// once, run on every backend (cuda SKIPs without a GPU).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend_fixture.hpp"
#include "ferry/device_pool.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t KiB = 1024;

class SubBlockTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = testing::make_backend(GetParam());
    FERRY_REQUIRE_BACKEND(backend_, GetParam());
    order_ = std::make_unique<StreamOrder>(*backend_);
    PoolOptions o;
    o.validate_each_op = true;
    pool_ = std::make_unique<DevicePool>(*order_, o);
    ASSERT_TRUE(pool_->status().ok());
  }
  void TearDown() override {
    if (!pool_) return;
    std::string why;
    EXPECT_TRUE(pool_->validate(&why)) << why;
  }
  DeviceHandle alloc(std::uint64_t bytes) {
    auto h = pool_->allocate(bytes, 0);
    EXPECT_TRUE(h.ok()) << h.error().message;
    return h.ok() ? *h : DeviceHandle{};
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StreamOrder> order_;
  std::unique_ptr<DevicePool> pool_;
};

TEST_P(SubBlockTest, ASubBlockResolvesToItsRangeAndItsOpsTouchOnlyThat) {
  DevicePool& p = *pool_;
  const DeviceHandle block = alloc(16 * KiB);
  ASSERT_TRUE(enqueue_fill(p, 0, block, 1).ok());
  const PoolStats before = p.stats();
  auto a = p.sub_block(block, 4 * KiB, 3 * KiB);
  auto b = p.sub_block(block, 8 * KiB, 8 * KiB);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_TRUE(b.ok()) << b.error().message;
  EXPECT_NE(*a, *b);
  EXPECT_EQ(p.resolve(*a)->addr, p.resolve(block)->addr + 4 * KiB);
  EXPECT_EQ(p.resolve(*a)->bytes, 3 * KiB);
  ASSERT_TRUE(enqueue_fill(p, 0, *a, 2).ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *b, 3).ok());
  auto got = read_back(p, block, 0);
  ASSERT_TRUE(got.ok()) << got.error().message;
  std::vector<std::byte> want = pattern(1, 16 * KiB);
  const std::vector<std::byte> pa = pattern(2, 3 * KiB), pb = pattern(3, 8 * KiB);
  std::copy(pa.begin(), pa.end(), want.begin() + 4 * KiB);
  std::copy(pb.begin(), pb.end(), want.begin() + 8 * KiB);
  EXPECT_EQ(*got, want);
  // The block's bytes are counted once, as the block's.
  const PoolStats after = p.stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.requested_bytes, before.requested_bytes);
  EXPECT_EQ(after.allocs, before.allocs);
  EXPECT_EQ(p.snapshot().size(), 1u);
  EXPECT_EQ(p.live_blocks().size(), 1u);
  EXPECT_TRUE(p.free(*a).ok());
  EXPECT_TRUE(p.free(*b).ok());
  EXPECT_EQ(p.stats().frees, before.frees);
  EXPECT_TRUE(p.free(block).ok());
}

TEST_P(SubBlockTest, AFreedSubBlockIsStaleAndSoIsEveryOneOfAFreedOrReissuedBlock) {
  DevicePool& p = *pool_;
  const DeviceHandle block = alloc(8 * KiB);
  auto a = p.sub_block(block, 0, 1 * KiB);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(p.free(*a).ok());
  EXPECT_EQ(p.resolve(*a).error().code, ErrorCode::stale_handle);  // I1
  EXPECT_EQ(p.free(*a).error().code, ErrorCode::stale_handle);
  EXPECT_TRUE(p.resolve(block).ok());  // its block is untouched

  auto b = p.sub_block(block, 0, 1 * KiB);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(*b, *a);  // a new generation, even on the same slot
  EXPECT_EQ(p.resolve(*a).error().code, ErrorCode::stale_handle);
  auto b2 = p.reissue(*b, 512);  // the same range under a new handle
  ASSERT_TRUE(b2.ok()) << b2.error().message;
  EXPECT_EQ(p.resolve(*b).error().code, ErrorCode::stale_handle);
  EXPECT_EQ(p.resolve(*b2)->bytes, 512u);
  auto moved = p.reissue(block, 8 * KiB);  // the block changes hands: its sub-blocks go
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(p.resolve(*b2).error().code, ErrorCode::stale_handle);
  auto c = p.sub_block(*moved, 4 * KiB, 4 * KiB);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(enqueue_fill(p, 0, *c, 9).ok());  // in flight: its lease holds the block (I2)
  ASSERT_TRUE(p.free(*moved).ok());
  EXPECT_EQ(p.resolve(*c).error().code, ErrorCode::stale_handle);
  EXPECT_EQ(p.free(*c).error().code, ErrorCode::stale_handle);
  EXPECT_EQ(p.stats().allocated_bytes, 0u);
  ASSERT_TRUE(order_->wait({0, backend_->submitted(0)}).ok());
  EXPECT_EQ(p.stats().pending_free_bytes, 0u);
}

TEST_P(SubBlockTest, BadRangesAndForeignHandlesAreRefusedAsValues) {
  DevicePool& p = *pool_;
  const DeviceHandle block = alloc(4 * KiB + 100);  // rounded to 4352
  EXPECT_EQ(p.sub_block(block, 0, 0).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(p.sub_block(block, 100, 256).error().code, ErrorCode::invalid_argument);  // misaligned
  EXPECT_EQ(p.sub_block(block, 4 * KiB, 257).error().code, ErrorCode::invalid_argument);  // past its end
  EXPECT_EQ(p.sub_block(block, UINT64_MAX - 255, 512).error().code, ErrorCode::invalid_argument);
  EXPECT_TRUE(p.sub_block(block, 4 * KiB, 256).ok());  // its rounded tail
  auto a = p.sub_block(block, 0, 1 * KiB);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(p.sub_block(*a, 0, 256).error().code, ErrorCode::invalid_argument);  // of a sub-block
  EXPECT_EQ(p.reissue(*a, 1 * KiB + 1).error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(p.sub_block(DeviceHandle{block.pool, block.slot, block.generation + 1}, 0, 256).error().code,
            ErrorCode::stale_handle);
  EXPECT_EQ(p.sub_block(DeviceHandle{block.pool + 1000, 0, 1}, 0, 256).error().code, ErrorCode::stale_handle);
  EXPECT_TRUE(p.free(block).ok());
  EXPECT_EQ(p.resolve(*a).error().code, ErrorCode::stale_handle);
}

INSTANTIATE_TEST_SUITE_P(Backends, SubBlockTest, FERRY_BACKENDS);

}  // namespace
}  // namespace ferry
