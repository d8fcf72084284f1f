// ferry — the C ABI's figures (ferry.h: the stats getters, the memory summary,
// the race log) over the Runtime's pool, engine, cache and race checker.
#include "ferry/ferry.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "capi/boundary.hpp"
#include "capi/pool_stats_c.hpp"
#include "capi/struct_prefix.hpp"
#include "ferry/graph.hpp"
#include "ferry/integrity.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/race.hpp"
#include "ferry/runtime.hpp"

namespace {

using ferry::ErrorCode;
using ferry::make_error;
using ferry::capi::done;
using ferry::capi::fail;
using ferry::capi::guarded;
using ferry::capi::null_argument;
using ferry::capi::ok;

// The stats getters' bodies, of device `device` (`fn` the entry point): `size` is
// the ..._sized functions' struct_size argument, nullopt for the unsized symbols,
// which read out->struct_size.
ferry_status get_pool_stats(ferry_runtime rt, std::uint32_t device, ferry_pool_stats* out, std::optional<size_t> size,
                            const char* fn = "ferry_get_pool_stats") {
  return guarded(fn, [&] {
    FERRY_C_CHECK(rt != nullptr, fn, "rt");
    FERRY_C_CHECK(out != nullptr, fn, "out");
    auto d = rt->runtime->find_device(device);
    if (!d.ok()) return fail(d.error());
    return done(
        ferry::detail::write_c_pool_stats((*d)->pool().stats(), out, ferry::detail::caller_size(out, size), fn));
  });
}

ferry_status get_integrity_stats(ferry_runtime rt, std::uint32_t device, ferry_integrity_stats* out,
                                 std::optional<size_t> size, const char* fn = "ferry_get_integrity_stats") {
  return guarded(fn, [&] {
    FERRY_C_CHECK(rt != nullptr, fn, "rt");
    FERRY_C_CHECK(out != nullptr, fn, "out");
    auto d = rt->runtime->find_device(device);
    if (!d.ok()) return fail(d.error());
    const ferry::IntegrityCounters c = (*d)->engine().counters();
    const ferry_integrity_stats value{sizeof(ferry_integrity_stats), c.bytes_moved, c.bytes_verified,
                                      c.mismatches, c.retries, c.fallbacks};
    return done(ferry::detail::write_prefix(value, out, ferry::detail::caller_size(out, size),
                                            FERRY_INTEGRITY_STATS_V1_SIZE, fn, "ferry_integrity_stats"));
  });
}

ferry_status get_cache_stats(ferry_runtime rt, ferry_cache_stats* out, std::optional<size_t> size) {
  return guarded("ferry_get_cache_stats", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_get_cache_stats", "rt");
    FERRY_C_CHECK(out != nullptr, "ferry_get_cache_stats", "out");
    ferry::OffloadCache* cache = rt->runtime->cache();
    if (cache == nullptr) {
      return fail(make_error(ErrorCode::invalid_argument, "ferry_get_cache_stats: the runtime has no cache (cache_slots is 0)"));
    }
    const ferry::CacheStats s = cache->stats();
    const ferry_cache_stats value{sizeof(ferry_cache_stats), s.hits, s.misses, s.evictions, s.uploads,
                                  s.bytes_uploaded, s.prefetches};
    return done(ferry::detail::write_prefix(value, out, ferry::detail::caller_size(out, size),
                                            FERRY_CACHE_STATS_V1_SIZE, "ferry_get_cache_stats", "ferry_cache_stats"));
  });
}

}  // namespace

