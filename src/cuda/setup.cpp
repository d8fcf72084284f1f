// ferry — the CUDA backend's setup and teardown: device discovery, what DeviceInfo
// says of the device (attributes, nominal rates, VMM, the batched-copy probe), the
// backend's construction and destruction, and make_cuda_backend.
#include "cuda/cuda_backend.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cublas_api.hpp"
#include "cuda/cuda_error.hpp"
#include "cuda/device_scope.hpp"
#include "cuda/driver_api.hpp"
#include "cuda/driver_probe.hpp"
#include "cuda/kernels.hpp"
#include "ferry/content.hpp"
#include "ferry/cuda_backend.hpp"

namespace ferry {
namespace cuda_detail {
namespace {

bool verbose() {
  const char* v = std::getenv("FERRY_CUDA_VERBOSE");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

constexpr std::uint64_t kFallbackGranularity = 2ull << 20;  // without VMM: the usual large page

// The start-up probe of the batched path: two small batches in a row (some drivers
// honour only the first batch of a process), each verified byte by byte.
bool probe_batched_copy(int device, std::string& note) {
#if CUDART_VERSION < 12080
  (void)device;
  note = "this CUDA runtime has no cudaMemcpyBatchAsync";
  return false;
#else
  constexpr std::size_t kPieces = 4;
  constexpr std::size_t kPiece = 4096 + 8;  // not a power of two on purpose
  constexpr std::size_t kBytes = kPieces * kPiece;
  cudaStream_t stream = nullptr;
  void* dev = nullptr;
  void* host = nullptr;  // pinned: [0, kBytes) source, [kBytes, 2 kBytes) read-back
  bool ok = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
            cudaMalloc(&dev, kBytes) == cudaSuccess &&
            cudaHostAlloc(&host, 2 * kBytes, cudaHostAllocPortable) == cudaSuccess;
  if (!ok) note = "probe set-up failed: " + describe(cudaGetLastError());
  auto* src = static_cast<std::byte*>(host);
  for (int round = 0; ok && round < 2; ++round) {
    fill_pattern(0xba7c4ull + static_cast<std::uint64_t>(round), 0, {src, kBytes});
    std::memset(src + kBytes, 0, kBytes);
    std::vector<void*> dsts;
    std::vector<void*> srcs;
    std::vector<std::size_t> sizes;
    for (std::size_t i = 0; i < kPieces; ++i) {  // in reverse: order inside a batch is free
      const std::size_t piece = kPieces - 1 - i;
      dsts.push_back(static_cast<std::byte*>(dev) + piece * kPiece);
      srcs.push_back(src + piece * kPiece);
      sizes.push_back(kPiece);
    }
    cudaError_t err = cudaMemsetAsync(dev, 0, kBytes, stream);
    if (err == cudaSuccess) err = memcpy_batch_to_device(dsts, srcs, sizes, device, stream);
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(src + kBytes, dev, kBytes, cudaMemcpyDeviceToHost, stream);
    }
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      note = "batch " + std::to_string(round + 1) + " failed: " + describe(err);
      ok = false;
    } else if (std::memcmp(src, src + kBytes, kBytes) != 0) {
      note = "batch " + std::to_string(round + 1) + " returned success but did not copy";
      ok = false;
    }
  }
  if (ok) note = "two verified batches";
  if (stream != nullptr) (void)cudaStreamSynchronize(stream);
  if (host != nullptr) (void)cudaFreeHost(host);
  if (dev != nullptr) (void)cudaFree(dev);
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  (void)cudaGetLastError();
  return ok;
#endif
}

int device_attribute(cudaDeviceAttr attr, int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return v;
}

// Nominal dense bf16 tensor FLOPs per SM per clock, by architecture (fp16 before bf16
// existed). Estimates for DeviceInfo, not measurements.
double flops_per_sm_clock(int major, int minor) {
  if (major >= 10) return 8192;
  if (major == 9) return 4096;
  if (major == 8) return minor == 0 ? 2048 : 512;
  if (major == 7) return 1024;
  return 256;
}

// Whether `device` may read another visible device's memory: PeerCopyOp can run
// (from a device connect_peer opens).
bool reaches_a_peer(int device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  bool any = false;
  for (int other = 0; other < count && !any; ++other) {
    int can = 0;
    any = other != device && cudaDeviceCanAccessPeer(&can, device, other) == cudaSuccess && can != 0;
  }
  (void)cudaGetLastError();
  return any;
}

Result<std::unique_ptr<Backend>> create_backend(int device) {
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) err = cudaFree(nullptr);  // creates the primary context on older runtimes
  if (err != cudaSuccess) return cuda_error(err, "initializing CUDA device " + std::to_string(device));
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) return cuda_error(err, "cudaGetDeviceProperties");

