#include "cuda/address_space.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "core/text.hpp"
#include "cuda/cuda_error.hpp"

namespace ferry::cuda_detail {
namespace {

using text::hex;
using text::range;

}  // namespace

CudaAddressSpace::CudaAddressSpace(const DriverApi* driver, CUdevice device, int ordinal,
                                   std::uint64_t granularity, std::uint64_t physical_bytes)
    : driver_(driver), device_(device), ordinal_(ordinal), granularity_(granularity),
      physical_bytes_(physical_bytes), readers_{device} {}

CudaAddressSpace::~CudaAddressSpace() {
  std::map<std::uint64_t, Reservation> all;
  {
    std::lock_guard lock(mu_);
    all.swap(reservations_);
    mapped_ = 0;
  }
  for (auto& [base, r] : all) {
    if (driver_ == nullptr) {
      (void)cudaFree(r.raw);
      continue;
    }
    for (std::size_t i = 0; i < r.state.size(); ++i) {
      if (r.state[i] == Granule::mapped) unmap_granule(base + i * granularity_, r.handles[i]);
    }
    (void)driver_->mem_address_free(static_cast<CUdeviceptr>(base), r.bytes);
  }
  (void)cudaGetLastError();
}

Error CudaAddressSpace::driver_error(CUresult result, const std::string& what) const {
  const ErrorCode code =
      result == CUDA_ERROR_OUT_OF_MEMORY ? ErrorCode::out_of_memory : ErrorCode::backend_error;
  return make_error(code, what + " failed: " + driver_->describe(result));
}

Result<std::uint64_t> CudaAddressSpace::reserve(std::uint64_t bytes) {
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, "reserve_address of 0 bytes");
  if (bytes > std::numeric_limits<std::uint64_t>::max() - granularity_) {
    return make_error(ErrorCode::invalid_argument,
                      "reserve_address of " + std::to_string(bytes) + " bytes overflows");
  }
  const std::uint64_t size = (bytes + granularity_ - 1) / granularity_ * granularity_;
  Reservation r;
  r.bytes = size;
  r.state.assign(size / granularity_, Granule::unmapped);
  std::uint64_t base = 0;
  if (driver_ != nullptr) {
    CUdeviceptr ptr = 0;
    const CUresult res = driver_->mem_address_reserve(&ptr, size, granularity_, 0, 0);
    if (res != CUDA_SUCCESS) {
      // Address space, not memory, ran out; to the caller the request does not fit.
      return make_error(ErrorCode::out_of_memory,
                        "reserving " + std::to_string(size) +
                            " bytes of device address space failed: " + driver_->describe(res));
    }
    base = static_cast<std::uint64_t>(ptr);
    r.handles.assign(r.state.size(), CUmemGenericAllocationHandle{});
  } else {
    // cudaMalloc aligns to 256 bytes, the contract says granule-aligned: retry with
    // slack when the first pointer is not aligned.
    void* raw = nullptr;
    cudaError_t err = cudaMalloc(&raw, size);
    if (err == cudaSuccess && reinterpret_cast<std::uintptr_t>(raw) % granularity_ != 0) {
      (void)cudaFree(raw);
      raw = nullptr;
      err = cudaMalloc(&raw, size + granularity_);
    }
    if (err != cudaSuccess) {
      return cuda_error(err, "cudaMalloc of " + std::to_string(size) + " bytes (reserve_address)");
    }
    r.raw = raw;
    const auto p = reinterpret_cast<std::uintptr_t>(raw);
    base = (p + granularity_ - 1) / granularity_ * granularity_;
  }
  std::lock_guard lock(mu_);
  reservations_.emplace(base, std::move(r));
  return base;
}

