// ferry — the CUDA backend's device address space: reservations and mapped granules.
//
// With the driver's virtual memory management (VMM) a reservation is bare address
// space and every granule mapped into it is its own physical allocation, so any
// granule can be unmapped and returned to the driver without moving its neighbours.
// Without VMM the whole reservation is one cudaMalloc made at reserve time and
// map/unmap only account.
//
// Invariants, per reservation R with granule size g:
//   R.base % g == 0, R.bytes % g == 0, R.state.size() == R.bytes / g
//   mapped_ == g * (number of granules in state `mapped` over all reservations)
//   with VMM: state[i] == mapped  <=>  handles[i] is a live physical allocation mapped
//             at R.base + i * g
//
// Peers: with VMM a mapping is readable by exactly the devices cuMemSetAccess
// named, so a device another one reads from (a peer copy) grants the reader
// access over every granule (grant_peer): those mapped then, and each later map
// names it beside this device. cuMemUnmap drops every access of a mapping (a
// later map of the range starts with none), so an unmap revokes nothing first.
//
// Thread safety: every method may be called from any thread. The table lock is
// never held across a driver call: a map or unmap first marks its granules `busy`,
// drops the lock for the driver calls, then commits. `access_mu_` is taken before
// the table lock: shared by map, unmap and release across their driver calls,
// exclusive by grant_peer, so a grant sees no granule half mapped.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "cuda/driver_api.hpp"
#include "ferry/result.hpp"

namespace ferry::cuda_detail {

class CudaAddressSpace {
 public:
  // `driver` null: the fallback (plain allocations). `granularity` is a power of two.
  // `physical_bytes`: the device's memory (0: unknown); no map beyond it is tried.
  CudaAddressSpace(const DriverApi* driver, CUdevice device, int ordinal,
                   std::uint64_t granularity, std::uint64_t physical_bytes = 0);
  ~CudaAddressSpace();
  CudaAddressSpace(const CudaAddressSpace&) = delete;
  CudaAddressSpace& operator=(const CudaAddressSpace&) = delete;

  // Errors: invalid_argument (size 0 or overflowing), out_of_memory.
  Result<std::uint64_t> reserve(std::uint64_t bytes);
  // Unmaps what is still mapped, then frees the range. Errors: invalid_argument
  // (not a reservation, wrong size, a map/unmap in progress), backend_error.
  Result<void> release(std::uint64_t base, std::uint64_t bytes);
  // All or nothing. Errors: invalid_argument (unaligned, outside one reservation,
  // already mapped), out_of_memory (physical memory exhausted; at once, with no
  // driver call, when bytes exceeds physical_bytes), backend_error.
  Result<void> map(std::uint64_t addr, std::uint64_t bytes);
  // Errors: invalid_argument (unaligned, outside one reservation, not mapped),
  // backend_error.
  Result<void> unmap(std::uint64_t addr, std::uint64_t bytes);
  std::uint64_t mapped_bytes() const;
  // Device `ordinal` may read and write every granule of this space from now on
  // (the granules mapped now at once, each later one as it is mapped). Idempotent;
  // nothing to do without VMM (cudaDeviceEnablePeerAccess covers plain
  // allocations). Errors: backend_error (the peer is not recorded; granules
  // granted before the failure keep the access). Blocks while maps and unmaps run.
  Result<void> grant_peer(int ordinal);

  // ok when [addr, addr + bytes) lies in mapped granules of one reservation (always
  // for bytes == 0); invalid_argument naming `what` otherwise. Catching this before
  // the device touches unmapped memory keeps a caller's bug from becoming a sticky
  // device fault that kills every later operation.
  Result<void> check_mapped(std::uint64_t addr, std::uint64_t bytes, const char* what) const;

  bool virtual_memory() const noexcept { return driver_ != nullptr; }
  std::uint64_t granularity() const noexcept { return granularity_; }

 private:
  enum class Granule : std::uint8_t { unmapped, busy, mapped };
  struct Reservation {
    std::uint64_t bytes = 0;
    void* raw = nullptr;  // fallback only: what cudaMalloc returned
    std::vector<Granule> state;
    std::vector<CUmemGenericAllocationHandle> handles;  // VMM only
  };

  // Lock held. The reservation holding [addr, addr + bytes), or null.
  Reservation* find(std::uint64_t addr, std::uint64_t bytes, std::uint64_t* base);
  const Reservation* find(std::uint64_t addr, std::uint64_t bytes, std::uint64_t* base) const;
  Result<void> check_range(std::uint64_t addr, std::uint64_t bytes, const char* what) const;

  // Driver calls, no lock held.
  // Creates one granule's physical memory and maps it at addr; nothing left on failure.
  Result<CUmemGenericAllocationHandle> map_granule(std::uint64_t addr) const;
  // Read-write access for `devices` over mapped [addr, addr + bytes), which may
  // span many granules.
  Result<void> set_access(std::uint64_t addr, std::uint64_t bytes, const std::vector<CUdevice>& devices) const;
  void unmap_granule(std::uint64_t addr, CUmemGenericAllocationHandle handle) const;
  Error driver_error(CUresult result, const std::string& what) const;

  const DriverApi* driver_;
  CUdevice device_;
  int ordinal_;
  std::uint64_t granularity_;
  std::uint64_t physical_bytes_;

  std::shared_mutex access_mu_;
  std::vector<CUdevice> readers_;  // device_, then each granted peer; written under access_mu_ exclusive
  mutable std::mutex mu_;
  std::map<std::uint64_t, Reservation> reservations_;  // by base address
  std::uint64_t mapped_ = 0;
};

}  // namespace ferry::cuda_detail
