// The pool's figures as the C ABI's ferry_pool_stats (ferry_get_pool_stats,
// ferry_torch_get_stats).
#pragma once

#include "capi/struct_prefix.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/ferry.h"

namespace ferry::detail {

inline ferry_pool_stats to_c_pool_stats(const PoolStats& s) {
  return ferry_pool_stats{sizeof(ferry_pool_stats), s.allocated_bytes, s.peak_allocated_bytes, s.reserved_bytes,
                          s.peak_reserved_bytes, s.pending_free_bytes, s.allocs, s.frees, s.ooms, s.reclaims,
                          s.internal_allocs, s.internal_frees};
}

// `s` into the caller's *out, as much of it as `size` says the caller has.
inline Result<void> write_c_pool_stats(const PoolStats& s, ferry_pool_stats* out, const CallerSize& size,
                                       const char* fn) {
  return write_prefix(to_c_pool_stats(s), out, size, FERRY_POOL_STATS_V1_SIZE, fn, "ferry_pool_stats");
}

}  // namespace ferry::detail
