// The CUDA backend's start and its entry points. On the host (a fake driver library):
// what tells "no driver or device here" (skip) from "a driver that cannot start CUDA"
// (fail). On this machine: make_cuda_backend says which, for the right reason. On a GPU:
// the backend's kernels are loaded when it starts, not at a first launch under a lock or
// inside a capture (this binary runs with CUDA_MODULE_LOADING=LAZY to show it), and every
// entry point gives the caller's current device back.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "cuda/driver_probe.hpp"
#include "cuda/kernels.hpp"
#include "ferry/cuda_backend.hpp"

namespace ferry {
namespace {

// Before main, so before CUDA starts: the driver's lazy loading (CUDA >= 12.2's default,
// which run.sh's EAGER would hide) is what the kernel test must survive.
const bool kLazy = setenv("CUDA_MODULE_LOADING", "LAZY", 1) == 0;

using cuda_detail::DriverProbe;
using cuda_detail::no_driver_or_device;
using cuda_detail::probe_driver;

// The fake driver with cuInit answering `result`.
DriverProbe probe_fake(CUresult result) {
  setenv("FERRY_FAKE_CUINIT", std::to_string(static_cast<int>(result)).c_str(), 1);
  DriverProbe probe = probe_driver(FERRY_FAKE_LIBCUDA);
  unsetenv("FERRY_FAKE_CUINIT");
  return probe;
}

TEST(DriverProbe, ADriverLibraryThatDoesNotLoadIsNoDriver) {
  const DriverProbe probe = probe_driver("libferry-no-such-driver.so.1");
  EXPECT_FALSE(probe.loads);
  EXPECT_NE(probe.note.find("libferry-no-such-driver.so.1 does not load"), std::string::npos) << probe.note;
  EXPECT_TRUE(no_driver_or_device(cudaErrorInsufficientDriver, probe));
}

TEST(DriverProbe, ADriverWhoseCuInitFailsIsABrokenStartNotASkip) {
  for (const CUresult broken : {CUDA_ERROR_UNKNOWN, CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH}) {
    const DriverProbe probe = probe_fake(broken);
    ASSERT_TRUE(probe.loads) << probe.note;
    EXPECT_EQ(probe.init, broken);
    EXPECT_FALSE(no_driver_or_device(cudaErrorInsufficientDriver, probe)) << probe.note;
    EXPECT_FALSE(no_driver_or_device(cudaErrorInitializationError, probe)) << probe.note;
  }
  // A driver that starts while the runtime does not (too old for it) is broken too.
  EXPECT_FALSE(no_driver_or_device(cudaErrorInsufficientDriver, probe_fake(CUDA_SUCCESS)));
}

TEST(DriverProbe, ADriverWithNoDeviceOrTheStubIsNoDevice) {
  EXPECT_TRUE(no_driver_or_device(cudaErrorInsufficientDriver, probe_fake(CUDA_ERROR_NO_DEVICE)));
  EXPECT_TRUE(no_driver_or_device(cudaErrorInsufficientDriver, probe_fake(CUDA_ERROR_STUB_LIBRARY)));
  // The runtime's own "no device" needs no driver's word.
  EXPECT_TRUE(no_driver_or_device(cudaErrorNoDevice, probe_fake(CUDA_ERROR_UNKNOWN)));
}

// The real driver decides here: a machine whose driver does not load skips, saying so;
// one whose driver answers gets a backend or fails, never a skip.
TEST(CudaStart, ThisMachineSkipsOnlyWithoutADriverOrDevice) {
  const DriverProbe probe = probe_driver();
  auto made = make_cuda_backend({});
  if (!probe.loads) {
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.error().code, ErrorCode::unsupported) << made.error().message;
    EXPECT_NE(made.error().message.find("libcuda.so.1 does not load"), std::string::npos) << made.error().message;
  } else if (probe.init == CUDA_SUCCESS) {
    EXPECT_TRUE(made.ok()) << made.error().message;
  } else if (!made.ok()) {
    EXPECT_EQ(made.error().code == ErrorCode::unsupported, no_driver_or_device(cudaErrorInsufficientDriver, probe))
        << probe.note << ": " << made.error().message;
  }
}

TEST(CudaStart, TheKernelsAreLoadedWhenTheBackendStarts) {
  ASSERT_TRUE(kLazy);
  auto made = make_cuda_backend({});
  if (!made.ok()) {
    if (made.error().code == ErrorCode::unsupported) GTEST_SKIP() << made.error().message;
    FAIL() << made.error().message;
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  int unloaded = -1;
  const cudaError_t err = cuda_detail::count_unloaded_kernels(unloaded);
  if (err == cudaErrorNotSupported) GTEST_SKIP() << "the driver cannot tell whether a kernel is loaded (before 12.4)";
  ASSERT_EQ(err, cudaSuccess) << cudaGetErrorName(err);
  EXPECT_EQ(unloaded, 0) << "kernels left for their first launch, under a lock or inside a capture";
}

// Needs two devices: the backend on device 1, the caller on device 0.
TEST(CudaStart, EveryEntryPointGivesTheCallersDeviceBack) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) visible = 0;
  (void)cudaGetLastError();
  if (visible == 0) GTEST_SKIP() << "no CUDA device or driver";
  if (visible < 2) GTEST_SKIP() << "needs two CUDA devices; this machine has " << visible;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto made = make_cuda_backend({.device = 1});
  ASSERT_TRUE(made.ok()) << made.error().message;
  std::unique_ptr<Backend> b = std::move(made).value();
  const auto on_device_0 = [](const char* after) {
    int current = -1;
    EXPECT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, 0) << "after " << after;
  };
  on_device_0("make_cuda_backend");
  const std::uint64_t bytes = b->info().granularity;
  auto base = b->reserve_address(bytes);
  on_device_0("reserve_address");
  ASSERT_TRUE(base.ok()) << base.error().message;
  ASSERT_TRUE(b->map(*base, bytes).ok());
  on_device_0("map");
  auto pinned = b->allocate_pinned(4096);
  on_device_0("allocate_pinned");
  ASSERT_TRUE(pinned.ok()) << pinned.error().message;
  auto fill = b->enqueue(0, FillOp{{*base, bytes}, 7});
  on_device_0("enqueue");
  ASSERT_TRUE(fill.ok()) << fill.error().message;
  ASSERT_TRUE(b->enqueue(0, CopyToHostOp{*pinned, {*base, 4096}}).ok());
  ASSERT_TRUE(b->flush(0).ok());
  on_device_0("flush");
  ASSERT_TRUE(b->wait({0, b->submitted(0)}, std::chrono::seconds(60)).ok());
  on_device_0("wait");
  ASSERT_TRUE(b->native_stream(0).ok());
  on_device_0("native_stream");
  ASSERT_TRUE(b->synchronize().ok());
  on_device_0("synchronize");
  ASSERT_TRUE(b->free_pinned(*pinned).ok());
  on_device_0("free_pinned");
  ASSERT_TRUE(b->unmap(*base, bytes).ok());
  ASSERT_TRUE(b->release_address(*base, bytes).ok());
  on_device_0("unmap and release_address");
  b.reset();
  on_device_0("the backend's destruction");
}

}  // namespace
}  // namespace ferry
