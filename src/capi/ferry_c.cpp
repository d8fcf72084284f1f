// ferry — the C ABI (include/ferry/ferry.h) over the C++ API: a Runtime per
// ferry_runtime, errors as a status plus this thread's message, nothing thrown
// across the boundary.
#include "ferry/ferry.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <fstream>
#include <memory>
#include <mutex>
#include <functional>
#include <future>
#include <set>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "capi/boundary.hpp"
#include "capi/pool_stats_c.hpp"
#include "capi/struct_prefix.hpp"
#include "ferry/fault_spec.hpp"
#include "ferry/graph.hpp"
#include "ferry/integrity.hpp"
#include "ferry/runtime.hpp"
#include "ferry/torch_snapshot.hpp"
#include "ferry/trace_recorder.hpp"
#include "ferry/user_kernel.hpp"
#include "ferry/user_op.hpp"

// A recording in progress, in the runtime's pool adaptor slot. Each call goes
// through Runtime::calls(), which holds a reference for the call's whole run, so
// a call and its trace line are never split by ferry_trace_stop; the last
// reference flushes and hands the result to the stop that waits for it.
struct ferry_trace_s {
  std::unique_ptr<ferry::RecordingPool> recorder;
  std::promise<ferry::Result<void>> flushed;
  ~ferry_trace_s() { flushed.set_value(recorder->flush()); }
};

