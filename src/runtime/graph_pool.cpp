// GraphCapture: the private pools (graph.hpp). A block allocated on a capturing
// stream is its pool's; the program's free of it is deferred and its memory is
// reused by later allocations of the pool's captures only: the same size whole
// (DevicePool::reissue), else a part cut from the best fitting free range of the
// blocks the program freed (DevicePool::sub_block). The recorded ops follow a
// block or a part through every handle it has had (GraphPoolState::now).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/align.hpp"
#include "runtime/graph_capture.hpp"

namespace ferry::detail {
namespace {

// As DevicePool rounds a block: a size past 2^64 - 1 rounded fits nowhere.
std::uint64_t rounded(std::uint64_t bytes) {
  return detail::checked_align_up(bytes, kBlockAlign).value_or(UINT64_MAX);
}

// A free range [offset, offset + bytes) of one block.
struct FreeRange {
  std::size_t block = 0;
  std::uint64_t offset = 0, bytes = 0;
};

// The smallest free range of a block not held whole that takes `need` bytes;
// ties go to the earliest block and offset.
std::optional<FreeRange> best_fit(const GraphPoolState& pool, std::uint64_t need) {
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> held(pool.blocks.size());
  for (const GraphPoolState::Part& p : pool.parts) {
    if (p.held) held[p.block].emplace_back(p.offset, p.offset + rounded(p.bytes));
  }
  std::optional<FreeRange> best;
  auto consider = [&](std::size_t i, std::uint64_t from, std::uint64_t to) {
    if (to > from && to - from >= need && (!best || to - from < best->bytes)) best = FreeRange{i, from, to - from};
  };
  for (std::size_t i = 0; i < pool.blocks.size(); ++i) {
    const GraphPoolState::Block& b = pool.blocks[i];
    if (!b.kept || b.held) continue;
    std::sort(held[i].begin(), held[i].end());
    std::uint64_t at = 0;
    for (const auto& [from, to] : held[i]) {
      consider(i, at, from);
      at = to;
    }
    consider(i, at, rounded(b.bytes));
  }
  return best;
}

}  // namespace

DeviceHandle GraphPoolState::now(DeviceHandle h) const {
  if (auto it = alias.find(key_of(h)); it != alias.end()) return blocks[it->second].current;
  if (auto it = part_alias.find(key_of(h)); it != part_alias.end()) return parts[it->second].current;
  return h;
}

DeviceHandle GraphPoolState::whole(DeviceHandle h) const {
  if (auto it = part_alias.find(key_of(h)); it != part_alias.end()) return blocks[parts[it->second].block].current;
  return now(h);
}

Result<void> GraphCapture::release(GraphState& state) {
  std::vector<DeviceHandle> to_free;
  {
    std::lock_guard lock(mu_);
    GraphPoolState& pool = *state.pool;
    if (--pool.users == 0) {
      for (std::size_t i = 0; i < pool.blocks.size(); ++i) {
        GraphPoolState::Block& b = pool.blocks[i];
        if (!b.kept) continue;
        if (b.held) owners_.erase(key_of(b.current));
        else if (pool.holds_part(i)) continue;  // it goes with the last of its parts the program frees
        else to_free.push_back(b.current);
        b.kept = false;
      }
      pool.forget_if_empty();
    }
  }
  Result<void> first;
  for (DeviceHandle h : to_free) {
    Result<void> r = direct_.free(h);
    if (!r.ok() && first.ok()) first = std::move(r);
  }
  return first;
}

GraphPoolStats GraphCapture::pool_stats(const GraphPoolState& pool) const {
  GraphPoolStats s;
  std::lock_guard lock(mu_);
  s.graphs = pool.users;
  for (const GraphPoolState::Block& b : pool.blocks) {
    if (!b.kept) continue;
    ++s.blocks;
    s.reserved_bytes += b.bytes;
    if (b.held) s.allocated_bytes += b.bytes;
  }
  for (const GraphPoolState::Part& p : pool.parts) {
    if (p.held && pool.blocks[p.block].kept) s.allocated_bytes += p.bytes;
  }
  return s;
}

std::vector<GraphPoolStats> GraphCapture::all_pools() const {
  std::vector<std::shared_ptr<GraphPoolState>> live;
  {
    std::lock_guard lock(mu_);
    for (const std::weak_ptr<GraphPoolState>& p : pools_) {
      std::shared_ptr<GraphPoolState> pool = p.lock();
      if (pool && (pool->users > 0 || pool->keeps_any())) live.push_back(std::move(pool));
    }
  }
  std::vector<GraphPoolStats> out;
  for (const auto& pool : live) out.push_back(pool_stats(*pool));
  return out;
}

std::vector<DeviceHandle> GraphCapture::current_blocks(const GraphState& state) const {
  std::vector<DeviceHandle> now = state.blocks;
  std::lock_guard lock(mu_);
  for (DeviceHandle& h : now) h = state.pool->now(h);
  return now;
}

std::vector<DeviceHandle> GraphCapture::native_operands(const GraphState& state,
                                                        const std::vector<DeviceHandle>& now) const {
  std::vector<DeviceHandle> out;
  std::lock_guard lock(mu_);
  for (std::size_t k = 0; k < state.blocks.size(); ++k) {
    const bool pools = state.pool->part_alias.count(key_of(state.blocks[k])) != 0;
    const DeviceHandle h = pools ? state.pool->whole(state.blocks[k]) : now[k];
    if (std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  }
  return out;
}

void GraphCapture::recut_parts(GraphPoolState& pool, std::size_t i) {
  for (std::size_t k = 0; k < pool.parts.size(); ++k) {
    GraphPoolState::Part& p = pool.parts[k];
    if (p.block != i) continue;
    // Only a block none of whose parts the program holds is reissued, so each is the pool's.
    if (Result<DeviceHandle> h = rt_.pool().sub_block(pool.blocks[i].current, p.offset, p.bytes); h.ok()) {
      p.current = *h;
      pool.part_alias[key_of(*h)] = k;
    }
  }
}

std::optional<DeviceHandle> GraphCapture::reuse(const std::shared_ptr<GraphPoolState>& shared, std::uint64_t bytes) {
  GraphPoolState& pool = *shared;
  for (std::size_t i = 0; i < pool.blocks.size(); ++i) {
    GraphPoolState::Block& b = pool.blocks[i];
    // The same size whole: the ops recorded over the block's old handles keep their ranges.
    if (!b.kept || b.held || b.bytes != bytes || pool.holds_part(i)) continue;
    Result<DeviceHandle> again = rt_.pool().reissue(b.current, bytes);
    if (!again.ok()) continue;  // its slot at its last generation: another block, or a part
    b.current = *again;
    b.held = true;
    pool.alias[key_of(*again)] = i;
    owners_[key_of(*again)] = shared;
    recut_parts(pool, i);
    return again.value();
  }
  const std::optional<FreeRange> fit = best_fit(pool, rounded(bytes));
  if (!fit) return std::nullopt;
  DeviceHandle h;
  auto same = std::find_if(pool.parts.begin(), pool.parts.end(), [&](const GraphPoolState::Part& p) {
    return !p.held && p.block == fit->block && p.offset == fit->offset && p.bytes == bytes;
  });
  if (same != pool.parts.end()) {
    // A part of this range the program freed before: its handle now is the pool's alone.
    same->held = true;
    h = same->current;
  } else {
    Result<DeviceHandle> cut = rt_.pool().sub_block(pool.blocks[fit->block].current, fit->offset, bytes);
    if (!cut.ok()) return std::nullopt;
    h = *cut;
    pool.part_alias[key_of(h)] = pool.parts.size();
    pool.parts.push_back({fit->block, fit->offset, bytes, h, true});
  }
  owners_[key_of(h)] = shared;
  return h;
}

Result<DeviceHandle> GraphCapture::allocate(std::uint64_t bytes, StreamId stream, std::string_view tag) {
  std::shared_ptr<GraphState> state = open_on(stream);
  if (!state) return direct_.allocate(bytes, stream, tag);
  {
    std::lock_guard lock(mu_);
    if (bytes != 0) {
      if (std::optional<DeviceHandle> h = reuse(state->pool, bytes)) {
        // The memory changes hands here as at a pool reuse: its earlier users come
        // before the replays (leases, and so last_uses, are the whole block's).
        if (Result<UseSet> uses = rt_.pool().last_uses(state->pool->whole(*h)); uses.ok()) {
          state->inherited.merge(*uses);
        }
        return *h;
      }
    }
  }
  // The pool rounds to 256; a request that does not fit now runs the reclaim
  // ladder, whose last rung waits for in-flight frees: a host wait.
  const std::uint64_t fits = rt_.pool().largest_free_extent();
  if (bytes != 0 && rounded(bytes) > fits) {
    return spoil(*state, refused("allocate(" + std::to_string(bytes) + " bytes)", stream,
                                 "it does not fit now (largest free extent " + std::to_string(fits) +
                                     " bytes) and the reclaim ladder would wait for in-flight frees"));
  }
  Result<DeviceHandle> h = direct_.allocate(bytes, stream, tag);
  if (!h.ok()) return h;
  std::lock_guard lock(mu_);
  GraphPoolState& pool = *state->pool;
  pool.alias[key_of(*h)] = pool.blocks.size();
  pool.blocks.push_back({*h, bytes, true, true});
  owners_[key_of(*h)] = state->pool;
  return h;
}

std::optional<DeviceHandle> GraphCapture::defer_free(GraphPoolState& pool, DeviceHandle handle) {
  DevicePool& dp = rt_.pool();
  if (auto a = pool.alias.find(key_of(handle)); a != pool.alias.end()) {
    const std::size_t i = a->second;
    GraphPoolState::Block& b = pool.blocks[i];
    // I1: the program's handle goes stale now, as at any free; the pool keeps
    // the block under a handle only it knows (at a slot's last generation it
    // keeps the old one).
    if (Result<DeviceHandle> again = dp.reissue(handle, b.bytes); again.ok()) {
      b.current = *again;
      pool.alias[key_of(*again)] = i;
      recut_parts(pool, i);
    }
    b.held = false;
    return std::nullopt;
  }
  const std::size_t k = pool.part_alias.at(key_of(handle));
  GraphPoolState::Part& p = pool.parts[k];
  p.held = false;
  GraphPoolState::Block& b = pool.blocks[p.block];
  // I1 as for a block: the program's handle goes stale, the pool keeps the range.
  Result<DeviceHandle> again = dp.reissue(handle, p.bytes);
  if (!again.ok()) {  // its slot at its last generation: a new cut of the same range
    (void)dp.free(handle);
    again = dp.sub_block(b.current, p.offset, p.bytes);
  }
  if (again.ok()) {
    p.current = *again;
    pool.part_alias[key_of(*again)] = k;
  }
  if (pool.users > 0 || pool.holds_part(p.block)) return std::nullopt;
  // Its pool's graphs are gone and this was the block's last part the program held.
  b.kept = false;
  const DeviceHandle gone = b.current;
  pool.forget_if_empty();
  return gone;
}

Result<void> GraphCapture::free(DeviceHandle handle) {
  std::optional<DeviceHandle> to_free = handle;
  {
    std::lock_guard lock(mu_);
    if (auto it = owners_.find(key_of(handle)); it != owners_.end()) {
      // Graphs' ops were recorded with this memory's address: it stays the pool's,
      // reused by none but its captures, until its last graph goes.
      std::shared_ptr<GraphPoolState> pool = std::move(it->second);
      owners_.erase(it);
      to_free = defer_free(*pool, handle);
    }
  }
  if (to_free) return direct_.free(*to_free);
  return {};
}

}  // namespace ferry::detail