extern "C" {

ferry_status ferry_get_pool_stats_sized(ferry_runtime rt, ferry_pool_stats* out, size_t struct_size) {
  return get_pool_stats(rt, 0, out, struct_size);
}

ferry_status ferry_device_get_pool_stats_sized(ferry_runtime rt, uint32_t device, ferry_pool_stats* out,
                                               size_t struct_size) {
  return get_pool_stats(rt, device, out, struct_size, "ferry_device_get_pool_stats_sized");
}

// The exported symbols behind ferry.h's macros of the same names.
ferry_status(ferry_get_pool_stats)(ferry_runtime rt, ferry_pool_stats* out) {
  return get_pool_stats(rt, 0, out, std::nullopt);
}

ferry_status ferry_get_integrity_stats_sized(ferry_runtime rt, ferry_integrity_stats* out, size_t struct_size) {
  return get_integrity_stats(rt, 0, out, struct_size);
}

ferry_status ferry_device_get_integrity_stats_sized(ferry_runtime rt, uint32_t device, ferry_integrity_stats* out,
                                                    size_t struct_size) {
  return get_integrity_stats(rt, device, out, struct_size, "ferry_device_get_integrity_stats_sized");
}

ferry_status(ferry_get_integrity_stats)(ferry_runtime rt, ferry_integrity_stats* out) {
  return get_integrity_stats(rt, 0, out, std::nullopt);
}

ferry_status ferry_memory_summary(ferry_runtime rt, char* buf, size_t capacity, size_t* length) {
  return guarded("ferry_memory_summary", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_memory_summary", "rt");
    FERRY_C_CHECK(buf != nullptr || capacity == 0, "ferry_memory_summary", "buf");
    const std::string text = ferry::memory_summary(rt->runtime->pool()) + ferry::graph_pools_summary(*rt->runtime);
    if (length != nullptr) *length = text.size();
    if (capacity > 0) {
      const size_t n = std::min(capacity - 1, text.size());
      std::memcpy(buf, text.data(), n);
      buf[n] = '\0';
    }
    return ok();
  });
}

namespace {

// ferry_get_races_sized: each element is the caller's `struct_size` prefix of ferry_race.
ferry_status get_races(ferry_runtime rt, ferry_race* out, uint32_t capacity, std::size_t struct_size,
                       uint32_t* kept, uint64_t* total) {
  return guarded("ferry_get_races", [&] {
    FERRY_C_CHECK(rt != nullptr, "ferry_get_races", "rt");
    FERRY_C_CHECK(out != nullptr || capacity == 0, "ferry_get_races", "out");
    if (ferry::Result<void> size = ferry::detail::check_struct_size<ferry_race>(ferry::detail::size_argument(struct_size),
                                                                        FERRY_RACE_V1_SIZE, "ferry_get_races",
                                                                        "ferry_race");
        !size.ok()) {
      return fail(std::move(size).error());
    }
    const std::size_t written = std::min(struct_size, sizeof(ferry_race));
    std::shared_ptr<const ferry::RaceLog> log = rt->runtime->backend().race_log();
    if (!log) {
      return fail(make_error(ErrorCode::unsupported, "ferry_get_races: the runtime does not check races (race_check is 0)"));
    }
    std::lock_guard lock(rt->tags_mu);
    const auto access = [](ferry::Access a) -> uint32_t {
      return a == ferry::Access::read ? FERRY_READ : a == ferry::Access::write ? FERRY_WRITE : FERRY_READ_WRITE;
    };
    const auto side = [&](const ferry::RaceAccess& a) {
      // kind is a static op name (NUL-terminated); a tag is interned.
      const ferry::DeviceHandle& b = a.block.handle;
      return ferry_race_side{a.op.stream,
                             a.op.ticket,
                             a.kind.data(),
                             rt->tags.insert(a.tag).first->c_str(),
                             access(a.access),
                             ferry_handle{b.pool, b.slot, b.generation},
                             rt->tags.insert(a.block.tag).first->c_str()};
    };
    const std::size_t n = std::min<std::size_t>(capacity, log->kept.size());
    for (std::size_t i = 0; i < n; ++i) {
      const ferry::Race& r = log->kept[i];
      const ferry_race race{side(r.earlier), side(r.later), r.addr, r.bytes, r.reuse ? 1 : 0, r.earlier.device,
                            r.later.device};
      std::memcpy(reinterpret_cast<unsigned char*>(out) + i * struct_size, &race, written);
    }
    if (kept != nullptr) *kept = static_cast<uint32_t>(n);
    if (total != nullptr) *total = log->count;
    return ok();
  });
}

}  // namespace

ferry_status ferry_get_races_sized(ferry_runtime rt, ferry_race* out, uint32_t capacity, size_t struct_size,
                                   uint32_t* kept, uint64_t* total) {
  return get_races(rt, out, capacity, struct_size, kept, total);
}

ferry_status(ferry_get_races)(ferry_runtime rt, ferry_race* out, uint32_t capacity, uint32_t* kept, uint64_t* total) {
  return get_races(rt, out, capacity, FERRY_RACE_V1_SIZE, kept, total);
}

ferry_status ferry_get_cache_stats_sized(ferry_runtime rt, ferry_cache_stats* out, size_t struct_size) {
  return get_cache_stats(rt, out, struct_size);
}

ferry_status(ferry_get_cache_stats)(ferry_runtime rt, ferry_cache_stats* out) {
  return get_cache_stats(rt, out, std::nullopt);
}

}  // extern "C"