namespace {

using ferry::ErrorCode;

thread_local std::string t_last_error;

// The one mapping between ferry's error codes and the ABI's statuses, read both ways.
constexpr std::pair<ErrorCode, ferry_status> kStatuses[] = {
    {ErrorCode::out_of_memory, FERRY_ERROR_OUT_OF_MEMORY},
    {ErrorCode::stale_handle, FERRY_ERROR_STALE_HANDLE},
    {ErrorCode::invalid_argument, FERRY_ERROR_INVALID_ARGUMENT},
    {ErrorCode::transfer_corrupt, FERRY_ERROR_TRANSFER_CORRUPT},
    {ErrorCode::backend_error, FERRY_ERROR_BACKEND},
    {ErrorCode::unsupported, FERRY_ERROR_UNSUPPORTED},
    {ErrorCode::timeout, FERRY_ERROR_TIMEOUT},
};

ferry_status status_of(ErrorCode code) {
  for (const auto& [c, s] : kStatuses) {
    if (c == code) return s;
  }
  return FERRY_ERROR_BACKEND;
}

// A C caller may pass or return any int as a ferry_status, but a C++ enum without
// a fixed type holds only 0..7: its value is read from its bytes, never as the enum.
int status_value(const ferry_status& status) {
  int v = 0;
  static_assert(sizeof v == sizeof status);
  std::memcpy(&v, &status, sizeof v);
  return v;
}

ErrorCode code_of(int status) {
  for (const auto& [c, s] : kStatuses) {
    if (s == status) return c;
  }
  return ErrorCode::backend_error;
}

const char* name_of(int status) {
  if (status == FERRY_OK) return "ok";
  if (status < FERRY_OK || status > FERRY_ERROR_TIMEOUT) return "unknown";
  return ferry::to_string(code_of(status)).data();
}

ferry_status fail(const ferry::Error& error) {
  t_last_error = error.message;
  return status_of(error.code);
}

ferry_status fail(ferry_status status, const char* message) {
  t_last_error = message;
  return status;
}

// `call`'s refusal of a stream id outside 0..kMaxStreams-1 (checked before it
// indexes anything per stream).
ferry_status stream_out_of_range(const char* call, uint32_t stream) {
  return fail(ferry::check_stream(stream, call).error());
}

ferry_status ok() {
  t_last_error.clear();
  return FERRY_OK;
}

template <class T>
ferry_status done(const ferry::Result<T>& r) {
  return r.ok() ? ok() : fail(r.error());
}

// Every entry point runs its body here: a C++ exception never crosses the ABI.
template <class Body>
ferry_status guarded(const char* fn, Body&& body) noexcept {
  try {
    if (ferry::Result<void> inside = ferry::refuse_inside_user_kernel(fn); !inside.ok()) return fail(inside.error());
    return body();
  } catch (const std::bad_alloc&) {
    t_last_error = std::string(fn) + ": out of host memory";
    return FERRY_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    t_last_error = std::string(fn) + ": internal error: " + e.what();
    return FERRY_ERROR_BACKEND;
  } catch (...) {
    t_last_error = std::string(fn) + ": internal error";
    return FERRY_ERROR_BACKEND;
  }
}

using ferry::capi::to_cpp;
ferry_handle to_c(ferry::DeviceHandle h) { return {h.pool, h.slot, h.generation}; }

ferry_status null_argument(const char* fn, const char* what) {
  return fail(FERRY_ERROR_INVALID_ARGUMENT, (std::string(fn) + ": " + what + " is NULL").c_str());
}

ferry_runtime_options default_options() {
  ferry_runtime_options o{};
  o.struct_size = sizeof o;
  o.seed = 1;
  return o;
}

// Every struct of ferry.h by name, for ferry_struct_size.
constexpr std::pair<std::string_view, std::size_t> kStructSizes[] = {
    {"ferry_handle", sizeof(ferry_handle)},
    {"ferry_runtime_options", sizeof(ferry_runtime_options)},
    {"ferry_operand", sizeof(ferry_operand)},
    {"ferry_launch_context", sizeof(ferry_launch_context)},
    {"ferry_pool_stats", sizeof(ferry_pool_stats)},
    {"ferry_integrity_stats", sizeof(ferry_integrity_stats)},
    {"ferry_race_side", sizeof(ferry_race_side)},
    {"ferry_race", sizeof(ferry_race)},
    {"ferry_cache_stats", sizeof(ferry_cache_stats)},
    {"ferry_multi_cache_stats", sizeof(ferry_multi_cache_stats)},
};

ferry::Result<ferry::RuntimeOptions> runtime_options(const ferry_runtime_options& o) {
  ferry::RuntimeOptions options;
  if (o.backend != nullptr) {
    auto kind = ferry::parse_backend_kind(o.backend);
    if (!kind.ok()) return std::move(kind).error();
    options.backend.kind = *kind;
  }
  if (o.profile != nullptr) options.backend.profile = o.profile;
  options.backend.seed = o.seed;
  if (o.inject != nullptr && *o.inject != '\0') {
    auto faults = ferry::parse_fault_spec(o.inject);
    if (!faults.ok()) return std::move(faults).error();
    options.backend.faults = *faults;
  }
  if (o.integrity != nullptr) {
    auto policy = ferry::parse_integrity_policy(o.integrity);
    if (!policy.ok()) return std::move(policy).error();
    options.engine.policy = *policy;
  }
  options.pool.capacity = o.capacity;
  options.backend.race_check = o.race_check != 0;
  options.devices.count = o.device_count <= 1 ? 1 : static_cast<std::uint32_t>(std::min<uint64_t>(o.device_count, UINT32_MAX));
  if (o.links != nullptr) {
    auto links = ferry::parse_peer_links(o.links);
    if (!links.ok()) return std::move(links).error();
    options.devices.links = std::move(links).value();
  }
  if (o.cache_slots > 0) {
    ferry::CacheOptions cache;
    cache.slots = o.cache_slots;
    cache.slot_bytes = o.cache_slot_bytes;
    options.cache = cache;
  }
  return options;
}

}  // namespace

