// ferry_torch — PyTorch's pluggable allocator (include/ferry/ferry_torch.h) over
// one ferry Runtime per device on the cuda backend.
//
// A device's state: its Runtime (made once, never destroyed), the streams PyTorch
// passed (native -> adopted StreamId) and the live blocks (device address ->
// DeviceHandle), so that free() can find the handle PyTorch does not keep.
//
//   blocks.size() == pool allocs - pool frees made through this file
//
// Lock order: devices_mu, then a DeviceState's mu; neither is held while the pool
// allocates (it may wait in its reclaim) or while a runtime is made.
#include "ferry/ferry_torch.h"

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "capi/pool_stats_c.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_op.hpp"

namespace {

thread_local std::string last_error;

int status_of(ferry::ErrorCode code) { return static_cast<int>(code) + 1; }  // ferry_status's numbering

int written(const ferry::Result<void>& r) {
  if (r.ok()) return FERRY_OK;
  last_error = r.error().message;
  return status_of(r.error().code);
}

// CUDA's cudaStreamLegacy: the legacy default stream as a stream handle that
// events and waits accept (the NULL stream PyTorch passes for its default).
void* const kLegacyDefaultStream = reinterpret_cast<void*>(std::uintptr_t{1});

struct DeviceState {
  std::once_flag made;
  std::unique_ptr<ferry::Runtime> runtime;  // null when making it failed
  ferry::Error failure{ferry::ErrorCode::backend_error, ""};

  std::mutex mu;  // guards streams and blocks
  std::unordered_map<void*, ferry::StreamId> streams;
  std::unordered_map<std::uint64_t, ferry::DeviceHandle> blocks;
};

std::mutex devices_mu;
// Leaked on purpose: PyTorch frees tensors during interpreter teardown, after
// static destructors may have run; a runtime destroyed then would synchronize a
// CUDA context that is already gone.
auto& devices = *new std::unordered_map<int, DeviceState*>();

std::string device_text(int device) { return "device " + std::to_string(device); }

// The device's state, its runtime made on first use; null (with last_error set)
// when the runtime cannot be made.
DeviceState* device_state(int device, bool make) {
  if (device < 0) {
    last_error = device_text(device) + ": not a device ordinal";
    return nullptr;
  }
  DeviceState* state = nullptr;
  {
    std::lock_guard lock(devices_mu);
    auto it = devices.find(device);
    if (it == devices.end()) {
      if (!make) return nullptr;
      it = devices.emplace(device, new DeviceState).first;
    }
    state = it->second;
  }
  // One thread makes the runtime; the others wait here for it (call_once).
  std::call_once(state->made, [&] {
    ferry::RuntimeOptions options;
    options.backend.kind = ferry::BackendKind::cuda;
    options.backend.device = device;
    // PyTorch's copies do not go through ferry's engine: nothing to verify.
    options.engine.policy = ferry::IntegrityPolicy::off;
    auto made = ferry::Runtime::create(options);
    if (made.ok()) {
      state->runtime = std::move(*made);
    } else {
      state->failure = made.error();
    }
  });
  if (state->runtime == nullptr) {
    last_error = "ferry_torch: " + device_text(device) + ": " + state->failure.message;
    return nullptr;
  }
  return state;
}

// The ferry stream of PyTorch's `native` stream, adopted on first sight.
ferry::Result<ferry::StreamId> stream_of(DeviceState& state, void* native) {
  if (native == nullptr) native = kLegacyDefaultStream;
  std::lock_guard lock(state.mu);
  if (auto it = state.streams.find(native); it != state.streams.end()) return it->second;
  auto id = state.runtime->backend().adopt_stream(native);
  if (!id.ok()) return std::move(id).error();
  state.streams.emplace(native, *id);
  return *id;
}

void* malloc_impl(ssize_t size, int device, void* stream) {
  if (size <= 0) return nullptr;  // as cudaMalloc(0): nothing to allocate, no error
  DeviceState* state = device_state(device, true);
  if (state == nullptr) return nullptr;
  const std::string request =
      "ferry_torch_malloc(" + std::to_string(size) + " bytes, " + device_text(device) + "): ";
  auto id = stream_of(*state, stream);
  if (!id.ok()) {
    last_error = request + id.error().message;
    return nullptr;
  }
  ferry::DevicePool& pool = state->runtime->pool();
  auto handle = pool.allocate(static_cast<std::uint64_t>(size), *id);
  if (!handle.ok()) {
    last_error = request + handle.error().message;
    return nullptr;
  }
  auto span = pool.resolve(*handle);
  if (!span.ok()) {  // our bug: a handle just allocated must resolve
    last_error = request + span.error().message;
    (void)pool.free(*handle);
    return nullptr;
  }
  std::lock_guard lock(state->mu);
  state->blocks[span->addr] = *handle;
  return reinterpret_cast<void*>(static_cast<std::uintptr_t>(span->addr));
}

void free_impl(void* ptr, int device, void* stream) {
  if (ptr == nullptr) return;
  const std::string request = "ferry_torch_free(" + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
                              ", " + device_text(device) + "): ";
  DeviceState* state = device_state(device, false);
  if (state == nullptr) {
    if (last_error.empty()) last_error = request + "nothing was allocated on this device";
    return;
  }
  ferry::DeviceHandle handle;
  {
    std::lock_guard lock(state->mu);
    auto it = state->blocks.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == state->blocks.end()) {
      last_error = request + "not a pointer ferry_torch_malloc returned (or freed already)";
      return;
    }
    handle = it->second;
    state->blocks.erase(it);
  }
  ferry::DevicePool& pool = state->runtime->pool();
  // The block stays leased until PyTorch's kernels enqueued on the stream so far
  // have completed; only then may another stream reuse it or the pool unmap it.
  // Without the lease the block could go to another stream under PyTorch's
  // kernels: leaking it beats that (the pool's own rule).
  auto id = stream_of(*state, stream);
  if (!id.ok()) {
    last_error = request + id.error().message + " (the block is kept, not freed)";
    return;
  }
  const ferry::DeviceHandle used[] = {handle};
  if (auto r = ferry::record_use(pool, *id, used); !r.ok()) {
    last_error = request + r.error().message + " (the block is kept, not freed)";
    return;
  }
  if (auto r = pool.free(handle); !r.ok()) last_error = request + r.error().message;
}