Result<void> CudaAddressSpace::release(std::uint64_t base, std::uint64_t bytes) {
  std::shared_lock grants(access_mu_);  // a grant never names a granule being unmapped
  Reservation r;
  {
    std::lock_guard lock(mu_);
    auto it = reservations_.find(base);
    if (it == reservations_.end()) {
      return make_error(ErrorCode::invalid_argument,
                        "release_address " + hex(base) + ": not a reservation of this backend");
    }
    const std::uint64_t rounded = (bytes + granularity_ - 1) / granularity_ * granularity_;
    if (bytes != it->second.bytes && rounded != it->second.bytes) {
      return make_error(ErrorCode::invalid_argument,
                        "release_address " + hex(base) + " of " + std::to_string(bytes) +
                            " bytes: the reservation has " + std::to_string(it->second.bytes));
    }
    for (const Granule g : it->second.state) {
      if (g == Granule::busy) {
        return make_error(ErrorCode::invalid_argument,
                          "release_address " + hex(base) + " while a map/unmap of it is running");
      }
    }
    for (const Granule g : it->second.state) {
      if (g == Granule::mapped) mapped_ -= granularity_;
    }
    r = std::move(it->second);
    reservations_.erase(it);
  }
  if (driver_ == nullptr) {
    const cudaError_t err = cudaFree(r.raw);
    if (err != cudaSuccess) return cuda_error(err, "cudaFree (release_address " + hex(base) + ")");
    return {};
  }
  for (std::size_t i = 0; i < r.state.size(); ++i) {
    if (r.state[i] == Granule::mapped) unmap_granule(base + i * granularity_, r.handles[i]);
  }
  const CUresult res = driver_->mem_address_free(static_cast<CUdeviceptr>(base), r.bytes);
  if (res != CUDA_SUCCESS) return driver_error(res, "cuMemAddressFree " + range(base, r.bytes));
  return {};
}

CudaAddressSpace::Reservation* CudaAddressSpace::find(std::uint64_t addr, std::uint64_t bytes,
                                                      std::uint64_t* base) {
  return const_cast<Reservation*>(std::as_const(*this).find(addr, bytes, base));
}

const CudaAddressSpace::Reservation* CudaAddressSpace::find(std::uint64_t addr,
                                                            std::uint64_t bytes,
                                                            std::uint64_t* base) const {
  auto it = reservations_.upper_bound(addr);
  if (it == reservations_.begin()) return nullptr;
  --it;
  const std::uint64_t offset = addr - it->first;
  if (offset >= it->second.bytes || bytes > it->second.bytes - offset) return nullptr;
  *base = it->first;
  return &it->second;
}

Result<void> CudaAddressSpace::check_range(std::uint64_t addr, std::uint64_t bytes,
                                           const char* what) const {
  if (bytes == 0 || addr % granularity_ != 0 || bytes % granularity_ != 0) {
    return make_error(ErrorCode::invalid_argument,
                      std::string(what) + " " + range(addr, bytes) +
                          ": address and size must be non-zero multiples of the granularity (" +
                          std::to_string(granularity_) + ")");
  }
  return {};
}

Result<CUmemGenericAllocationHandle> CudaAddressSpace::map_granule(std::uint64_t addr) const {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device_;
  CUmemGenericAllocationHandle handle{};
  CUresult res = driver_->mem_create(&handle, granularity_, &prop, 0);
  if (res != CUDA_SUCCESS) return driver_error(res, "cuMemCreate of one granule");
  res = driver_->mem_map(static_cast<CUdeviceptr>(addr), granularity_, 0, handle, 0);
  if (res != CUDA_SUCCESS) {
    (void)driver_->mem_release(handle);
    return driver_error(res, "cuMemMap at " + hex(addr));
  }
  return handle;
}

