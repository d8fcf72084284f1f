#include "ferry/runtime.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/forwarding_pool_calls.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry {
namespace detail {
// The graph capture at the end of the chain, over `direct` (src/runtime/graph_capture.cpp).
std::shared_ptr<PoolCalls> make_graph_capture(Runtime& rt, PoolCalls& direct);
}  // namespace detail

namespace {

Error prefixed(Error e, const std::string& what) {
  e.message = what + ": " + e.message;
  return e;
}

// The direct calls of a Runtime: synchronize() records the first device fault.
class RuntimeCalls final : public DirectPoolCalls {
 public:
  explicit RuntimeCalls(Runtime& rt) noexcept : DirectPoolCalls(rt.pool(), rt.engine()), rt_(rt) {}
  Result<void> synchronize() override { return rt_.synchronize(); }
  using DirectPoolCalls::synchronize;

 private:
  Runtime& rt_;
};

}  // namespace

namespace detail {

// What calls() returns: each call goes to what sits in the slot when it runs.
class SlotFront final : public ForwardingPoolCalls {
 public:
  explicit SlotFront(Runtime& rt) noexcept : rt_(rt) {}
  DevicePool& pool() noexcept override { return rt_.pool(); }
  TransferEngine& engine() noexcept override { return rt_.engine(); }

 private:
  // The slot's adaptor, or the capture: it may be swapped while a call runs,
  // so each call holds what it started on.
  std::shared_ptr<PoolCalls> next() const override { return rt_.slot_calls(); }
  Runtime& rt_;
};

}  // namespace detail

Result<void> Runtime::build_device(const BackendSpec& spec, std::uint32_t index) {
  const RuntimeOptions& o = options_;
  std::unique_ptr<RuntimeDevice> dev(new RuntimeDevice(index));
  Result<std::unique_ptr<Backend>> made = make_backend(spec);
  if (!made.ok()) {
    const std::string kind(to_string(spec.kind));
    const bool missing = made.error().code == ErrorCode::unsupported;
    return prefixed(std::move(made).error(), missing ? "the " + kind + " backend is not available" : "backend " + kind);
  }
  dev->backend_ = std::move(made).value();
  // Owned by the Runtime from here, so an early return takes it down.
  RuntimeDevice& d = *devices_.emplace_back(std::move(dev));
  // Before its stack enqueues anything (the engine's probe): one race checker for every device.
  if (index > 0) {
    Result<void> joined = d.backend_->join_race_checker(*devices_.front()->backend_);
    if (!joined.ok()) return prefixed(std::move(joined).error(), "backend");
  }
  if (o.backend_adaptor) {
    Result<std::unique_ptr<Backend>> adaptor = o.backend_adaptor(*d.backend_);
    if (!adaptor.ok()) return prefixed(std::move(adaptor).error(), "backend adaptor");
    d.adaptor_ = std::move(adaptor).value();
  }
  d.order_ = std::make_unique<StreamOrder>(d.backend(), o.wait_timeout);
  PoolOptions pool = o.pool;
  pool.device = index;
  d.pool_ = std::make_unique<DevicePool>(*d.order_, pool);
  if (!d.pool_->status().ok()) return prefixed(d.pool_->status().error(), "device pool");
  d.arena_ = std::make_unique<HostArena>(*d.order_, o.arena);
  d.engine_ = std::make_unique<TransferEngine>(*d.pool_, *d.arena_, o.engine);
  if (!d.engine_->status().ok()) return prefixed(d.engine_->status().error(), "transfer engine");
  return {};
}

