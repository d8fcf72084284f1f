// ferry — several devices in one Runtime (docs/scale.md): which devices it drives
// (DevicesOptions), one device's stack (RuntimeDevice) and the figures of all of
// them together.
//
// Each device has a stack of its own: a backend, a stream order (its streams), a
// pool, a pinned arena and a transfer engine. A handle names its pool, so a handle
// of one device used on another's pool answers stale_handle naming both devices.
//
// Thread safety: as Runtime (runtime.hpp); a RuntimeDevice's components are as
// thread-safe as their headers say.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/result.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"

namespace ferry FERRY_API {

// At most this many devices in one Runtime.
inline constexpr std::uint32_t kMaxDevices = 64;

struct DevicesOptions {
  // How many devices. 1 (the default): RuntimeOptions::backend alone, as before
  // there were several. 0: as many as `profiles` (sim) or `ordinals` (cuda) list,
  // or, when they list none, every device the backend sees (cuda: the visible
  // devices; the sim sees none of its own, so 0 with no profiles is refused).
  std::uint32_t count = 1;
  // sim: device i's profile, a preset name, when i < profiles.size(); else
  // RuntimeOptions::backend's. Device i's seed is backend.seed + i.
  std::vector<std::string> profiles;
  // cuda: device i's ordinal when i < ordinals.size(); else backend.device + i.
  std::vector<int> ordinals;
  // sim: device i's injected faults when i < faults.size(); else backend.faults
  // (report 000's pinned fault on one device's path only, say).
  std::vector<SimFaults> faults;
};

// What Runtime::copy_peer did.
struct PeerCopyReceipt {
  std::uint32_t src_device = 0, dst_device = 0;
  std::uint64_t bytes = 0;
  // true: one device-to-device copy (both blocks on one device); false: through
  // pinned host memory (a download from the source's device, an upload to the
  // destination's).
  bool direct = false;
  // verify: the source's device hash matched the host copy and the destination's
  // device hash matched it too, so destination == source.
  bool verified = false;
  std::uint32_t recovered = 0;  // legs that needed another path (I5)
  // A point on the destination's device after which the copy has completed there.
  StreamPoint done{};
};

// The backend spec of each device `devices` selects over `backend` (what
// Runtime::create builds). Errors: invalid_argument (no device, more than
// kMaxDevices, an ordinal below 0 or listed twice, more profiles or ordinals than
// a nonzero count, a profile name check_spec refuses), unsupported (count 0 on
// cuda with no ordinals listed and no device visible). Blocks while a driver
// initializes (count 0 on cuda).
Result<std::vector<BackendSpec>> device_specs(const BackendSpec& backend, const DevicesOptions& devices);

// One device of a Runtime. Runtime owns it; the references it returns live as
// long as the Runtime. Never fail, never block.
class RuntimeDevice {
 public:
  ~RuntimeDevice();
  RuntimeDevice(const RuntimeDevice&) = delete;
  RuntimeDevice& operator=(const RuntimeDevice&) = delete;

  // Its place in RuntimeOptions::devices (0 ... device_count() - 1).
  std::uint32_t index() const noexcept { return index_; }
  // The backend adaptor when RuntimeOptions::backend_adaptor is set.
  Backend& backend() noexcept { return adaptor_ ? *adaptor_ : *backend_; }
  const Backend& backend() const noexcept { return adaptor_ ? *adaptor_ : *backend_; }
  StreamOrder& order() noexcept { return *order_; }
  DevicePool& pool() noexcept { return *pool_; }
  const DevicePool& pool() const noexcept { return *pool_; }
  HostArena& arena() noexcept { return *arena_; }
  TransferEngine& engine() noexcept { return *engine_; }

 private:
  friend class Runtime;
  explicit RuntimeDevice(std::uint32_t index) noexcept : index_(index) {}

  std::uint32_t index_;
  // Declared in the order they are built; the destructor resets them in reverse.
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Backend> adaptor_;  // wraps backend_; null without a backend adaptor
  std::unique_ptr<StreamOrder> order_;
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<HostArena> arena_;
  std::unique_ptr<TransferEngine> engine_;
};

// The figures of several pools as one: every byte figure and counter summed.
// A peak is the sum of the devices' peaks, which bounds the peak of the sum from
// above (the devices need not have peaked at the same moment). Never fails.
PoolStats total_pool_stats(std::span<const PoolStats> per_device) noexcept;

}  // namespace ferry
