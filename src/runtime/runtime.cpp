#include "ferry/runtime.hpp"

#include <string>
#include <utility>

#include "ferry/user_kernel.hpp"

namespace ferry {
namespace detail {
// The graph capture's front of calls() (src/runtime/graph.cpp).
std::shared_ptr<PoolCalls> make_graph_capture(Runtime& rt);
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

Result<std::unique_ptr<Runtime>> Runtime::create(RuntimeOptions options) {
  if (options.wait_timeout <= std::chrono::nanoseconds::zero()) {
    return make_error(ErrorCode::invalid_argument,
                      "runtime: wait_timeout must be positive, got " +
                          std::to_string(options.wait_timeout.count()) + " ns");
  }
  // On any early return the destructor takes down what was built so far.
  std::unique_ptr<Runtime> rt(new Runtime(std::move(options)));
  const RuntimeOptions& o = rt->options_;

  Result<std::unique_ptr<Backend>> made = make_backend(o.backend);
  if (!made.ok()) {
    const std::string kind(to_string(o.backend.kind));
    const bool missing = made.error().code == ErrorCode::unsupported;
    return prefixed(std::move(made).error(), missing ? "the " + kind + " backend is not available" : "backend " + kind);
  }
  rt->backend_ = std::move(made).value();
  if (o.backend_adaptor) {
    Result<std::unique_ptr<Backend>> adaptor = o.backend_adaptor(*rt->backend_);
    rt->options_.backend_adaptor = nullptr;  // what it captured need not outlive create()
    if (!adaptor.ok()) return prefixed(std::move(adaptor).error(), "backend adaptor");
    rt->adaptor_ = std::move(adaptor).value();
  }
  rt->order_ = std::make_unique<StreamOrder>(rt->backend(), o.wait_timeout);
  rt->pool_ = std::make_unique<DevicePool>(*rt->order_, o.pool);
  if (!rt->pool_->status().ok()) return prefixed(rt->pool_->status().error(), "device pool");
  rt->arena_ = std::make_unique<HostArena>(*rt->order_, o.arena);
  rt->engine_ = std::make_unique<TransferEngine>(*rt->pool_, *rt->arena_, o.engine);
  if (!rt->engine_->status().ok()) return prefixed(rt->engine_->status().error(), "transfer engine");
  if (o.cache) {
    rt->cache_ = std::make_unique<OffloadCache>(*rt->engine_, *o.cache);
    if (!rt->cache_->status().ok()) return prefixed(rt->cache_->status().error(), "offload cache");
  }
  rt->direct_ = std::make_unique<RuntimeCalls>(*rt);
  rt->capture_ = detail::make_graph_capture(*rt);
  return rt;
}

Runtime::~Runtime() {
  // No work in flight once the memory goes: the components' own teardown
  // waits would otherwise be all that stands between the device and freed memory.
  {
    std::lock_guard lock(calls_mu_);
    pool_adaptor_.reset();
    capture_.reset();
  }
  if (backend_) (void)backend().synchronize();
  direct_.reset();
  cache_.reset();
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
  const FaultCounters faults = (adaptor_ ? *adaptor_ : *backend_).fault_counters();
  if (faults.illegal_accesses > 0) {
    return make_error(ErrorCode::backend_error,
                      "device fault: " + std::to_string(faults.illegal_accesses) +
                          " device operation(s) touched unmapped memory; the backend fails every "
                          "later operation");
  }
  return {};
}

Result<void> Runtime::synchronize() {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::synchronize"));
  Result<void> r = backend().synchronize();
  if (!r.ok() && r.error().code == ErrorCode::backend_error) {
    std::lock_guard lock(fault_mu_);
    // The first fault is the one that explains the rest.
    if (!first_fault_) first_fault_ = r.error();
  }
  return r;
}

std::shared_ptr<PoolCalls> Runtime::calls() const {
  std::lock_guard lock(calls_mu_);
  return capture_;
}

std::shared_ptr<PoolCalls> Runtime::slot_calls() const {
  std::lock_guard lock(calls_mu_);
  if (pool_adaptor_) return pool_adaptor_;
  return std::shared_ptr<PoolCalls>(std::shared_ptr<void>(), direct_.get());  // owned by the Runtime
}

std::shared_ptr<PoolCalls> Runtime::set_pool_adaptor(std::shared_ptr<PoolCalls> adaptor) {
  std::lock_guard lock(calls_mu_);
  std::swap(pool_adaptor_, adaptor);
  return adaptor;
}

Result<Allocation> Runtime::allocate(std::uint64_t bytes, StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("Runtime::allocate"));
  FERRY_TRY(refuse_if_capturing(stream, "Runtime::allocate"));
  return Allocation::allocate(*pool_, bytes, stream);
}

}  // namespace ferry