extern "C" {

const char* ferry_version(void) { return FERRY_VERSION_STRING; }

const char* ferry_status_name(ferry_status status) { return name_of(status_value(status)); }

const char* ferry_last_error(void) { return t_last_error.c_str(); }

size_t ferry_struct_size(const char* name) {
  if (name == nullptr) return 0;
  for (const auto& [n, size] : kStructSizes) {
    if (n == name) return size;
  }
  return 0;
}

ferry_status ferry_runtime_options_init_sized(ferry_runtime_options* options, size_t struct_size) {
  return guarded("ferry_runtime_options_init", [&] {
    FERRY_C_CHECK(options != nullptr, "ferry_runtime_options_init", "options");
    ferry::Result<void> size = ferry::detail::check_struct_size<ferry_runtime_options>(
        ferry::detail::size_argument(struct_size), FERRY_RUNTIME_OPTIONS_V1_SIZE, "ferry_runtime_options_init",
        "ferry_runtime_options");
    if (!size.ok()) return fail(size.error());
    ferry_runtime_options defaults = default_options();
    defaults.struct_size = std::min(struct_size, sizeof defaults);
    std::memcpy(static_cast<void*>(options), &defaults, defaults.struct_size);
    return ok();
  });
}

// The exported symbol behind ferry.h's macro of the same name.
void(ferry_runtime_options_init)(ferry_runtime_options* options) {
  if (options != nullptr) *options = default_options();
}

ferry_status ferry_runtime_create(const ferry_runtime_options* options, ferry_runtime* out) {
  return guarded("ferry_runtime_create", [&] {
    FERRY_C_CHECK(out != nullptr, "ferry_runtime_create", "out");
    ferry::Result<ferry_runtime_options> given =
        options == nullptr ? default_options()
                           : ferry::detail::read_prefix(*options, default_options(), FERRY_RUNTIME_OPTIONS_V1_SIZE,
                                                        "ferry_runtime_create", "options", "ferry_runtime_options");
    if (!given.ok()) return fail(given.error());
    auto cpp = runtime_options(*given);
    if (!cpp.ok()) return fail(cpp.error());
    auto runtime = ferry::Runtime::create(std::move(cpp).value());
    if (!runtime.ok()) return fail(runtime.error());
    auto rt = std::make_unique<ferry_runtime_s>();
    rt->runtime = std::move(runtime).value();
    *out = rt.release();
    return ok();
  });
}

void ferry_runtime_destroy(ferry_runtime rt) {
  // A destructor reports nothing: the trace is flushed, the runtime waits for its work.
  (void)guarded("ferry_runtime_destroy", [&] {
    delete rt;
    return FERRY_OK;
  });
}

ferry_status ferry_alloc(ferry_runtime rt, uint64_t bytes, uint32_t stream, ferry_handle* out) {
  return guarded("ferry_alloc", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_alloc", "rt");
    FERRY_C_CHECK(out != nullptr, "ferry_alloc", "out");
    auto h = rt->calls()->allocate(bytes, stream);
    if (!h.ok()) return fail(h.error());
    *out = to_c(*h);
    return ok();
  });
}

ferry_status ferry_free(ferry_runtime rt, ferry_handle h) {
  return guarded("ferry_free", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_free", "rt");
    return done(rt->calls()->free(to_cpp(h)));
  });
}

ferry_status ferry_device_address(ferry_runtime rt, ferry_handle h, uint64_t* addr, uint64_t* bytes) {
  return guarded("ferry_device_address", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_device_address", "rt");
    auto span = rt->runtime->pool().resolve(to_cpp(h));
    if (!span.ok()) return fail(span.error());
    if (addr != nullptr) *addr = span->addr;
    if (bytes != nullptr) *bytes = span->bytes;
    return ok();
  });
}

ferry_status ferry_set_tag(ferry_runtime rt, ferry_handle h, const char* tag) {
  return guarded("ferry_set_tag", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_set_tag", "rt");
    const std::string_view name = tag != nullptr ? std::string_view(tag) : std::string_view{};
    ferry::Result<void> r = rt->runtime->pool().set_tag(to_cpp(h), name);
    if (!r.ok()) return fail(r.error());
    return ok();
  });
}

ferry_status ferry_trim(ferry_runtime rt) {
  return guarded("ferry_trim", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_trim", "rt");
    return done(rt->calls()->trim());
  });
}