  CudaBackend::Setup setup;
  setup.device = device;
  DeviceInfo& info = setup.info;
  info.backend = BackendKind::cuda;
  info.device = prop.name;
  info.capacity = prop.totalGlobalMem;
  // Free memory now, less a margin for what the context, cuBLAS, scratch and other
  // libraries of this process take later: max(256 MiB, 1/64 of the card).
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    const std::uint64_t margin = std::max<std::uint64_t>(256ull << 20, info.capacity / 64);
    info.available = free_bytes > margin ? free_bytes - margin : 0;
    if (info.available == 0) info.available = 1;  // nothing free: not "unknown"
  } else {
    (void)cudaGetLastError();
  }
  info.host_register = device_attribute(cudaDevAttrHostRegisterSupported, device) != 0;
  info.native_graphs = true;  // stream capture and cudaGraphLaunch: every device this runtime supports
  info.peer_copy = reaches_a_peer(device);
  setup.register_read_only = device_attribute(cudaDevAttrHostRegisterReadOnlySupported, device) != 0;
  setup.memory_pools = device_attribute(cudaDevAttrMemoryPoolsSupported, device) != 0;

  const double mem_clock_hz = 1e3 * device_attribute(cudaDevAttrMemoryClockRate, device);
  const double bus_bytes = device_attribute(cudaDevAttrGlobalMemoryBusWidth, device) / 8.0;
  info.mem_bytes_per_s = mem_clock_hz > 0 && bus_bytes > 0 ? 2.0 * mem_clock_hz * bus_bytes : 1e12;
  const double sm_clock_hz = 1e3 * device_attribute(cudaDevAttrClockRate, device);
  info.flops_per_s = prop.multiProcessorCount * (sm_clock_hz > 0 ? sm_clock_hz : 1.5e9) *
                     flops_per_sm_clock(prop.major, prop.minor);
  // No attribute gives the host link; nominal pinned rates by generation, and the
  // coherent chip-to-chip link of Grace systems.
  if (prop.integrated != 0) {
    info.h2d_bytes_per_s = info.mem_bytes_per_s;
  } else if (device_attribute(cudaDevAttrPageableMemoryAccessUsesHostPageTables, device) != 0) {
    info.h2d_bytes_per_s = 400e9;
  } else {
    info.h2d_bytes_per_s = prop.major >= 9 ? 50e9 : prop.major == 8 ? 24e9 : 12e9;
  }

  // Virtual memory management, unless the driver lacks it or FERRY_CUDA_VMM=0 asks for
  // the fallback (to exercise it on a machine that has both).
  const char* vmm_env = std::getenv("FERRY_CUDA_VMM");
  const bool want_vmm = vmm_env == nullptr || std::strcmp(vmm_env, "0") != 0;
  info.granularity = kFallbackGranularity;
  std::string vmm_note = want_vmm ? "the device does not support it" : "FERRY_CUDA_VMM=0";
  if (want_vmm) {
    auto driver = std::make_unique<DriverApi>();
    int vmm = 0;
    if (driver->load(vmm_note) && driver->device_get(&setup.cu_device, device) == CUDA_SUCCESS &&
        driver->device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                     setup.cu_device) == CUDA_SUCCESS &&
        vmm != 0) {
      CUmemAllocationProp aprop{};
      aprop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      aprop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      aprop.location.id = setup.cu_device;
      std::size_t granularity = 0;
      if (driver->mem_get_allocation_granularity(&granularity, &aprop,
                                                 CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
          granularity > 0 && (granularity & (granularity - 1)) == 0) {
        info.granularity = granularity;
        info.virtual_memory = true;
        setup.driver = std::move(driver);
        vmm_note = "in use";
      }
    }
  }

  std::string batch_note;
  info.batched_copy = probe_batched_copy(device, batch_note);
  // FERRY_CUDA_VERBOSE=1: one line on what was chosen and why (for tools/gpu-check).
  if (verbose()) {
    std::fprintf(stderr, "ferry cuda: %s, %llu MiB (%llu MiB available), granularity %llu KiB, VMM: %s, batched copy: %s\n",
                 info.device.c_str(), static_cast<unsigned long long>(info.capacity >> 20),
                 static_cast<unsigned long long>(info.available >> 20),
                 static_cast<unsigned long long>(info.granularity >> 10), vmm_note.c_str(),
                 batch_note.c_str());
  }
  auto backend = std::make_unique<CudaBackend>(std::move(setup));
  FERRY_TRY(backend->init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace

CudaBackend::CudaBackend(Setup setup)
    : device_(setup.device),
      info_(std::move(setup.info)),
      driver_(std::move(setup.driver)),
      space_(driver_.get(), setup.cu_device, setup.device, info_.granularity, info_.capacity),
      memory_pools_(setup.memory_pools),
      register_read_only_(setup.register_read_only) {
  start_queues();
}

// No other thread may use a backend that is being destroyed, so no lock is taken.
CudaBackend::~CudaBackend() {
  const DeviceScope bound = bind();
  (void)synchronize();
  host_jobs_.stop_worker();  // before the staging buffers go
  // Before the streams they are bound to.
  if (!cublas_handles_.empty() || !retired_cublas_.empty()) {
    std::string unused;  // a handle exists, so cuBLAS is loaded: no load happens here
    if (const CublasApi* cublas = cublas_api(unused)) {
      for (const auto& [native, handle] : cublas_handles_) (void)cublas->destroy(handle);
      for (cublasHandle_t handle : retired_cublas_) (void)cublas->destroy(handle);
    }
    cublas_handles_.clear();
    retired_cublas_.clear();
  }
  for (Stream& st : streams_) {
    if (st.handle == nullptr) continue;
    if (st.adopted) {  // the program's stream, perhaps gone already: touch nothing of it
      if (st.scratch != nullptr) (void)cudaFree(st.scratch);
      for (std::byte* b : st.staging) {
        if (b != nullptr) (void)cudaFreeHost(b);
      }
      continue;
    }
    if (st.scratch != nullptr) {
      if (memory_pools_) (void)cudaFreeAsync(st.scratch, st.handle);
      else (void)cudaFree(st.scratch);
    }
    (void)cudaStreamSynchronize(st.handle);
    (void)cudaStreamDestroy(st.handle);
    for (std::byte* b : st.staging) {
      if (b != nullptr) (void)cudaFreeHost(b);
    }
  }
  // Every stream is synchronized and destroyed: a job whose host function has not run
  // never will (a sticky error stops them), so it is freed here, not leaked.
  if (const std::size_t never_ran = host_jobs_.release_all(); never_ran > 0 && verbose()) {
    std::fprintf(stderr, "ferry cuda: %zu host copies never ran (a sticky device error)\n", never_ran);
  }
  for (void* p : retired_scratch_) (void)cudaFree(p);
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  for (const auto& [e, count] : exported_) (void)cudaEventDestroy(e);  // never released by the program
  if (result_slots_ != nullptr) (void)cudaFreeHost(result_slots_);
  for (auto& [ptr, bytes] : registered_) (void)cudaHostUnregister(ptr);
  for (auto& [ptr, bytes] : pinned_) (void)cudaFreeHost(ptr);
  (void)cudaGetLastError();
}

Result<void> CudaBackend::init() {
  const cudaError_t err = cudaHostAlloc(reinterpret_cast<void**>(&result_slots_),
                                        kMaxStreams * sizeof(std::uint64_t),
                                        cudaHostAllocPortable);
  if (err != cudaSuccess) return cuda_error(err, "cudaHostAlloc of the result slots");
  return check(load_kernels(), "loading the backend's kernels");
}

}  // namespace cuda_detail

