// Internal to the workloads: the busy-time meter, a backend adaptor that charges
// every enqueued op's modeled duration to its engine.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "ferry/device_profile.hpp"
#include "ferry/forwarding_backend.hpp"

namespace ferry::workloads {

// The host's clock over several modeled devices. The host is one thread and
// each device's clock moves only while the host waits on it (or advances it), so
// the host's time is the latest of the devices' clocks; work the host enqueues on
// a device is issued then, not at that device's own, earlier time. catch_up()
// moves a device's clock up to it (the device runs what it had meanwhile).
// Thread safety: add() before any other call; then called from the one thread
// that runs the workload.
class HostClock {
 public:
  void add(Backend& device) { devices_.push_back(&device); }
  std::uint64_t now() const;
  void catch_up(Backend& device) const;

 private:
  std::vector<Backend*> devices_;
};

// A Backend adaptor that forwards everything and adds each enqueued operation's
// modeled duration to its engine's busy time (the one cost model, cost_model.hpp,
// that the sim's clock runs on). It tracks pinned and registered host ranges itself, since copy
// bandwidth depends on them.
class BusyMeter final : public ForwardingBackend {
 public:
  // clock: several devices' host clock, caught up with before every enqueue (null: one device).
  BusyMeter(Backend& inner, DeviceProfile profile, const HostClock* clock = nullptr);
  Result<Ticket> enqueue(StreamId stream, Op op) override;
  Result<std::byte*> allocate_pinned(std::uint64_t bytes) override;
  Result<void> free_pinned(std::byte* ptr) override;
  Result<void> register_host(std::byte* ptr, std::uint64_t bytes) override;
  Result<void> unregister_host(std::byte* ptr) override;

  void reset();
  std::uint64_t transfer_ns() const;
  std::uint64_t compute_ns() const;

 private:
  bool pinned(const std::byte* host, std::uint64_t bytes) const;  // under mu_
  void track(const std::byte* ptr, std::uint64_t bytes);          // bytes 0: untrack

  DeviceProfile profile_;
  const HostClock* clock_;
  mutable std::mutex mu_;
  std::map<std::uintptr_t, std::uint64_t> pinned_;  // start -> bytes
  std::uint64_t transfer_ns_ = 0, compute_ns_ = 0;
};

}  // namespace ferry::workloads