ferry_status ferry_upload(ferry_runtime rt, uint32_t stream, ferry_handle dst, uint64_t dst_offset, const void* src,
                          uint64_t bytes) {
  return guarded("ferry_upload", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_upload", "rt");
    FERRY_C_CHECK(src != nullptr, "ferry_upload", "src");
    ferry::TransferPlan plan;
    plan.add(static_cast<const std::byte*>(src), to_cpp(dst), dst_offset, bytes);
    return done(rt->calls()->upload(stream, plan));
  });
}

ferry_status ferry_download(ferry_runtime rt, uint32_t stream, ferry_handle src, uint64_t src_offset, void* dst,
                            uint64_t bytes) {
  return guarded("ferry_download", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_download", "rt");
    FERRY_C_CHECK(dst != nullptr, "ferry_download", "dst");
    if (bytes == 0) return fail(FERRY_ERROR_INVALID_ARGUMENT, "ferry_download: 0 bytes");
    const std::span<std::byte> out(static_cast<std::byte*>(dst), bytes);
    return done(rt->calls()->download(stream, to_cpp(src), src_offset, out));
  });
}

namespace {

ferry_status launch_body(ferry::PoolCalls& calls, const char* name, uint32_t stream, const ferry_operand* operands,
                         uint32_t operand_count, ferry_launch_fn fn, void* user_data, double flops,
                         uint64_t mem_bytes) {
  FERRY_C_CHECK(fn != nullptr, name, "fn");
  FERRY_C_CHECK(operands != nullptr || operand_count == 0, name, "operands");
  std::vector<ferry::Operand> ops;
  ops.reserve(operand_count);
  for (uint32_t i = 0; i < operand_count; ++i) {
    const ferry_operand& o = operands[i];
    ferry::Access access;
    switch (o.access) {
      case FERRY_READ: access = ferry::Access::read; break;
      case FERRY_WRITE: access = ferry::Access::write; break;
      case FERRY_READ_WRITE: access = ferry::Access::read_write; break;
      default:
        return fail(FERRY_ERROR_INVALID_ARGUMENT,
                    (std::string(name) + ": operand " + std::to_string(i) + " has access " + std::to_string(o.access) +
                     " (FERRY_READ, FERRY_WRITE or FERRY_READ_WRITE)").c_str());
    }
    ops.push_back({to_cpp(o.handle), access, o.offset, o.bytes == 0 ? ferry::kRestOfBlock : o.bytes});
  }
  // Runs later, at dispatch (cuda) or completion (sim), under the backend's lock.
  ferry::UserKernel kernel = [fn, user_data](const ferry::KernelLaunch& l) -> ferry::Result<void> {
    std::vector<uint64_t> addrs, sizes;
    std::vector<void*> views;
    for (const ferry::KernelArg& a : l.args) {
      addrs.push_back(a.addr);
      sizes.push_back(a.bytes);
      views.push_back(!a.out.empty() ? static_cast<void*>(a.out.data())
                                     : const_cast<std::byte*>(a.in.data()));  // read-only by contract
    }
    const bool sim = l.stream == nullptr;
    const ferry_launch_context ctx{l.stream, static_cast<uint32_t>(l.args.size()), addrs.data(), sizes.data(),
                                   sim ? views.data() : nullptr};
    const int s = status_value(fn(&ctx, user_data));
    if (s == FERRY_OK) return {};
    return ferry::make_error(code_of(s), "the launch function returned " + std::string(name_of(s)) + " (" +
                                             std::to_string(s) + ")");
  };
  return done(calls.user(stream, ops, std::move(kernel), {flops, mem_bytes}));
}

}  // namespace

ferry_status ferry_launch(ferry_runtime rt, uint32_t stream, const ferry_operand* operands, uint32_t operand_count,
                          ferry_launch_fn fn, void* user_data, double flops, uint64_t mem_bytes) {
  return guarded("ferry_launch", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_launch", "rt");
    return launch_body(*rt->calls(), "ferry_launch", stream, operands, operand_count, fn, user_data, flops, mem_bytes);
  });
}


