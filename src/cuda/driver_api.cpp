#include "cuda/driver_api.hpp"

#include <cuda_runtime_api.h>

namespace ferry::cuda_detail {
namespace {

template <class Fn>
bool query(const char* symbol, Fn& out, std::string& why) {
  void* fn = driver_entry_point(symbol, why);
  out = reinterpret_cast<Fn>(fn);
  return fn != nullptr;
}

}  // namespace

void* driver_entry_point(const char* symbol, std::string& why, unsigned abi) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, abi,
                                                           cudaEnableDefault, &status);
#else
  (void)abi;
  const cudaError_t err = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &status);
#endif
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    why = std::string("the driver does not provide ") + symbol +
          (err != cudaSuccess ? std::string(" (") + cudaGetErrorString(err) + ")" : std::string());
    (void)cudaGetLastError();  // the query's failure is an answer, not a fault
    return nullptr;
  }
  return fn;
}

bool DriverApi::load(std::string& why) {
  // cuGetErrorName only improves messages; its absence is not fatal.
  std::string ignored;
  (void)query("cuGetErrorName", get_error_name, ignored);
  return query("cuDeviceGet", device_get, why) &&
         query("cuDeviceGetAttribute", device_get_attribute, why) &&
         query("cuMemGetAllocationGranularity", mem_get_allocation_granularity, why) &&
         query("cuMemAddressReserve", mem_address_reserve, why) &&
         query("cuMemAddressFree", mem_address_free, why) &&
         query("cuMemCreate", mem_create, why) && query("cuMemRelease", mem_release, why) &&
         query("cuMemMap", mem_map, why) && query("cuMemUnmap", mem_unmap, why) &&
         query("cuMemSetAccess", mem_set_access, why);
}

std::string DriverApi::describe(CUresult result) const {
  const char* name = nullptr;
  if (get_error_name != nullptr && get_error_name(result, &name) == CUDA_SUCCESS && name != nullptr) {
    return std::string(name) + " (" + std::to_string(static_cast<int>(result)) + ")";
  }
  return "CUresult " + std::to_string(static_cast<int>(result));
}

}  // namespace ferry::cuda_detail
