#include "workloads/meter.hpp"

#include <algorithm>
#include <utility>

#include "ferry/cost_model.hpp"

namespace ferry::workloads {

std::uint64_t HostClock::now() const {
  std::uint64_t t = 0;
  for (const Backend* d : devices_) t = std::max(t, d->now_ns());
  return t;
}

void HostClock::catch_up(Backend& device) const {
  const std::uint64_t host = now(), mine = device.now_ns();
  if (host > mine) device.advance(host - mine);
}

BusyMeter::BusyMeter(Backend& inner, DeviceProfile profile, const HostClock* clock)
    : ForwardingBackend(inner), profile_(std::move(profile)), clock_(clock) {}


bool BusyMeter::pinned(const std::byte* host, std::uint64_t bytes) const {
  const auto p = reinterpret_cast<std::uintptr_t>(host);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  return p - it->first <= it->second && bytes <= it->second - (p - it->first);
}

Result<Ticket> BusyMeter::enqueue(StreamId stream, Op op) {
  if (clock_ != nullptr) clock_->catch_up(inner_);
  std::uint64_t ns;
  bool copy;
  {
    std::lock_guard lock(mu_);
    ns = modeled_ns(op, profile_, [&](const std::byte* p, std::uint64_t n) { return pinned(p, n); });
    copy = engine_of(op) == Engine::copy_h2d || engine_of(op) == Engine::copy_d2h;
  }
  Result<Ticket> t = inner_.enqueue(stream, std::move(op));
  if (t.ok()) {
    std::lock_guard lock(mu_);
    (copy ? transfer_ns_ : compute_ns_) += ns;
  }
  return t;
}

void BusyMeter::track(const std::byte* ptr, std::uint64_t bytes) {
  std::lock_guard lock(mu_);
  if (bytes > 0) {
    pinned_[reinterpret_cast<std::uintptr_t>(ptr)] = bytes;
  } else {
    pinned_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
}

Result<std::byte*> BusyMeter::allocate_pinned(std::uint64_t bytes) {
  Result<std::byte*> p = inner_.allocate_pinned(bytes);
  if (p.ok()) track(*p, bytes);
  return p;
}

Result<void> BusyMeter::free_pinned(std::byte* ptr) {
  Result<void> r = inner_.free_pinned(ptr);
  if (r.ok()) track(ptr, 0);
  return r;
}

Result<void> BusyMeter::register_host(std::byte* ptr, std::uint64_t bytes) {
  Result<void> r = inner_.register_host(ptr, bytes);
  if (r.ok()) track(ptr, bytes);
  return r;
}

Result<void> BusyMeter::unregister_host(std::byte* ptr) {
  Result<void> r = inner_.unregister_host(ptr);
  if (r.ok()) track(ptr, 0);
  return r;
}

void BusyMeter::reset() {
  std::lock_guard lock(mu_);
  transfer_ns_ = compute_ns_ = 0;
}

std::uint64_t BusyMeter::transfer_ns() const {
  std::lock_guard lock(mu_);
  return transfer_ns_;
}

std::uint64_t BusyMeter::compute_ns() const {
  std::lock_guard lock(mu_);
  return compute_ns_;
}

}  // namespace ferry::workloads