ferry_status ferry_record_use(ferry_runtime rt, uint32_t stream, const ferry_handle* handles, uint32_t count) {
  return guarded("ferry_record_use", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_record_use", "rt");
    FERRY_C_CHECK(handles != nullptr || count == 0, "ferry_record_use", "handles");
    std::vector<ferry::DeviceHandle> hs;
    for (uint32_t i = 0; i < count; ++i) hs.push_back(to_cpp(handles[i]));
    return done(rt->calls()->record_use(stream, hs));
  });
}

ferry_status ferry_stream_wait(ferry_runtime rt, uint32_t stream, uint32_t for_stream) {
  return guarded("ferry_stream_wait", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_stream_wait", "rt");
    for (uint32_t s : {stream, for_stream}) {
      if (s >= ferry::kMaxStreams) return stream_out_of_range("ferry_stream_wait", s);
    }
    return done(rt->calls()->wait(stream, for_stream));
  });
}

ferry_status ferry_hold(ferry_runtime rt, uint32_t stream, int hold) {
  return guarded("ferry_hold", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_hold", "rt");
    if (stream >= ferry::kMaxStreams) return stream_out_of_range("ferry_hold", stream);
    const auto calls = rt->calls();
    return done(hold != 0 ? calls->hold(stream) : calls->release(stream));
  });
}

namespace {

ferry_status synchronize_body(ferry::PoolCalls& calls, ferry::RuntimeDevice& device) {
  if (auto r = calls.synchronize(); !r.ok()) return fail(r.error());
  // A failed launch is a sticky fault of its stream, which a backend wait on the
  // stream's last point reports (the work itself has completed).
  ferry::Backend& b = device.backend();
  for (ferry::StreamId s = 0; s < ferry::kMaxStreams; ++s) {
    const ferry::Ticket last = b.submitted(s);
    if (last == 0) continue;
    if (auto w = b.wait({s, last}, device.order().wait_timeout()); !w.ok()) return fail(w.error());
  }
  return ok();
}

}  // namespace

ferry_status ferry_synchronize(ferry_runtime rt) {
  return guarded("ferry_synchronize", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_synchronize", "rt");
    return synchronize_body(*rt->calls(), rt->runtime->device(0));
  });
}

ferry_status ferry_native_stream(ferry_runtime rt, uint32_t stream, void** out) {
  return guarded("ferry_native_stream", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_native_stream", "rt");
    FERRY_C_CHECK(out != nullptr, "ferry_native_stream", "out");
    auto n = rt->runtime->backend().native_stream(stream);
    if (!n.ok()) return fail(n.error());
    *out = *n;
    return ok();
  });
}

ferry_status ferry_adopt_stream(ferry_runtime rt, void* native, uint32_t* out) {
  return guarded("ferry_adopt_stream", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_adopt_stream", "rt");
    FERRY_C_CHECK(out != nullptr, "ferry_adopt_stream", "out");
    auto s = rt->runtime->adopt_stream(0, native);
    if (!s.ok()) return fail(s.error());
    *out = *s;
    return ok();
  });
}

ferry_status ferry_release_stream(ferry_runtime rt, uint32_t stream, uint64_t timeout_ms) {
  return guarded("ferry_release_stream", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_release_stream", "rt");
    return done(rt->runtime->release_stream(0, stream, ferry::capi::timeout_of(timeout_ms)));
  });
}

