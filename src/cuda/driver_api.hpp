// ferry — the few CUDA driver calls the backend needs, reached without linking libcuda.
//
// Binaries link the CUDA runtime statically and never the driver library: machines
// without a GPU have only its stub, and a binary linked to the stub does not start.
// The runtime loads the real driver at run time, and its entry-point query hands out
// the driver functions below. Every pointer is null until load() succeeds.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace ferry::cuda_detail {

// The ABI version the entry points below are asked for: their typedefs are the ones in
// effect at CUDA 12.0, and a 12.x or 13.x driver serves them.
constexpr unsigned kDriverAbi = 12000;

struct DriverApi {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_get_attribute = nullptr;
  // Virtual memory management (CUDA 10.2+).
  PFN_cuMemGetAllocationGranularity_v10020 mem_get_allocation_granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 mem_address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 mem_address_free = nullptr;
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;

  // Queries every entry point from the runtime (which must be initialized). Returns
  // false and says which symbol is missing when one is; the backend then runs
  // without virtual memory management.
  bool load(std::string& why);

  // "CUDA_ERROR_OUT_OF_MEMORY (2)"; works before load() too.
  std::string describe(CUresult result) const;
};

// The driver's entry point `symbol` at ABI version `abi` (12040 for one CUDA 12.4
// introduced), from the runtime (which must be initialized); null, and `why` says so,
// where the driver lacks it.
void* driver_entry_point(const char* symbol, std::string& why, unsigned abi = kDriverAbi);

}  // namespace ferry::cuda_detail
