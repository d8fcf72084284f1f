#include "workloads/meter.hpp"

#include <utility>

#include "ferry/cost_model.hpp"

namespace ferry::workloads {

BusyMeter::BusyMeter(Backend& inner, DeviceProfile profile)
    : ForwardingBackend(inner), profile_(std::move(profile)) {}


bool BusyMeter::pinned(const std::byte* host, std::uint64_t bytes) const {
  const auto p = reinterpret_cast<std::uintptr_t>(host);
  auto it = pinned_.upper_bound(p);
  if (it == pinned_.begin()) return false;
  --it;
  return p - it->first <= it->second && bytes <= it->second - (p - it->first);
}

Result<Ticket> BusyMeter::enqueue(StreamId stream, Op op) {
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

Result<std::byte*> BusyMeter::allocate_pinned(std::uint64_t bytes) {
  Result<std::byte*> p = inner_.allocate_pinned(bytes);
  if (p.ok()) {
    std::lock_guard lock(mu_);
    pinned_[reinterpret_cast<std::uintptr_t>(*p)] = bytes;
  }
  return p;
}

Result<void> BusyMeter::free_pinned(std::byte* ptr) {
  Result<void> r = inner_.free_pinned(ptr);
  if (r.ok()) {
    std::lock_guard lock(mu_);
    pinned_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  return r;
}

Result<void> BusyMeter::register_host(std::byte* ptr, std::uint64_t bytes) {
  Result<void> r = inner_.register_host(ptr, bytes);
  if (r.ok()) {
    std::lock_guard lock(mu_);
    pinned_[reinterpret_cast<std::uintptr_t>(ptr)] = bytes;
  }
  return r;
}

Result<void> BusyMeter::unregister_host(std::byte* ptr) {
  Result<void> r = inner_.unregister_host(ptr);
  if (r.ok()) {
    std::lock_guard lock(mu_);
    pinned_.erase(reinterpret_cast<std::uintptr_t>(ptr));
  }
  return r;
}

void BusyMeter::reset() {
  std::lock_guard lock(mu_);
  transfer_ns_ = compute_ns_ = 0;
}

std::uint64_t BusyMeter::transfer_ns() const {
  std::lock_guard lock(mu_);
  return static_cast<std::uint64_t>(transfer_ns_);
}

std::uint64_t BusyMeter::compute_ns() const {
  std::lock_guard lock(mu_);
  return static_cast<std::uint64_t>(compute_ns_);
}

}  // namespace ferry::workloads