ferry_status ferry_cache_define(ferry_runtime rt, uint64_t key, const void* const* pieces, const uint64_t* piece_bytes,
                                uint32_t count) {
  return guarded("ferry_cache_define", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_cache_define", "rt");
    FERRY_C_CHECK(pieces != nullptr || count == 0, "ferry_cache_define", "pieces");
    FERRY_C_CHECK(piece_bytes != nullptr || count == 0, "ferry_cache_define", "piece_bytes");
    ferry::OffloadCache* cache = rt->runtime->cache();
    if (cache == nullptr) {
      return fail(FERRY_ERROR_INVALID_ARGUMENT, "ferry_cache_define: the runtime has no cache (cache_slots is 0)");
    }
    std::vector<std::span<const std::byte>> spans;
    for (uint32_t i = 0; i < count; ++i) {
      if (pieces[i] == nullptr) return null_argument("ferry_cache_define", "a piece");
      spans.emplace_back(static_cast<const std::byte*>(pieces[i]), piece_bytes[i]);
    }
    return done(cache->define(key, std::move(spans)));
  });
}

ferry_status ferry_cache_acquire(ferry_runtime rt, uint64_t key, uint32_t stream, ferry_handle* slot,
                                 uint64_t* offsets, int* hit) {
  return guarded("ferry_cache_acquire", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_cache_acquire", "rt");
    FERRY_C_CHECK(slot != nullptr, "ferry_cache_acquire", "slot");
    ferry::OffloadCache* cache = rt->runtime->cache();
    if (cache == nullptr) {
      return fail(FERRY_ERROR_INVALID_ARGUMENT, "ferry_cache_acquire: the runtime has no cache (cache_slots is 0)");
    }
    auto ref = cache->acquire(key, stream);
    if (!ref.ok()) return fail(ref.error());
    *slot = to_c(ref->slot);
    if (offsets != nullptr) {
      for (std::size_t i = 0; i < ref->pieces.size(); ++i) offsets[i] = ref->pieces[i].offset;
    }
    if (hit != nullptr) *hit = ref->hit ? 1 : 0;
    return ok();
  });
}

ferry_status ferry_cache_release(ferry_runtime rt, uint64_t key) {
  return guarded("ferry_cache_release", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_cache_release", "rt");
    ferry::OffloadCache* cache = rt->runtime->cache();
    if (cache == nullptr) {
      return fail(FERRY_ERROR_INVALID_ARGUMENT, "ferry_cache_release: the runtime has no cache (cache_slots is 0)");
    }
    return done(cache->release(key));
  });
}

ferry_status ferry_trace_start(ferry_runtime rt, const char* path) {
  return guarded("ferry_trace_start", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_trace_start", "rt");
    FERRY_C_CHECK(path != nullptr, "ferry_trace_start", "path");
    {
      std::lock_guard lock(rt->trace_mu);
      if (rt->trace) return fail(FERRY_ERROR_INVALID_ARGUMENT, "ferry_trace_start: already recording");
    }
    // The recorder sits in device 0's slot: other devices' calls, waits across devices and peer copies
    // would be missing from the trace, which would then replay as a different program.
    if (const uint32_t n = rt->runtime->device_count(); n > 1) {
      return fail(ferry::make_error(ferry::ErrorCode::unsupported,
                                    "ferry_trace_start: the runtime drives " + std::to_string(n) +
                                        " devices, and the trace recorder writes device 0's calls only (recording "
                                        "several devices is not done; the trace format and ferry replay have "
                                        "them): record on a one-device runtime"));
    }
    for (uint32_t s = 0; s < ferry::kMaxStreams; ++s) {
      // Its calls recorded so far were not seen: the trace could not capture them again.
      if (rt->runtime->capturing(s)) {
        return fail(ferry::make_error(ferry::ErrorCode::invalid_argument,
                                      "ferry_trace_start: stream " + std::to_string(s) +
                                          " is capturing; a capture begun before recording cannot be written "
                                          "(the calls it recorded so far were not seen, and a replay would "
                                          "run the rest at once): start recording outside a capture"));
      }
    }
    // Opened (without blocking) and its first lines written with no lock held.
    auto recorder = ferry::RecordingPool::to_file(rt->runtime->direct_calls(), path);
    if (!recorder.ok()) return fail(recorder.error());
    auto trace = std::make_shared<ferry_trace_s>();
    trace->recorder = std::move(recorder).value();
    std::lock_guard lock(rt->trace_mu);
    if (rt->trace) return fail(FERRY_ERROR_INVALID_ARGUMENT, "ferry_trace_start: already recording");
    // The slot's pointer shares the trace's ownership: its last holder flushes.
    rt->runtime->set_pool_adaptor(std::shared_ptr<ferry::PoolCalls>(trace, trace->recorder.get()));
    rt->trace = std::move(trace);
    return ok();
  });
}

