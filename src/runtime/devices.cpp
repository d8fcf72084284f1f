// Several devices in one Runtime (devices.hpp): the spec of each device, and the
// figures of all of them.
#include "ferry/devices.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "core/text.hpp"
#include "ferry/names.hpp"
#include "ferry/runtime.hpp"

namespace ferry {
namespace {

constexpr NamedValue<PeerLink> kPeerLinkNames[] = {
    {PeerLink::none, "none"}, {PeerLink::pcie, "pcie"}, {PeerLink::nvlink, "nvlink"}};

Result<void> check_links(const std::vector<BackendSpec>& specs, const DevicesOptions& devices, BackendKind kind,
                         bool profiled) {
  const auto bad = [](std::string what) { return make_error(ErrorCode::invalid_argument, std::move(what)); };
  // Refused rather than taken as a restriction: a pair the driver links and the
  // program says is unlinked would still be linked (Runtime::link_between asks the driver).
  if (!profiled && !devices.links.empty()) {
    return bad("links between devices are the sim's model; the " + std::string(to_string(kind)) +
               " backend takes each pair's link from its driver (Runtime::link_between), so leave links empty");
  }
  std::set<std::pair<std::uint32_t, std::uint32_t>> pairs;
  for (const PeerLinkSpec& l : devices.links) {
    const std::string name = "link " + std::to_string(l.a) + "-" + std::to_string(l.b);
    if (l.a >= specs.size() || l.b >= specs.size()) {
      return bad(name + " names a device beyond the " + std::to_string(specs.size()) + " asked for");
    }
    if (l.a == l.b) return bad(name + " joins a device to itself");
    if (!pairs.insert(std::minmax(l.a, l.b)).second) return bad(name + " is listed twice");
    if (l.link != PeerLink::pcie && l.link != PeerLink::nvlink) return bad(name + ": the kind is neither pcie nor nvlink");
    if (l.link != PeerLink::nvlink) continue;
    for (const std::uint32_t d : {l.a, l.b}) {
      Result<DeviceProfile> p = spec_profile(specs[d]);
      if (!p.ok()) return bad(name + ": device " + std::to_string(d) + ": " + p.error().message);
      if (!(p->peer_bytes_per_s > 0)) {
        return bad(name + " is nvlink, but device " + std::to_string(d) + "'s profile " + p->name + " has none");
      }
    }
  }
  return {};
}

}  // namespace

PeerLink link_between(const DevicesOptions& devices, std::uint32_t a, std::uint32_t b) noexcept {
  for (const PeerLinkSpec& l : devices.links) {
    if ((l.a == a && l.b == b) || (l.a == b && l.b == a)) return l.link;
  }
  return PeerLink::none;
}

std::string_view to_string(PeerLink link) noexcept { return name_in<PeerLink>(kPeerLinkNames, link); }

Result<PeerLink> parse_peer_link(std::string_view text) { return value_in<PeerLink>(kPeerLinkNames, text, "link"); }

Result<std::vector<PeerLinkSpec>> parse_peer_links(std::string_view links_text) {
  std::vector<PeerLinkSpec> links;
  if (text::trimmed(links_text).empty()) return links;
  for (std::size_t start = 0; start <= links_text.size();) {
    const std::size_t comma = std::min(links_text.find(',', start), links_text.size());
    const std::string_view piece = text::trimmed(links_text.substr(start, comma - start));
    start = comma + 1;
    const auto bad = [&](std::string_view why) {
      return make_error(ErrorCode::invalid_argument, "link " + text::quoted(piece, 64, '\'') + ": " +
                                                         std::string(why) + " (expected A-B:KIND, e.g. 0-1:nvlink)");
    };
    const std::size_t dash = piece.find('-');
    const std::size_t colon = piece.find(':');
    if (dash == std::string_view::npos || colon == std::string_view::npos || colon < dash) {
      return bad("not of the form A-B:KIND");
    }
    const std::optional<std::uint64_t> a = text::parse_u64(piece.substr(0, dash));
    const std::optional<std::uint64_t> b = text::parse_u64(piece.substr(dash + 1, colon - dash - 1));
    if (!a || !b || *a >= kMaxDevices || *b >= kMaxDevices) {
      return bad("a device is not a number below " + std::to_string(kMaxDevices));
    }
    Result<PeerLink> kind = parse_peer_link(piece.substr(colon + 1));
    if (!kind.ok()) return bad(kind.error().message);
    links.push_back({static_cast<std::uint32_t>(*a), static_cast<std::uint32_t>(*b), *kind});
  }
  return links;
}

Result<std::vector<BackendSpec>> device_specs(const BackendSpec& backend, const DevicesOptions& devices) {
  const auto bad = [](std::string what) { return make_error(ErrorCode::invalid_argument, std::move(what)); };
  // A profiled backend (the sim) is told its devices by profile; a real one by ordinal.
  const bool profiled = capabilities_of(backend.kind).profiled;
  const std::size_t listed = profiled ? devices.profiles.size() : devices.ordinals.size();
  const std::string listed_what = profiled ? "profiles" : "ordinals";
  if (!profiled && !devices.faults.empty()) {
    return bad("injected faults per device need the sim backend; the " + std::string(to_string(backend.kind)) +
               " backend runs on real devices");
  }
  if (profiled ? !devices.ordinals.empty() : !devices.profiles.empty()) {
    return bad(std::string(profiled ? "device ordinals" : "device profiles") + " do not apply to the " +
               std::string(to_string(backend.kind)) + " backend (it takes " + listed_what + ")");
  }
  std::uint32_t count = devices.count;
  if (count == 0) {
    if (listed > 0) {
      count = static_cast<std::uint32_t>(std::min<std::size_t>(listed, kMaxDevices + 1));
    } else if (profiled) {
      return bad("a device count of 0 takes the devices from the profiles listed, and none is");
    } else {
      count = visible_devices(backend.kind);
      if (count == 0) {
        return make_error(ErrorCode::unsupported, "a device count of 0 asks for every visible " +
                                                      std::string(to_string(backend.kind)) +
                                                      " device, and this process sees none");
      }
    }
  } else if (listed > count) {
    return bad(std::to_string(listed) + " " + listed_what + " listed for " + std::to_string(count) + " device(s)");
  }
  if (devices.faults.size() > count) {
    return bad(std::to_string(devices.faults.size()) + " fault sets listed for " + std::to_string(count) +
               " device(s)");
  }
  if (count > kMaxDevices) {
    return bad(std::to_string(count) + " devices asked for; at most " + std::to_string(kMaxDevices));
  }
  std::vector<BackendSpec> specs(count, backend);
  std::set<int> ordinals;
  for (std::uint32_t i = 0; i < count; ++i) {
    BackendSpec& s = specs[i];
    if (profiled) {
      if (i < devices.profiles.size()) {
        s.profile = devices.profiles[i];
        s.custom_profile.reset();
        Result<void> ok = check_spec(s);
        if (!ok.ok()) return bad("device " + std::to_string(i) + ": " + ok.error().message);
      }
      if (i < devices.faults.size()) s.faults = devices.faults[i];
      // Devices of one seed would fault alike; each has its own schedule.
      s.seed = backend.seed + i;
    } else {
      s.device = i < devices.ordinals.size() ? devices.ordinals[i] : backend.device + static_cast<int>(i);
      if (s.device < 0) return bad("device " + std::to_string(i) + ": ordinal " + std::to_string(s.device) + " < 0");
      if (!ordinals.insert(s.device).second) {
        return bad("device ordinal " + std::to_string(s.device) + " is listed twice");
      }
    }
  }
  FERRY_TRY(check_links(specs, devices, backend.kind, profiled));
  return specs;
}

PoolStats total_pool_stats(std::span<const PoolStats> per_device) noexcept {
  PoolStats t;
  for (const PoolStats& s : per_device) {
    t.allocated_bytes += s.allocated_bytes, t.peak_allocated_bytes += s.peak_allocated_bytes;
    t.requested_bytes += s.requested_bytes, t.peak_requested_bytes += s.peak_requested_bytes;
    t.reserved_bytes += s.reserved_bytes, t.peak_reserved_bytes += s.peak_reserved_bytes;
    t.active_bytes += s.active_bytes, t.peak_active_bytes += s.peak_active_bytes;
    t.pending_free_bytes += s.pending_free_bytes;
    t.cached_bytes += s.cached_bytes;
    t.allocs += s.allocs, t.frees += s.frees;
    t.internal_allocs += s.internal_allocs, t.internal_frees += s.internal_frees;
    t.ooms += s.ooms;
    t.reclaims += s.reclaims;
    t.ooms_survived += s.ooms_survived;
    t.same_stream_reuses += s.same_stream_reuses;
    t.tight_fits += s.tight_fits;
    t.maps += s.maps, t.unmaps += s.unmaps;
  }
  return t;
}

Result<void> Runtime::connect_devices() {
  const std::size_t n = devices_.size();
  std::vector<std::optional<PeerLink>> answers(n * n);
  for (std::size_t a = 0; a < n; ++a) {
    for (std::size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      Result<std::optional<PeerLink>> l = devices_[a]->backend().connect_peer(devices_[b]->backend());
      if (!l.ok()) {
        Error e = std::move(l).error();
        e.message = "device " + std::to_string(a) + " reading device " + std::to_string(b) + ": " + e.message;
        return e;
      }
      answers[a * n + b] = *l;
    }
  }
  links_.assign(n * n, PeerLink::none);
  for (std::uint32_t a = 0; a < n; ++a) {
    for (std::uint32_t b = a + 1; b < n; ++b) {
      const std::optional<PeerLink> x = answers[a * n + b], y = answers[b * n + a];
      // A link serves copies both ways, so it is the weaker of the two directions' answers.
      const PeerLink link = !x && !y ? ferry::link_between(options_.devices, a, b)
                                     : std::min(x.value_or(PeerLink::none), y.value_or(PeerLink::none));
      links_[a * n + b] = links_[b * n + a] = link;
    }
  }
  return {};
}

PeerLink Runtime::link_between(std::uint32_t a, std::uint32_t b) const noexcept {
  const std::size_t n = devices_.size();
  if (a >= n || b >= n || links_.size() != n * n) return PeerLink::none;
  return links_[a * n + b];
}

Result<RuntimeDevice*> Runtime::find_device(std::uint32_t i) noexcept {
  if (i >= devices_.size()) {
    return make_error(ErrorCode::invalid_argument, "no device " + std::to_string(i) + ": the runtime has " +
                                                       std::to_string(devices_.size()) + " device(s)");
  }
  return devices_[i].get();
}

Result<StreamId> Runtime::adopt_stream(std::uint32_t device, NativeStream native) {
  Result<RuntimeDevice*> d = find_device(device);
  if (!d.ok()) return std::move(d).error();
  std::lock_guard lock(adopt_mu_);
  for (const Adoption& a : adoptions_) {
    if (a.native == native && a.device != device) {
      return make_error(ErrorCode::invalid_argument, "adopt_stream(" + text::hex(native) + ") on device " +
                                                         std::to_string(device) + ": adopted already on device " +
                                                         std::to_string(a.device) + ", as stream " +
                                                         std::to_string(a.stream));
    }
  }
  Result<StreamId> s = (*d)->backend().adopt_stream(native);
  if (s.ok()) adoptions_.push_back({device, *s, native});
  return s;
}

Result<void> Runtime::release_stream(std::uint32_t device, StreamId stream, std::chrono::nanoseconds timeout) {
  Result<RuntimeDevice*> d = find_device(device);
  if (!d.ok()) return std::move(d).error();
  // The wait runs outside adopt_mu_: adopt_stream on other devices goes on meanwhile.
  Result<void> released = (*d)->backend().release_stream(stream, timeout);
  std::lock_guard lock(adopt_mu_);
  if (!released.ok()) {
    Error e = std::move(released).error();
    for (const Adoption& a : adoptions_) {
      if (e.code == ErrorCode::invalid_argument && a.stream == stream && a.device != device) {
        e.message += " of device " + std::to_string(device) + " (it is device " + std::to_string(a.device) + "'s)";
        break;
      }
    }
    return e;
  }
  std::erase_if(adoptions_, [&](const Adoption& a) { return a.device == device && a.stream == stream; });
  return {};
}

std::vector<PoolStats> Runtime::pool_stats() const {
  std::vector<PoolStats> out;
  out.reserve(devices_.size());
  for (const auto& d : devices_) out.push_back(d->pool().stats());
  return out;
}

PoolStats Runtime::total_pool_stats() const {
  const std::vector<PoolStats> each = pool_stats();
  return ferry::total_pool_stats(each);
}

std::string Runtime::memory_summary() const {
  if (devices_.size() == 1) return ferry::memory_summary(devices_.front()->pool());
  std::string out;
  for (const auto& d : devices_) {
    out += "device " + std::to_string(d->index()) + " (" + d->backend().info().device + ")\n";
    out += ferry::memory_summary(d->pool());
  }
  const PoolStats t = total_pool_stats();
  out += "all " + std::to_string(devices_.size()) + " devices (peaks: the sum of each device's)\n";
  const auto line = [&](const char* what, std::uint64_t now, std::uint64_t peak) {
    out += std::string(" ") + what + ": " + std::to_string(now) + " B (peak " + std::to_string(peak) + " B)\n";
  };
  line("allocated", t.allocated_bytes, t.peak_allocated_bytes);
  line("requested", t.requested_bytes, t.peak_requested_bytes);
  line("reserved", t.reserved_bytes, t.peak_reserved_bytes);
  line("active", t.active_bytes, t.peak_active_bytes);
  out += " allocs " + std::to_string(t.allocs) + ", frees " + std::to_string(t.frees) + ", ooms " +
         std::to_string(t.ooms) + ", reclaims " + std::to_string(t.reclaims) + "\n";
  return out;
}

}  // namespace ferry
