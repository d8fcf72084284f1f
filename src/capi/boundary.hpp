// The C ABI's boundary, shared by its files (ferry_c.cpp, graph_c.cpp, devices_c.cpp, stats_c.cpp,
// device_work_c.cpp): what a
// ferry_runtime is, and how an entry point reports (a status plus this thread's
// message, nothing thrown across).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "ferry/devices.hpp"
#include "ferry/ferry.h"
#include "ferry/multi_device_cache.hpp"
#include "ferry/pool_calls.hpp"
#include "ferry/result.hpp"
#include "ferry/runtime.hpp"

struct ferry_trace_s;  // ferry_c.cpp

struct ferry_runtime_s {
  std::unique_ptr<ferry::Runtime> runtime;
  // Guards only start's and stop's check and swap of the trace (never a call's
  // run, a file's open or a flush), so they are bounded however many threads call.
  std::mutex trace_mu;
  std::shared_ptr<ferry_trace_s> trace;
  std::shared_ptr<ferry::PoolCalls> calls() const { return runtime->calls(); }
  // Tags ferry_get_races handed out: interned, never erased, so the strings stay
  // valid for the runtime's life whatever another thread asks meanwhile.
  std::mutex tags_mu;
  std::set<std::string> tags;
  // ferry_multi_cache_create's cache, set once (under multi_cache_mu) and kept
  // until the runtime goes; declared after `runtime`, so destroyed before it.
  std::mutex multi_cache_mu;
  std::unique_ptr<ferry::MultiDeviceCache> multi_cache;
};

namespace ferry::capi {

// Runs an entry point's body: refused inside a user kernel, an exception turned
// into a status and a message naming `fn`.
ferry_status guarded(const char* fn, const std::function<ferry_status()>& body) noexcept;
// The error's status, its message kept for ferry_last_error.
ferry_status fail(const Error& error);
ferry_status ok();
// INVALID_ARGUMENT: "fn: what is NULL".
ferry_status null_argument(const char* fn, const char* what);
// The Runtime behind `rt`, which must not be NULL.
Runtime& runtime_of(ferry_runtime rt) noexcept;

// An entry point's check of a pointer argument: INVALID_ARGUMENT naming it when
// NULL (null_argument is the file's own or ferry::capi's, found where it is used).
#define FERRY_C_CHECK(cond, fn, what) \
  if (!(cond)) return null_argument(fn, what)

inline DeviceHandle to_cpp(ferry_handle h) { return {h.pool, h.slot, h.generation}; }

// The bodies of ferry_launch (its messages naming `name`) and ferry_synchronize
// over `calls`: device 0's chain (Runtime::calls), or another device's calls
// straight on its pool (devices_c.cpp); `device` is the device they reach.
ferry_status launch_on(PoolCalls& calls, const char* name, uint32_t stream, const ferry_operand* operands,
                       uint32_t operand_count, ferry_launch_fn fn, void* user_data, double flops, uint64_t mem_bytes);
ferry_status synchronize_on(PoolCalls& calls, RuntimeDevice& device);

// The calls on device `device`'s streams and blocks: device 0's are the runtime's
// chain (its trace recorder and graph capture see them, as the calls without
// "device_"); another device's go straight to its pool, engine and backend.
// Errors: invalid_argument (no such device, named). devices_c.cpp.
struct DeviceCalls {
  std::shared_ptr<PoolCalls> calls;
  RuntimeDevice* device = nullptr;
};
Result<DeviceCalls> calls_on(ferry_runtime rt, std::uint32_t device);

// A timeout in milliseconds as the C ABI takes it; past what nanoseconds hold: no bound.
inline std::chrono::nanoseconds timeout_of(uint64_t timeout_ms) {
  constexpr uint64_t kMaxMs = static_cast<uint64_t>(INT64_MAX) / 1'000'000;  // nanoseconds are int64
  return timeout_ms > kMaxMs ? std::chrono::nanoseconds::max()
                             : std::chrono::nanoseconds(static_cast<int64_t>(timeout_ms) * 1'000'000);
}

template <class T>
ferry_status done(const Result<T>& r) {
  return r.ok() ? ok() : fail(r.error());
}

}  // namespace ferry::capi
