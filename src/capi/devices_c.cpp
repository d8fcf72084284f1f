// The C ABI of several devices (ferry.h, "Several devices"): device selection for
// handles and streams, and ferry_copy_peer.
#include <memory>
#include <span>
#include <vector>

#include "capi/boundary.hpp"
#include "core/text.hpp"

namespace ferry::capi {
namespace {

// The device whose pool resolves `h`, or stale_handle naming how many were asked.
Result<RuntimeDevice*> owner_of(Runtime& rt, ferry_handle h) {
  for (std::uint32_t i = 0; i < rt.device_count(); ++i) {
    if (rt.device(i).pool().resolve(to_cpp(h)).ok()) return &rt.device(i);
  }
  return make_error(ErrorCode::stale_handle, "handle " + text::handle(to_cpp(h)) + " is live in no pool of this runtime's " +
                                                 std::to_string(rt.device_count()) + " device(s)");
}

}  // namespace

Result<DeviceCalls> calls_on(ferry_runtime rt, std::uint32_t device) {
  Result<RuntimeDevice*> d = rt->runtime->find_device(device);
  if (!d.ok()) return std::move(d).error();
  if (device == 0) return DeviceCalls{rt->calls(), *d};
  return DeviceCalls{std::make_shared<DirectPoolCalls>((*d)->pool(), (*d)->engine()), *d};
}

}  // namespace ferry::capi

using namespace ferry::capi;

ferry_status ferry_device_count(ferry_runtime rt, uint32_t* out) {
  return guarded("ferry_device_count", [&] {
    if (rt == nullptr) return null_argument("ferry_device_count", "rt");
    if (out == nullptr) return null_argument("ferry_device_count", "out");
    *out = runtime_of(rt).device_count();
    return ok();
  });
}

ferry_status ferry_device_link(ferry_runtime rt, uint32_t a, uint32_t b, const char** out) {
  return guarded("ferry_device_link", [&] {
    if (rt == nullptr) return null_argument("ferry_device_link", "rt");
    if (out == nullptr) return null_argument("ferry_device_link", "out");
    ferry::Runtime& r = runtime_of(rt);
    for (const std::uint32_t d : {a, b}) {
      if (auto found = r.find_device(d); !found.ok()) return fail(found.error());
    }
    // to_string's names are string literals: static, NUL-terminated.
    *out = ferry::to_string(r.link_between(a, b)).data();
    return ok();
  });
}

ferry_status ferry_device_of(ferry_runtime rt, ferry_handle h, uint32_t* out) {
  return guarded("ferry_device_of", [&] {
    if (rt == nullptr) return null_argument("ferry_device_of", "rt");
    if (out == nullptr) return null_argument("ferry_device_of", "out");
    auto d = owner_of(runtime_of(rt), h);
    if (!d.ok()) return fail(d.error());
    *out = (*d)->index();
    return ok();
  });
}

ferry_status ferry_device_block(ferry_runtime rt, ferry_handle h, uint32_t* device, uint64_t* addr, uint64_t* bytes) {
  return guarded("ferry_device_block", [&] {
    if (rt == nullptr) return null_argument("ferry_device_block", "rt");
    auto d = owner_of(runtime_of(rt), h);
    if (!d.ok()) return fail(d.error());
    auto span = (*d)->pool().resolve(to_cpp(h));
    if (!span.ok()) return fail(span.error());
    if (device != nullptr) *device = (*d)->index();
    if (addr != nullptr) *addr = span->addr;
    if (bytes != nullptr) *bytes = span->bytes;
    return ok();
  });
}

ferry_status ferry_device_alloc(ferry_runtime rt, uint32_t device, uint64_t bytes, uint32_t stream, ferry_handle* out) {
  return guarded("ferry_device_alloc", [&] {
    if (rt == nullptr) return null_argument("ferry_device_alloc", "rt");
    if (out == nullptr) return null_argument("ferry_device_alloc", "out");
    auto d = runtime_of(rt).find_device(device);
    if (!d.ok()) return fail(d.error());
    // Device 0's calls go through calls(), as ferry_alloc's: a capture and a trace see them.
    auto h = device == 0 ? rt->calls()->allocate(bytes, stream) : (*d)->pool().allocate(bytes, stream);
    if (!h.ok()) return fail(h.error());
    *out = ferry_handle{h->pool, h->slot, h->generation};
    return ok();
  });
}

ferry_status ferry_device_free(ferry_runtime rt, ferry_handle h) {
  return guarded("ferry_device_free", [&] {
    if (rt == nullptr) return null_argument("ferry_device_free", "rt");
    auto d = owner_of(runtime_of(rt), h);
    if (!d.ok()) return fail(d.error());
    if ((*d)->index() == 0) return done(rt->calls()->free(to_cpp(h)));
    return done((*d)->pool().free(to_cpp(h)));
  });
}

ferry_status ferry_device_upload(ferry_runtime rt, uint32_t stream, ferry_handle dst, uint64_t dst_offset,
                                 const void* src, uint64_t bytes) {
  return guarded("ferry_device_upload", [&] {
    if (rt == nullptr) return null_argument("ferry_device_upload", "rt");
    if (src == nullptr) return null_argument("ferry_device_upload", "src");
    auto d = owner_of(runtime_of(rt), dst);
    if (!d.ok()) return fail(d.error());
    ferry::TransferPlan plan;
    plan.add(static_cast<const std::byte*>(src), to_cpp(dst), dst_offset, bytes);
    if ((*d)->index() == 0) return done(rt->calls()->upload(stream, plan));
    return done((*d)->engine().upload(stream, plan));
  });
}