// ferry_torch_get_stats's body: `size` is the sized function's argument, nullopt for
// the unsized symbol, which reads out->struct_size.
int get_stats(int device, ferry_pool_stats* out, std::optional<size_t> size) {
  last_error.clear();
  if (out == nullptr) {
    last_error = "ferry_torch_get_stats: out is NULL";
    return FERRY_ERROR_INVALID_ARGUMENT;
  }
  try {
    if (device < 0) {
      last_error = "ferry_torch_get_stats: " + device_text(device) + ": not a device ordinal";
      return FERRY_ERROR_INVALID_ARGUMENT;
    }
    DeviceState* state = device_state(device, false);
    if (state == nullptr) {
      std::lock_guard lock(devices_mu);
      auto it = devices.find(device);
      if (it != devices.end()) return status_of(it->second->failure.code);  // the runtime failed
      // Nothing allocated on this device yet: zeros.
      return written(ferry::detail::write_c_pool_stats(ferry::PoolStats{}, out, ferry::detail::caller_size(out, size),
                                                     "ferry_torch_get_stats"));
    }
    const ferry::PoolStats s = state->runtime->pool().stats();
    return written(
        ferry::detail::write_c_pool_stats(s, out, ferry::detail::caller_size(out, size), "ferry_torch_get_stats"));
  } catch (const std::exception& e) {
    last_error = std::string("ferry_torch_get_stats: ") + e.what();
  } catch (...) {
    last_error = "ferry_torch_get_stats: an unknown exception";
  }
  return FERRY_ERROR_BACKEND;
}

}  // namespace

extern "C" {

void* ferry_torch_malloc(ssize_t size, int device, void* stream) {
  last_error.clear();
  try {
    return malloc_impl(size, device, stream);
  } catch (const std::exception& e) {  // bad_alloc of the bookkeeping: never across the C boundary
    last_error = std::string("ferry_torch_malloc: ") + e.what();
  } catch (...) {
    last_error = "ferry_torch_malloc: an unknown exception";
  }
  return nullptr;
}

void ferry_torch_free(void* ptr, ssize_t /*size: the pool knows the block's*/, int device, void* stream) {
  last_error.clear();
  try {
    free_impl(ptr, device, stream);
  } catch (const std::exception& e) {
    last_error = std::string("ferry_torch_free: ") + e.what();
  } catch (...) {
    last_error = "ferry_torch_free: an unknown exception";
  }
}

const char* ferry_torch_last_error(void) { return last_error.c_str(); }

int ferry_torch_get_stats_sized(int device, ferry_pool_stats* out, size_t struct_size) {
  return get_stats(device, out, struct_size);
}

// The exported symbol behind ferry_torch.h's macro of the same name.
int(ferry_torch_get_stats)(int device, ferry_pool_stats* out) { return get_stats(device, out, std::nullopt); }

}  // extern "C"