ferry_status ferry_trace_stop(ferry_runtime rt) {
  return guarded("ferry_trace_stop", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_trace_stop", "rt");
    std::shared_ptr<ferry_trace_s> trace;
    {
      std::lock_guard lock(rt->trace_mu);
      trace = std::move(rt->trace);
      rt->trace = nullptr;
      if (trace) rt->runtime->set_pool_adaptor(nullptr);
    }
    if (!trace) return fail(FERRY_ERROR_INVALID_ARGUMENT, "ferry_trace_stop: not recording");
    // Waits only for the calls that took the recorder before the swap.
    std::future<ferry::Result<void>> flushed = trace->flushed.get_future();
    trace.reset();
    const ferry::Result<void> r = flushed.get();
    if (!r.ok()) return fail(FERRY_ERROR_BACKEND, ("ferry_trace_stop: " + r.error().message).c_str());
    return ok();
  });
}


ferry_status ferry_import_torch_snapshot(const void* bytes, size_t size, int device, const char* out_path,
                                         char* source_json, size_t capacity, size_t* length) {
  return guarded("ferry_import_torch_snapshot", [&] {
    FERRY_C_CHECK(bytes != nullptr || size == 0, "ferry_import_torch_snapshot", "bytes");
    FERRY_C_CHECK(out_path != nullptr, "ferry_import_torch_snapshot", "out_path");
    FERRY_C_CHECK(source_json != nullptr || capacity == 0, "ferry_import_torch_snapshot", "source_json");
    ferry::Result<ferry::TorchSnapshotImport> imported = ferry::import_torch_snapshot(
        std::string_view(static_cast<const char*>(bytes), size), "snapshot",
        device < 0 ? std::nullopt : std::optional<int>(device));
    if (!imported.ok()) return fail(imported.error());
    std::ofstream f(out_path, std::ios::trunc | std::ios::binary);
    f << imported->trace;
    f.flush();
    if (!f) {
      return fail(FERRY_ERROR_BACKEND, ("ferry_import_torch_snapshot: cannot write " + std::string(out_path)).c_str());
    }
    const std::string text = ferry::source_json(imported->source);
    if (length != nullptr) *length = text.size();
    if (capacity > 0) {
      const size_t n = std::min(capacity - 1, text.size());
      std::memcpy(source_json, text.data(), n);
      source_json[n] = '\0';
    }
    return ok();
  });
}

}  // extern "C"

// What the C ABI's other files (capi/boundary.hpp) share of the helpers above.
namespace ferry::capi {
ferry_status guarded(const char* fn, const std::function<ferry_status()>& body) noexcept {
  return ::guarded(fn, body);
}
ferry_status fail(const Error& error) { return ::fail(error); }
ferry_status ok() { return ::ok(); }
ferry_status null_argument(const char* fn, const char* what) { return ::null_argument(fn, what); }
Runtime& runtime_of(ferry_runtime rt) noexcept { return *rt->runtime; }
ferry_status launch_on(PoolCalls& calls, const char* name, uint32_t stream, const ferry_operand* operands,
                       uint32_t operand_count, ferry_launch_fn fn, void* user_data, double flops, uint64_t mem_bytes) {
  return ::launch_body(calls, name, stream, operands, operand_count, fn, user_data, flops, mem_bytes);
}
ferry_status synchronize_on(PoolCalls& calls, RuntimeDevice& device) { return ::synchronize_body(calls, device); }
}  // namespace ferry::capi