Result<void> CudaAddressSpace::set_access(std::uint64_t addr, std::uint64_t bytes,
                                          const std::vector<CUdevice>& devices) const {
  std::vector<CUmemAccessDesc> access(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = devices[i];
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  const CUresult res = driver_->mem_set_access(static_cast<CUdeviceptr>(addr), bytes, access.data(), access.size());
  if (res != CUDA_SUCCESS) return driver_error(res, "cuMemSetAccess " + range(addr, bytes));
  return {};
}

Result<void> CudaAddressSpace::grant_peer(int ordinal) {
  if (driver_ == nullptr) return {};
  CUdevice peer{};
  if (const CUresult res = driver_->device_get(&peer, ordinal); res != CUDA_SUCCESS) {
    return driver_error(res, "cuDeviceGet(" + std::to_string(ordinal) + ")");
  }
  std::unique_lock grants(access_mu_);  // no map or unmap runs: no granule is busy
  if (std::find(readers_.begin(), readers_.end(), peer) != readers_.end()) return {};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;  // mapped runs: address, bytes
  {
    std::lock_guard lock(mu_);
    for (const auto& [base, r] : reservations_) {
      for (std::size_t i = 0; i < r.state.size(); ++i) {
        if (r.state[i] != Granule::mapped) continue;
        const std::uint64_t addr = base + i * granularity_;
        if (!runs.empty() && runs.back().first + runs.back().second == addr) {
          runs.back().second += granularity_;
        } else {
          runs.emplace_back(addr, granularity_);
        }
      }
    }
  }
  for (const auto& [addr, bytes] : runs) {
    if (Result<void> r = set_access(addr, bytes, {peer}); !r.ok()) {
      Error e = std::move(r).error();
      e.message = "granting device " + std::to_string(ordinal) + " access to device " + std::to_string(ordinal_) +
                  "'s memory: " + e.message;
      return e;
    }
  }
  readers_.push_back(peer);
  return {};
}

void CudaAddressSpace::unmap_granule(std::uint64_t addr, CUmemGenericAllocationHandle handle) const {
  // Unmapping first, then dropping our handle, returns the memory to the driver.
  (void)driver_->mem_unmap(static_cast<CUdeviceptr>(addr), granularity_);
  (void)driver_->mem_release(handle);
}

Result<void> CudaAddressSpace::map(std::uint64_t addr, std::uint64_t bytes) {
  FERRY_TRY(check_range(addr, bytes, "map"));
  std::shared_lock grants(access_mu_);  // readers_ holds still until the granules are committed
  // A run larger than the device can never be mapped: refused before one granule is
  // created, instead of creating and releasing the whole device's worth one by one.
  if (physical_bytes_ != 0 && bytes > physical_bytes_) {
    return make_error(ErrorCode::out_of_memory, "map " + range(addr, bytes) + ": larger than the device's " +
                                                    std::to_string(physical_bytes_) + " bytes of memory");
  }
  std::uint64_t base = 0;
  std::size_t first = 0;
  const std::size_t count = bytes / granularity_;
  {
    std::lock_guard lock(mu_);
    Reservation* r = find(addr, bytes, &base);
    if (r == nullptr) {
      return make_error(ErrorCode::invalid_argument,
                        "map " + range(addr, bytes) + ": not inside one reservation");
    }
    first = (addr - base) / granularity_;
    for (std::size_t i = first; i < first + count; ++i) {
      if (r->state[i] != Granule::unmapped) {
        return make_error(ErrorCode::invalid_argument,
                          "map " + range(addr, bytes) + ": granule at " +
                              hex(base + i * granularity_) + " is already mapped");
      }
    }
    if (driver_ == nullptr) {  // the fallback's memory exists already: only account
      for (std::size_t i = first; i < first + count; ++i) r->state[i] = Granule::mapped;
      mapped_ += bytes;
      return {};
    }
    for (std::size_t i = first; i < first + count; ++i) r->state[i] = Granule::busy;
  }

  // Physical memory, one allocation per granule, so each can later be unmapped
  // alone; access is set once over the whole run (one call, not one per granule).
  std::vector<CUmemGenericAllocationHandle> handles;
  handles.reserve(count);
  std::optional<Error> failure;
  for (std::size_t i = 0; i < count; ++i) {
    auto h = map_granule(addr + i * granularity_);
    if (!h.ok()) {
      Error e = std::move(h).error();
      if (e.code == ErrorCode::out_of_memory) {
        e.message = "map " + range(addr, bytes) + ": device memory exhausted after " +
                    std::to_string(i * granularity_) + " of " + std::to_string(bytes) +
                    " bytes (" + e.message + ")";
      }
      failure = std::move(e);
      break;
    }
    handles.push_back(*h);
  }
  if (!failure) {
    if (auto access = set_access(addr, bytes, readers_); !access.ok()) failure = std::move(access).error();
  }
  if (failure) {  // all or nothing: every granule mapped so far goes back
    for (std::size_t i = 0; i < handles.size(); ++i) {
      unmap_granule(addr + i * granularity_, handles[i]);
    }
  }

  std::lock_guard lock(mu_);
  Reservation* r = find(addr, bytes, &base);  // busy granules keep it from being released
  for (std::size_t i = 0; i < count; ++i) {
    r->state[first + i] = failure ? Granule::unmapped : Granule::mapped;
    if (!failure) r->handles[first + i] = handles[i];
  }
  if (failure) {
    failure->message += "; mapped in total: " + std::to_string(mapped_) + " bytes";
    return std::move(*failure);
  }
  mapped_ += bytes;
  return {};
}

Result<void> CudaAddressSpace::unmap(std::uint64_t addr, std::uint64_t bytes) {
  FERRY_TRY(check_range(addr, bytes, "unmap"));
  std::shared_lock grants(access_mu_);  // a grant never names a granule being unmapped
  std::uint64_t base = 0;
  std::size_t first = 0;
  const std::size_t count = bytes / granularity_;
  std::vector<CUmemGenericAllocationHandle> handles;
  {
    std::lock_guard lock(mu_);
    Reservation* r = find(addr, bytes, &base);
    if (r == nullptr) {
      return make_error(ErrorCode::invalid_argument,
                        "unmap " + range(addr, bytes) + ": not inside one reservation");
    }
    first = (addr - base) / granularity_;
    for (std::size_t i = first; i < first + count; ++i) {
      if (r->state[i] != Granule::mapped) {
        return make_error(ErrorCode::invalid_argument,
                          "unmap " + range(addr, bytes) + ": granule at " +
                              hex(base + i * granularity_) + " is not mapped");
      }
    }
    if (driver_ == nullptr) {
      for (std::size_t i = first; i < first + count; ++i) r->state[i] = Granule::unmapped;
      mapped_ -= bytes;
      return {};
    }
    for (std::size_t i = first; i < first + count; ++i) {
      r->state[i] = Granule::busy;
      handles.push_back(r->handles[i]);
    }
  }
  // The caller guarantees no enqueued work touches these granules any more (I2):
  // cuMemUnmap does not wait for the device.
  for (std::size_t i = 0; i < count; ++i) unmap_granule(addr + i * granularity_, handles[i]);
  std::lock_guard lock(mu_);
  Reservation* r = find(addr, bytes, &base);
  for (std::size_t i = first; i < first + count; ++i) {
    r->state[i] = Granule::unmapped;
    r->handles[i] = CUmemGenericAllocationHandle{};
  }
  mapped_ -= bytes;
  return {};
}

std::uint64_t CudaAddressSpace::mapped_bytes() const {
  std::lock_guard lock(mu_);
  return mapped_;
}

Result<void> CudaAddressSpace::check_mapped(std::uint64_t addr, std::uint64_t bytes,
                                            const char* what) const {
  if (bytes == 0) return {};
  if (addr > std::numeric_limits<std::uint64_t>::max() - bytes) {
    return make_error(ErrorCode::invalid_argument,
                      std::string(what) + ": device range " + range(addr, bytes) + " overflows");
  }
  std::lock_guard lock(mu_);
  std::uint64_t base = 0;
  const Reservation* r = find(addr, bytes, &base);
  if (r != nullptr) {
    const std::size_t first = (addr - base) / granularity_;
    const std::size_t last = (addr - base + bytes - 1) / granularity_;
    bool all = true;
    for (std::size_t i = first; i <= last && all; ++i) all = r->state[i] == Granule::mapped;
    if (all) return {};
  }
  return make_error(ErrorCode::invalid_argument,
                    std::string(what) + ": device range " + range(addr, bytes) +
                        " is not mapped memory of this backend");
}

}  // namespace ferry::cuda_detail