ferry_status ferry_device_download(ferry_runtime rt, uint32_t stream, ferry_handle src, uint64_t src_offset, void* dst,
                                   uint64_t bytes) {
  return guarded("ferry_device_download", [&] {
    if (rt == nullptr) return null_argument("ferry_device_download", "rt");
    if (dst == nullptr) return null_argument("ferry_device_download", "dst");
    auto d = owner_of(runtime_of(rt), src);
    if (!d.ok()) return fail(d.error());
    const std::span<std::byte> out(static_cast<std::byte*>(dst), bytes);
    if ((*d)->index() == 0) return done(rt->calls()->download(stream, to_cpp(src), src_offset, out));
    return done((*d)->engine().download(stream, to_cpp(src), src_offset, out));
  });
}

ferry_status ferry_copy_peer(ferry_runtime rt, ferry_handle dst, uint64_t dst_offset, ferry_handle src,
                             uint64_t src_offset, uint64_t bytes, uint32_t stream, int* verified) {
  return guarded("ferry_copy_peer", [&] {
    if (rt == nullptr) return null_argument("ferry_copy_peer", "rt");
    auto r = runtime_of(rt).copy_peer(to_cpp(dst), dst_offset, to_cpp(src), src_offset, bytes, stream);
    if (!r.ok()) return fail(r.error());
    if (verified != nullptr) *verified = r->verified ? 1 : 0;
    return ok();
  });
}

ferry_status ferry_device_stream_wait(ferry_runtime rt, uint32_t device, uint32_t stream, uint32_t for_device,
                                      uint32_t for_stream) {
  return guarded("ferry_device_stream_wait", [&] {
    if (rt == nullptr) return null_argument("ferry_device_stream_wait", "rt");
    ferry::Runtime& r = runtime_of(rt);
    auto from = r.find_device(for_device);
    if (!from.ok()) return fail(from.error());
    // Checked before submitted() indexes by it.
    if (auto bad = ferry::check_stream(for_stream, "ferry_device_stream_wait"); !bad.ok()) return fail(bad.error());
    const ferry::StreamPoint tail{for_stream, (*from)->backend().submitted(for_stream)};
    auto t = r.order_after(device, stream, for_device, tail);
    return t.ok() ? ok() : fail(t.error());
  });
}

ferry_status ferry_device_launch(ferry_runtime rt, uint32_t device, uint32_t stream, const ferry_operand* operands,
                                 uint32_t operand_count, ferry_launch_fn fn, void* user_data, double flops,
                                 uint64_t mem_bytes) {
  return guarded("ferry_device_launch", [&] {
    if (rt == nullptr) return null_argument("ferry_device_launch", "rt");
    auto on = calls_on(rt, device);
    if (!on.ok()) return fail(on.error());
    return launch_on(*on->calls, "ferry_device_launch", stream, operands, operand_count, fn, user_data, flops,
                     mem_bytes);
  });
}

ferry_status ferry_device_record_use(ferry_runtime rt, uint32_t device, uint32_t stream, const ferry_handle* handles,
                                     uint32_t count) {
  return guarded("ferry_device_record_use", [&] {
    if (rt == nullptr) return null_argument("ferry_device_record_use", "rt");
    if (handles == nullptr && count != 0) return null_argument("ferry_device_record_use", "handles");
    auto on = calls_on(rt, device);
    if (!on.ok()) return fail(on.error());
    std::vector<ferry::DeviceHandle> hs;
    for (uint32_t i = 0; i < count; ++i) hs.push_back(to_cpp(handles[i]));
    return done(on->calls->record_use(stream, hs));
  });
}

ferry_status ferry_device_hold(ferry_runtime rt, uint32_t device, uint32_t stream, int hold) {
  return guarded("ferry_device_hold", [&] {
    if (rt == nullptr) return null_argument("ferry_device_hold", "rt");
    auto on = calls_on(rt, device);
    if (!on.ok()) return fail(on.error());
    return done(hold != 0 ? on->calls->hold(stream) : on->calls->release(stream));
  });
}

ferry_status ferry_device_synchronize(ferry_runtime rt, uint32_t device) {
  return guarded("ferry_device_synchronize", [&] {
    if (rt == nullptr) return null_argument("ferry_device_synchronize", "rt");
    auto on = calls_on(rt, device);
    if (!on.ok()) return fail(on.error());
    return synchronize_on(*on->calls, *on->device);
  });
}

ferry_status ferry_device_native_stream(ferry_runtime rt, uint32_t device, uint32_t stream, void** out) {
  return guarded("ferry_device_native_stream", [&] {
    if (rt == nullptr) return null_argument("ferry_device_native_stream", "rt");
    if (out == nullptr) return null_argument("ferry_device_native_stream", "out");
    auto d = runtime_of(rt).find_device(device);
    if (!d.ok()) return fail(d.error());
    auto n = (*d)->backend().native_stream(stream);
    if (!n.ok()) return fail(n.error());
    *out = *n;
    return ok();
  });
}

ferry_status ferry_device_adopt_stream(ferry_runtime rt, uint32_t device, void* native, uint32_t* out) {
  return guarded("ferry_device_adopt_stream", [&] {
    if (rt == nullptr) return null_argument("ferry_device_adopt_stream", "rt");
    if (out == nullptr) return null_argument("ferry_device_adopt_stream", "out");
    auto s = runtime_of(rt).adopt_stream(device, native);
    if (!s.ok()) return fail(s.error());
    *out = *s;
    return ok();
  });
}

ferry_status ferry_device_release_stream(ferry_runtime rt, uint32_t device, uint32_t stream, uint64_t timeout_ms) {
  return guarded("ferry_device_release_stream", [&] {
    if (rt == nullptr) return null_argument("ferry_device_release_stream", "rt");
    return done(runtime_of(rt).release_stream(device, stream, timeout_of(timeout_ms)));
  });
}