Result<std::unique_ptr<Runtime>> Runtime::create(RuntimeOptions options) {
  if (options.wait_timeout <= std::chrono::nanoseconds::zero()) {
    return make_error(ErrorCode::invalid_argument,
                      "runtime: wait_timeout must be positive, got " +
                          std::to_string(options.wait_timeout.count()) + " ns");
  }
  Result<std::vector<BackendSpec>> specs = device_specs(options.backend, options.devices);
  if (!specs.ok()) return prefixed(std::move(specs).error(), "runtime devices");
  // On any early return the destructor takes down what was built so far.
  std::unique_ptr<Runtime> rt(new Runtime(std::move(options)));
  rt->options_.pool.device_count = static_cast<std::uint32_t>(specs->size());
  const RuntimeOptions& o = rt->options_;
  for (std::uint32_t i = 0; i < specs->size(); ++i) {
    Result<void> built = rt->build_device((*specs)[i], i);
    if (!built.ok()) {
      if (specs->size() == 1) return std::move(built).error();
      return prefixed(std::move(built).error(), "device " + std::to_string(i));
    }
  }
  rt->options_.backend_adaptor = nullptr;  // what it captured need not outlive create()
  FERRY_TRY(rt->connect_devices());
  if (o.cache) {
    rt->cache_ = std::make_unique<OffloadCache>(rt->engine(), *o.cache);
    if (!rt->cache_->status().ok()) return prefixed(rt->cache_->status().error(), "offload cache");
  }
  rt->direct_ = std::make_unique<RuntimeCalls>(*rt);
  rt->capture_ = detail::make_graph_capture(*rt, *rt->direct_);
  rt->front_ = std::make_shared<detail::SlotFront>(*rt);
  return rt;
}

Runtime::~Runtime() {
  // No work in flight once the memory goes: the components' own teardown
  // waits would otherwise be all that stands between the device and freed memory.
  {
    std::lock_guard lock(calls_mu_);
    front_.reset();
    pool_adaptor_.reset();
    capture_.reset();
  }
  for (auto& d : devices_) (void)d->backend().synchronize();
  release_cross_waits(UINT64_MAX);  // nothing runs now: every wait was issued and completed
  direct_.reset();
  cache_.reset();
  while (!devices_.empty()) devices_.pop_back();
}

RuntimeDevice::~RuntimeDevice() {
  engine_.reset();
  arena_.reset();
  pool_.reset();
  order_.reset();
  adaptor_.reset();
  backend_.reset();
}

Result<void> Runtime::status() const {
  {
    std::lock_guard lock(fault_mu_);
    if (first_fault_) return *first_fault_;
  }
  for (const auto& d : devices_) {
    const FaultCounters faults = d->backend().fault_counters();
    if (faults.illegal_accesses > 0) {
      return make_error(ErrorCode::backend_error,
                        (devices_.size() > 1 ? "device " + std::to_string(d->index()) + ": " : std::string()) +
                            "device fault: " + std::to_string(faults.illegal_accesses) +
                            " device operation(s) touched unmapped memory; the backend fails every "
                            "later operation");
    }
  }
  return {};
}

Result<void> Runtime::synchronize() {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::synchronize"));
  std::uint64_t settled = 0;  // the waits across devices made so far complete by the end
  {
    std::lock_guard lock(cross_mu_);
    settled = cross_seq_;
  }
  Result<void> result;
  for (auto& d : devices_) {
    Result<void> r = d->backend().synchronize();
    if (r.ok()) continue;
    if (devices_.size() > 1) r = prefixed(std::move(r).error(), "device " + std::to_string(d->index()));
    if (r.error().code == ErrorCode::backend_error) {
      std::lock_guard lock(fault_mu_);
      // The first fault is the one that explains the rest.
      if (!first_fault_) first_fault_ = r.error();
    }
    // Every device is still waited for: a fault on one leaves the others' work in flight.
    if (result.ok()) result = std::move(r);
  }
  release_cross_waits(result.ok() ? settled : 0);
  return result;
}

std::shared_ptr<PoolCalls> Runtime::calls() const {
  std::lock_guard lock(calls_mu_);
  return front_;
}

std::shared_ptr<PoolCalls> Runtime::slot_calls() const {
  std::lock_guard lock(calls_mu_);
  if (pool_adaptor_) return pool_adaptor_;
  return capture_;
}

// Set by create and reset only by the destructor, which races with no use.
PoolCalls& Runtime::direct_calls() noexcept { return *capture_; }

void Runtime::note_graph(const GraphEvent& event) const { slot_calls()->note_graph(event); }

std::shared_ptr<PoolCalls> Runtime::set_pool_adaptor(std::shared_ptr<PoolCalls> adaptor) {
  std::lock_guard lock(calls_mu_);
  std::swap(pool_adaptor_, adaptor);
  return adaptor;
}

Result<Allocation> Runtime::allocate(std::uint64_t bytes, StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::allocate"));
  FERRY_TRY(refuse_if_capturing(stream, "Runtime::allocate"));
  return Allocation::allocate(pool(), bytes, stream);
}

}  // namespace ferry