bool cuda_backend_built() noexcept { return true; }

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  (void)cudaGetLastError();  // no device is an answer here, not a sticky error
  return count;
}

Result<CublasLocation> locate_cublas() {
  std::string why;
  const cuda_detail::CublasApi* api = cuda_detail::cublas_api(why);
  if (api == nullptr) return make_error(ErrorCode::unsupported, why);
  return CublasLocation{api->path, api->found_by};
}

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  (void)cudaGetLastError();
  if (err == cudaSuccess && count == 0) {
    return make_error(ErrorCode::unsupported, "no CUDA device or driver found: the driver reports no devices");
  }
  if (err != cudaSuccess) {
    // Without a GPU the runtime says "CUDA driver version is insufficient", which sends
    // people to upgrade a driver they do not have: the driver itself tells "no driver or
    // device here" from "a driver too old or broken" (driver_probe.hpp).
    const cuda_detail::DriverProbe probe = cuda_detail::probe_driver();
    if (cuda_detail::no_driver_or_device(err, probe)) {
      return make_error(ErrorCode::unsupported,
                        std::string("no CUDA device or driver found on this machine (the CUDA runtime says: ") +
                            cudaGetErrorName(err) + "; " + probe.note + ")");
    }
    return make_error(ErrorCode::backend_error,
                      std::string("an NVIDIA driver is installed but CUDA could not start on it: ") +
                          cuda_detail::describe(err) + "; " + probe.note +
                          (err == cudaErrorInsufficientDriver
                               ? " (the driver is older than this build's CUDA runtime " +
                                     std::to_string(CUDART_VERSION / 1000) + "." +
                                     std::to_string(CUDART_VERSION % 1000 / 10) + ")"
                               : std::string()));
  }
  if (options.device < 0 || options.device >= count) {
    return make_error(ErrorCode::invalid_argument,
                      "CUDA device " + std::to_string(options.device) + " does not exist (" +
                          std::to_string(count) + " found)");
  }
  const cuda_detail::DeviceScope bound(options.device);
  return cuda_detail::create_backend(options.device);
}

}  // namespace ferry
