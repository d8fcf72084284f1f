// The open world on a real device: a program's own stream adopted by ferry, its own
// __global__ kernel as a user op, record_use for work ferry never saw, and native
// events both ways. Every test SKIPs without a GPU (make_backend answers unsupported).
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <vector>

#include "add_one.hpp"
#include "backend_fixture.hpp"
#include "expected_bytes.hpp"
#include "ferry/user_op.hpp"
#include "pool_helpers.hpp"

namespace ferry {
namespace {

using testing::pattern;
using testing::read_back;

constexpr std::uint64_t KiB = 1024;
constexpr auto kSecond = std::chrono::seconds(1);

std::vector<std::byte> plus_one(std::vector<std::byte> v) {
  for (std::byte& b : v) b = static_cast<std::byte>(static_cast<unsigned char>(b) + 1);
  return v;
}

class AdoptedStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = testing::make_backend("cuda");
    FERRY_REQUIRE_BACKEND(backend_, "cuda");
    order_ = std::make_unique<StreamOrder>(*backend_);
    pool_ = std::make_unique<DevicePool>(*order_);
    ASSERT_TRUE(pool_->status().ok());
    ASSERT_EQ(cudaStreamCreateWithFlags(&program_stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (backend_) (void)backend_->synchronize();
    pool_.reset();
    order_.reset();
    backend_.reset();  // before the program destroys its stream
    if (program_stream_ != nullptr) (void)cudaStreamDestroy(program_stream_);
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StreamOrder> order_;
  std::unique_ptr<DevicePool> pool_;
  cudaStream_t program_stream_ = nullptr;
};

UserKernel add_one() {
  return [](const KernelLaunch& l) -> Result<void> {
    if (launch_add_one(reinterpret_cast<void*>(l.args[0].addr), l.args[0].bytes, l.stream) != 0) {
      return make_error(ErrorCode::backend_error, "add_one did not launch");
    }
    return {};
  };
}

TEST_F(AdoptedStreamTest, TheProgramsKernelRunsOnItsOwnAdoptedStream) {
  auto s = backend_->adopt_stream(program_stream_);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(backend_->native_stream(*s).value_or(nullptr), program_stream_);
  backend_->set_hold(*s, true);
  EXPECT_FALSE(backend_->held(*s)) << "an adopted stream was held";
  auto h = pool_->allocate(256 * KiB, *s);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(enqueue_fill(*pool_, *s, *h, 5).ok());
  const Operand ops[] = {{*h, Access::read_write}};
  ASSERT_TRUE(enqueue_user(*pool_, *s, ops, add_one(), {}, "add_one").ok());
  auto got = read_back(*pool_, *h, *s);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(*got, plus_one(pattern(5, 256 * KiB)));
  ASSERT_TRUE(pool_->free(*h).ok());
  ASSERT_TRUE(backend_->release_stream(*s, kSecond).ok());
  EXPECT_EQ(cudaStreamQuery(program_stream_), cudaSuccess) << "release left work on the program's stream";
  EXPECT_FALSE(backend_->release_stream(*s, kSecond).ok());
}

// The program's own work on its stream, blocked until the test lets it go: a
// host function that spins on a flag.
void CUDART_CB spin_until_set(void* flag) {
  while (!static_cast<std::atomic<bool>*>(flag)->load()) {
  }
}

TEST_F(AdoptedStreamTest, RecordUseHoldsABlockForWorkFerryNeverSaw) {
  auto s = backend_->adopt_stream(program_stream_);
  ASSERT_TRUE(s.ok());
  auto h = pool_->allocate(256 * KiB, 0);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(enqueue_fill(*pool_, 0, *h, 2).ok());
  ASSERT_TRUE(order_->wait({0, backend_->submitted(0)}).ok());
  const DeviceSpan span = *pool_->resolve(*h);
  std::atomic<bool> go{false};
  ASSERT_EQ(cudaLaunchHostFunc(program_stream_, spin_until_set, &go), cudaSuccess);
  ASSERT_EQ(launch_add_one(reinterpret_cast<void*>(span.addr), span.bytes, program_stream_), 0);
  const DeviceHandle used[] = {*h};
  ASSERT_TRUE(record_use(*pool_, *s, used).ok());
  ASSERT_TRUE(pool_->free(*h).ok());
  auto other = pool_->allocate(256 * KiB, 1);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(pool_->resolve(*other)->addr, span.addr) << "reused while the program's kernel was queued";
  go = true;
  ASSERT_TRUE(backend_->release_stream(*s, kSecond * 10).ok());
}

TEST_F(AdoptedStreamTest, NativeEventsOrderBothWays) {
  auto h = pool_->allocate(64 * KiB, 0);
  ASSERT_TRUE(h.ok());
  auto filled = enqueue_fill(*pool_, 0, *h, 8);
  ASSERT_TRUE(filled.ok());
  // ferry -> program: the program's stream waits for ferry's fill.
  auto event = backend_->export_event({0, *filled});
  ASSERT_TRUE(event.ok()) << event.error().message;
  ASSERT_EQ(cudaStreamWaitEvent(program_stream_, static_cast<cudaEvent_t>(*event), 0), cudaSuccess);
  const DeviceSpan span = *pool_->resolve(*h);
  ASSERT_EQ(launch_add_one(reinterpret_cast<void*>(span.addr), span.bytes, program_stream_), 0);
  // program -> ferry: stream 0 waits for the program's kernel.
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, program_stream_), cudaSuccess);
  ASSERT_TRUE(order_->order_after(0, static_cast<NativeEvent>(done)).ok());
  auto got = read_back(*pool_, *h, 0);
  ASSERT_TRUE(got.ok()) << got.error().message;
  EXPECT_EQ(*got, plus_one(pattern(8, 64 * KiB)));
  EXPECT_TRUE(backend_->release_event(*event).ok());
  (void)cudaEventDestroy(done);
}

}  // namespace
}  // namespace ferry
