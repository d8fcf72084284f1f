// The C ABI of ferry's own device work (ferry.h, "ferry's own device work"):
// ferry_fill, ferry_compute and ferry_copy_to_host, and their ferry_device_*
// forms, over the PoolCalls of the device they reach (calls_on).
#include <span>
#include <string>
#include <vector>

#include "capi/boundary.hpp"
#include "ferry/stream.hpp"

namespace ferry::capi {
namespace {

// Each call's stream is checked here, before a capture or a recorder looks it up.
ferry_status checked_stream(uint32_t stream, const char* name) {
  if (Result<void> r = check_stream(stream, name); !r.ok()) return fail(r.error());
  return ok();
}

ferry_status fill_on(ferry_runtime rt, uint32_t device, const char* name, uint32_t stream, ferry_handle dst,
                     uint64_t seed) {
  if (rt == nullptr) return null_argument(name, "rt");
  if (ferry_status s = checked_stream(stream, name); s != FERRY_OK) return s;
  Result<DeviceCalls> on = calls_on(rt, device);
  if (!on.ok()) return fail(on.error());
  return done(on->calls->fill(stream, to_cpp(dst), seed));
}

ferry_status compute_on(ferry_runtime rt, uint32_t device, const char* name, uint32_t stream,
                        const ferry_handle* inputs, uint32_t input_count, ferry_handle output, double flops,
                        uint64_t mem_bytes) {
  if (rt == nullptr) return null_argument(name, "rt");
  if (inputs == nullptr && input_count != 0) return null_argument(name, "inputs");
  if (ferry_status s = checked_stream(stream, name); s != FERRY_OK) return s;
  Result<DeviceCalls> on = calls_on(rt, device);
  if (!on.ok()) return fail(on.error());
  std::vector<DeviceHandle> in;
  in.reserve(input_count);
  for (uint32_t i = 0; i < input_count; ++i) in.push_back(to_cpp(inputs[i]));
  return done(on->calls->compute(stream, in, to_cpp(output), flops, mem_bytes));
}

ferry_status copy_to_host_on(ferry_runtime rt, uint32_t device, const char* name, uint32_t stream, ferry_handle src,
                             void* dst, uint64_t bytes) {
  if (rt == nullptr) return null_argument(name, "rt");
  if (dst == nullptr) return null_argument(name, "dst");
  if (ferry_status s = checked_stream(stream, name); s != FERRY_OK) return s;
  Result<DeviceCalls> on = calls_on(rt, device);
  if (!on.ok()) return fail(on.error());
  // Checked now, not when the op is enqueued: a capture enqueues it only at each launch.
  Result<DeviceSpan> block = on->calls->pool().resolve(to_cpp(src));
  if (block.ok() && bytes < block->bytes) {
    return fail(make_error(ErrorCode::invalid_argument, std::string(name) + ": dst holds " + std::to_string(bytes) +
                                                            " bytes, the block " + std::to_string(block->bytes)));
  }
  const std::span<std::byte> out(static_cast<std::byte*>(dst), bytes);
  return done(on->calls->copy_to_host(stream, to_cpp(src), out));
}

}  // namespace
}  // namespace ferry::capi

using ferry::capi::guarded;

ferry_status ferry_fill(ferry_runtime rt, uint32_t stream, ferry_handle dst, uint64_t seed) {
  return guarded("ferry_fill", [&] { return ferry::capi::fill_on(rt, 0, "ferry_fill", stream, dst, seed); });
}

ferry_status ferry_compute(ferry_runtime rt, uint32_t stream, const ferry_handle* inputs, uint32_t input_count,
                           ferry_handle output, double flops, uint64_t mem_bytes) {
  return guarded("ferry_compute", [&] {
    return ferry::capi::compute_on(rt, 0, "ferry_compute", stream, inputs, input_count, output, flops, mem_bytes);
  });
}

ferry_status ferry_copy_to_host(ferry_runtime rt, uint32_t stream, ferry_handle src, void* dst, uint64_t bytes) {
  return guarded("ferry_copy_to_host", [&] {
    return ferry::capi::copy_to_host_on(rt, 0, "ferry_copy_to_host", stream, src, dst, bytes);
  });
}

ferry_status ferry_device_fill(ferry_runtime rt, uint32_t device, uint32_t stream, ferry_handle dst, uint64_t seed) {
  return guarded("ferry_device_fill", [&] {
    return ferry::capi::fill_on(rt, device, "ferry_device_fill", stream, dst, seed);
  });
}

ferry_status ferry_device_compute(ferry_runtime rt, uint32_t device, uint32_t stream, const ferry_handle* inputs,
                                  uint32_t input_count, ferry_handle output, double flops, uint64_t mem_bytes) {
  return guarded("ferry_device_compute", [&] {
    return ferry::capi::compute_on(rt, device, "ferry_device_compute", stream, inputs, input_count, output, flops,
                                   mem_bytes);
  });
}

ferry_status ferry_device_copy_to_host(ferry_runtime rt, uint32_t device, uint32_t stream, ferry_handle src,
                                       void* dst, uint64_t bytes) {
  return guarded("ferry_device_copy_to_host", [&] {
    return ferry::capi::copy_to_host_on(rt, device, "ferry_device_copy_to_host", stream, src, dst, bytes);
  });
}
