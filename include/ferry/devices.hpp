// ferry — several devices in one Runtime (docs/scale.md): which devices it drives
// (DevicesOptions), one device's stack (RuntimeDevice) and the figures of all of
// them together.
//
// Each device has a stack of its own: a backend, a stream order (its streams), a
// pool, a pinned arena and a transfer engine. A handle names its pool, so a handle
// of one device used on another's pool answers stale_handle naming both devices.
// A stream of one device waits for another device's point through
// Runtime::order_after (an event of the point's device); on the sim with
// race_check the devices share one race checker, so races between two devices'
// work are found too (race.hpp: RaceAccess::device).
//
// Thread safety: as Runtime (runtime.hpp); a RuntimeDevice's components are as
// thread-safe as their headers say.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
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

// How two devices reach each other (sim: the model; backend.hpp's PeerLink).
struct PeerLinkSpec {
  std::uint32_t a = 0, b = 0;  // the two devices, in either order
  PeerLink link = PeerLink::pcie;
};

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
  // sim: the links between pairs of devices. A pair not listed has none: its
  // peer copies go through pinned host memory. nvlink needs both devices'
  // profiles to have one (DeviceProfile::peer_bytes_per_s > 0). cuda refuses
  // them: each pair's link comes from its driver (Runtime::link_between).
  std::vector<PeerLinkSpec> links;
};

// The link `devices` lists between devices a and b; none when it lists none.
// The model's answer only: a Runtime's pair asks Runtime::link_between.
PeerLink link_between(const DevicesOptions& devices, std::uint32_t a, std::uint32_t b) noexcept;
// "none", "pcie", "nvlink".
std::string_view to_string(PeerLink link) noexcept;
// The link named `text`. Errors: invalid_argument naming the text and the names.
Result<PeerLink> parse_peer_link(std::string_view text);
// Links as text, as the C ABI and the bindings take them: "A-B:KIND" pairs
// separated by commas, e.g. "0-1:nvlink,1-2:pcie" (KIND pcie or nvlink; spaces
// around each pair ignored); "" is no link. Checks the syntax only: device_specs
// checks the pairs against the devices. Errors: invalid_argument naming the pair
// and what is wrong with it.
Result<std::vector<PeerLinkSpec>> parse_peer_links(std::string_view text);

// What Runtime::copy_peer did.
struct PeerCopyReceipt {
  std::uint32_t src_device = 0, dst_device = 0;
  std::uint64_t bytes = 0;
  // true: one device-to-device copy (both blocks on one device, or a peer copy
  // over the pair's link); false: through pinned host memory (a download from the
  // source's device, an upload to the destination's).
  bool direct = false;
  PeerLink link = PeerLink::none;  // the pair's link (none on one device)
  // verify: the source's device hash matched the host copy and the destination's
  // device hash matched it too, so destination == source.
  bool verified = false;
  // Legs that needed another path (I5); a direct copy caught wrong and redone
  // through the host counts one.
  std::uint32_t recovered = 0;
  // A point on the destination's device after which the copy has completed there.
  StreamPoint done{};
};

// The backend spec of each device `devices` selects over `backend` (what
// Runtime::create builds). Errors: invalid_argument (no device, more than
// kMaxDevices, an ordinal below 0 or listed twice, more profiles or ordinals than
// a nonzero count, a profile name check_spec refuses; a link naming a device
// beyond the count, one device twice or a pair twice, a link of kind none or
// unknown, nvlink between profiles without one, links on cuda), unsupported (count 0 on
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
