// DevicePool::Impl (internal): the pool's state and its hot path (allocate and
// free), which stays in one place so the churn loop inlines it. Its parts live in
// files of their own, each named after its job:
//   placement_core.hpp  where a block goes in one range: the offset allocator, live
//                       references per granule, the granule-aware scan (pure)
//   granule_map.hpp     per granule of a range: pending references, mapped, cached,
//                       busy; which granules to map and unmap (pure)
//   pending_blocks.hpp  freed blocks whose leases are open, per-stream retirement
//                       (pure; the host arena's pending blocks too)
//   mapping.cpp         the driver calls the granule map decides, outside the lock
//   leases.cpp          filing freed blocks, the leases a new block inherits (I2, I3)
//   placement.cpp       the scan over both regions, off the hot path
//   reclaim.cpp         the numbered reclaim ladder, and trim
//   pool_stats.cpp      statistics, snapshots, the OOM diagnostic and validate()
//   sub_blocks.cpp      handles over part of a live block (a graph's private pool)
//   device_pool.cpp     construction, the public operations, handles
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/device_pool.hpp"
#include "pool/futex_mutex.hpp"
#include "pool/granule_map.hpp"
#include "pool/pending_blocks.hpp"
#include "pool/placement_core.hpp"

namespace ferry {

struct DevicePool::Impl {
  static constexpr std::uint64_t kAlign = detail::PlacementCore::kAlign;  // every block starts and ends on this
  static constexpr std::uint32_t kNoBlock = UINT32_MAX;
  static std::string bytes_str(std::uint64_t b) { return text::human_bytes(b, 2); }

  // A block's index is its handle's slot: one record holds the slot's generation
  // and the block, so a free touches one cache line for both. A record is spare
  // (no block; its generation not handed out yet), live (its handle resolves),
  // pending (freed, leases open: no handle resolves to it), or retired.
  // A live block owns its allocator node. A pending block is a freed range whose
  // leases have not retired: its address range is free space already (node kNone),
  // and the block only keeps its granules mapped and names the work a later
  // block placed over it must be ordered after. A sub record names part of a
  // live block (sub_blocks.cpp): no memory, no node, no leases of its own (its
  // leases and stream order are its parent's).
  enum class BlockState : std::uint8_t { spare, live, pending, retired, sub };

  // What every allocate and free touches, in half a cache line; what only leased
  // blocks need lives in `leases` beside it (the churn loop touches no lease).
  // A live block's size is its allocator node's (size_of), so it is not kept twice.
  struct alignas(32) Block {
    std::uint64_t addr = 0;
    std::uint64_t requested = 0;  // as asked (live blocks)
    std::uint32_t node = detail::OffsetAllocator::kNone;
    std::uint32_t generation = 1;       // never 0, so {pool,slot,0} never resolves
    std::uint32_t pending_id = kNoBlock;  // its entry in `pending`, while pending
    std::uint8_t region = 0;
    BlockState state = BlockState::spare;
    std::uint8_t stream = 0;
    bool leased : 1 = false;        // leases[b].uses may be non-empty  (!leased => uses empty)
    bool ready_set : 1 = false;     // leases[b].ready_after is set  (!ready_set => it is {})
    bool slot_retired : 1 = false;  // freed at kLastGeneration: the slot retires with the block
    bool internal : 1 = false;      // live: ferry's own buffer (allocate_internal)
    bool has_subs : 1 = false;      // live: sub records name parts of it  (has_subs <=> subs_of has it)
  };
  static_assert(sizeof(Block) == 32);
  static_assert(kMaxStreams <= 256, "Block::stream is one byte");

  struct Leases {
    UseSet uses;              // leases of enqueued work on this block (I2)
    // Set when the block was reused on its stream while older work there still
    // touches it: other streams must wait for this point before using it (I3).
    StreamPoint ready_after{};
    std::uint64_t pending_size = 0;  // a pending block's size (it has no allocator node)
    std::uint32_t parent = kNoBlock;  // a sub record's live block  (state sub <=> parent set)
  };

  // I1: a slot whose generation reached this is retired at its free, never reused,
  // so a generation never comes round again.
  static constexpr std::uint32_t kLastGeneration = UINT32_MAX;

  // One reserved address range, carved by its placement core; physical granules
  // are mapped under it on demand. The core counts the live blocks touching each
  // granule, the granule map the pending ones and what is mapped (granule_map.hpp);
  // both cover the granules used so far (a prefix of the range) and grow with it.
  //   granule g is in use  <=>  place.ref_at(g) > 0  or  map.pending_ref(g) > 0
  //   granule g is mapped  <=>  it is in use  or  it is cached
  //   a busy granule (a driver call on it outside the lock) is counted neither
  //   reserved nor cached while it is being unmapped; nobody places over it
  //   pending blocks are disjoint, lie in free space, and are all in pending_at
  struct Region {
    detail::PlacementCore place;  // its free space, and the live blocks touching each granule
    detail::GranuleMap map;       // pending references (I2: stays mapped), mapped, cached, busy
    std::map<std::uint64_t, std::uint32_t> pending_at;  // pending blocks by address
    Region(std::uint64_t b, std::uint64_t n, unsigned granule_shift) : place(b, n, granule_shift) {}
    bool in_use(std::uint64_t g) const { return map.in_use(place, g); }
  };

  // A granule to unmap, decided under the lock, run outside it (without_lock).
  struct Unmap {
    std::uint8_t region = 0;
    std::uint32_t granule = 0;
    bool ok = false;  // the driver call succeeded
  };
  // A placement whose granules are being mapped: its references are taken and its
  // allocator node is held, but no block owns it yet (validate counts it).
  struct Mapping {
    std::uint8_t region = 0;
    std::uint64_t addr = 0, size = 0;
  };

  StreamOrder& order;
  Backend& backend;
  PoolOptions options;
  std::uint32_t id;
  std::uint64_t granule;
  unsigned granule_shift = 0;
  std::uint64_t capacity;
  Result<void> status;
  // Only a race checker reads note_block (backend.hpp), and a backend checks races
  // from its construction on or never: a pool asks once.
  bool note_blocks;

  // Guards everything below; never held across a wait or a driver call (map and
  // unmap run in without_lock, on granules the map marks busy meanwhile).
  mutable detail::FutexMutex mu;
  std::vector<Region> regions;  // [0] small, [1] large (one region without VMM)
  std::vector<Block> blocks;  // I1: indexed by slot; a slot index never moves or gets renumbered
  std::vector<Leases> leases;  // parallel to blocks
  std::vector<std::uint32_t> spare;  // the spare records
  // Freed blocks whose leases have not retired (their ranges are free space
  // already), by record index; retiring them looks only at the ones that completed.
  detail::PendingBlocks<std::uint32_t> pending;
  std::uint64_t retired_slots = 0;  // records in state retired
  // The sub records of each live block that has any, as made (sub_blocks.cpp).
  std::map<std::uint32_t, std::vector<std::uint32_t>> subs_of;
  PoolStats st;
  // Unmaps decided and not started. Empty whenever the lock is free: whoever
  // queues runs them before releasing it (without_lock, settle), so a busy granule
  // another caller finds always has a driver call running for it.
  std::vector<Unmap> queued;
  std::vector<Mapping> mapping;        // placements whose maps run now
  // Bumped at every commit of driver calls; callers that found a busy granule
  // sleep on it without the lock (await_driver).
  std::atomic<std::uint32_t> driver_epoch{0};
  std::atomic<std::uint32_t> driver_waiters{0};  // written under mu; atomic so tests read it without mu

  Impl(StreamOrder& o, PoolOptions opt);

  ~Impl();

  void note_peaks() {
    st.active_bytes = st.allocated_bytes + st.pending_free_bytes;
    st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
    st.peak_requested_bytes = std::max(st.peak_requested_bytes, st.requested_bytes);
    st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
    st.peak_active_bytes = std::max(st.peak_active_bytes, st.active_bytes);
  }

  // Mapped granules some block touches:  referenced == reserved - cached <= capacity.
  std::uint64_t referenced_bytes() const { return st.reserved_bytes - st.cached_bytes; }

  static bool has_block(const Block& blk) {
    return blk.state == BlockState::live || blk.state == BlockState::pending;
  }
  // A live block's size.
  std::uint64_t size_of(const Block& blk) const {
    return regions[blk.region].place.bytes_of(blk.node);
  }
  // Any block's size, live or pending.
  std::uint64_t block_size(std::uint32_t b) const {
    return blocks[b].state == BlockState::pending ? leases[b].pending_size : size_of(blocks[b]);
  }

  // --- granules -------------------------------------------------------------

  void cover(Region& r, std::uint64_t last);

  // What reference_granules did: the granules are referenced; a busy granule of
  // another caller is in the way (wait for its driver call, then fit again); or
  // the capacity has no room, or a map failed (nothing changed either way).
  enum class Referenced : std::uint8_t { yes, busy, no_room };

  // Granules with a driver call under way, and the bytes of those being
  // unmapped (still on the device until the call returns).
  std::uint64_t busy_granules() const {
    std::uint64_t n = 0;
    for (const Region& r : regions) n += r.map.busy_count();
    return n;
  }
  std::uint64_t unmapping_bytes() const {
    std::uint64_t n = 0;
    for (const Region& r : regions) n += r.map.unmapping_count();
    return n * granule;
  }

  Referenced reference_granules(Region& r, std::uint64_t addr, std::uint64_t size, std::uint64_t fresh);

  // A driver call's success; a throw (the sim's bookkeeping out of memory) is a failure.
  template <class Call>
  static bool driver_ok(Call&& call) noexcept {
    try {
      return call().ok();
    } catch (...) {
      return false;
    }
  }

  bool evict_cached(std::uint64_t bytes, const Region& keep, std::uint64_t keep_first,
                    std::uint64_t keep_last);

  // Drops the references of a block (live ones in the core, pending ones in the
  // map); granules nobody touches become cached, and cached memory
  // beyond the release threshold is queued for unmapping. Only called for blocks
  // whose leases have all retired, so unmapping here never races queued work (I2).
  // `pending` is a template argument so a live block's free tests only the other count.
  template <bool pending>
  [[gnu::always_inline]] void release_granules(Region& r, std::uint64_t addr, std::uint64_t size) {
    auto [first, last] = r.place.granule_span(addr, size);
    for (std::uint64_t g = first; g <= last; ++g) {
      const bool unused = pending ? r.map.drop_pending(g) == 0 && r.place.ref_at(g) == 0
                                  : r.place.drop_ref(g) == 0 && r.map.pending_ref(g) == 0;
      if (unused) {
        st.cached_bytes += granule;
        r.map.list_cached(g);
      }
    }
    if (st.cached_bytes > options.release_threshold) {
      for (std::uint64_t g = first; g <= last && st.cached_bytes > options.release_threshold; ++g) {
        if (r.map.cached(r.place, g)) {
          r.map.begin_unmap(g);
          queued_unmap(r, g);
        }
      }
    }
  }

  // Cached granule g of r went to the driver (the map's begin_unmap): from here
  // it counts as neither reserved nor cached, and it stays busy until its unmap
  // returns (commit_unmaps).
  void queued_unmap(Region& r, std::uint64_t g) {
    queued.push_back({static_cast<std::uint8_t>(&r - regions.data()), static_cast<std::uint32_t>(g)});
    st.reserved_bytes -= granule;
    st.cached_bytes -= granule;
  }

  void unmap_unused(bool all);

  // --- the lock and the driver -------------------------------------------------

  // The one way the pool lock is released inside an operation (the caller holds
  // mu, through a guard, and holds it again on return). The unmaps queued under it
  // run first, outside it, then `work(unmapped_all)` (false when one of those
  // unmaps failed); both are committed once the lock is back.
  template <class Work>
  void without_lock(Work&& work) {
    // Takes mu back and commits the unmaps however `work` ends, a throw included,
    // so that no granule stays busy with no call behind it.
    struct Relock {
      Impl& p;
      std::vector<Unmap> jobs;
      ~Relock() {
        p.mu.lock();
        if (!jobs.empty()) p.commit_unmaps(jobs);
      }
    } relock{*this, {}};
    relock.jobs.swap(queued);  // nothing queued outlives the critical section that queued it
    mu.unlock();
    bool all = true;
    for (Unmap& u : relock.jobs) {
      const std::uint64_t at = regions[u.region].place.base() + std::uint64_t{u.granule} * granule;
      u.ok = driver_ok([&] { return backend.unmap(at, granule); });
      all &= u.ok;
    }
    work(all);
  }
  // Runs what is queued before a public operation returns.
  void settle() {
    if (!queued.empty()) without_lock([](bool) {});
  }

  // Clears the busy marks of unmaps that ran; a failed one leaves its granule cached.
  void commit_unmaps(const std::vector<Unmap>& jobs);

  void driver_done() {
    driver_epoch.fetch_add(1, std::memory_order_release);
    if (driver_waiters > 0) driver_epoch.notify_all();
  }

  // Sleeps without the lock until a driver call of another caller commits, or
  // first runs this caller's queued unmaps and returns (the caller fits again).
  // Called after a fit found its granules busy: that caller runs the call now
  // (queued is empty whenever the lock is free) and commits under the lock, after `seen`.
  void await_driver();

  // --- blocks ---------------------------------------------------------------

  // A spare record for a new block (state live until the caller says otherwise),
  // at the generation its slot hands out next.
  std::uint32_t new_block() {
    if (spare.empty()) [[unlikely]] return new_record();
    const std::uint32_t b = spare.back();
    spare.pop_back();
    blocks[b].state = BlockState::live;
    return b;
  }
  [[gnu::noinline]] std::uint32_t new_record() {
    blocks.emplace_back().state = BlockState::live;
    leases.emplace_back();
    return static_cast<std::uint32_t>(blocks.size() - 1);
  }

  // The record's block is gone: the slot becomes spare, or retires with it (I1).
  // A spare record keeps no lease marks (new_block relies on it).
  [[gnu::always_inline]] void drop_record(std::uint32_t b) {
    Block& blk = blocks[b];
    blk.node = detail::OffsetAllocator::kNone;
    if (blk.leased || blk.ready_set || blk.slot_retired) [[unlikely]] {
      drop_marked(b);
      return;
    }
    blk.state = BlockState::spare;
    // emplace_back, not push_back: an instantiation of its own that gcc inlines here;
    // push_back's, shared with the cold paths, was not (21 instructions a churn pair).
    spare.emplace_back(b);
  }
  [[gnu::noinline]] void drop_marked(std::uint32_t b);

  // Returns a live block without open leases to the free space.
  [[gnu::always_inline]] void release_block(std::uint32_t b, std::uint64_t size) {
    Block& blk = blocks[b];
    Region& r = regions[blk.region];
    release_granules</*pending=*/false>(r, blk.addr, size);
    r.place.free(blk.node);
    drop_record(b);
  }

  // Files a freed block by its open leases: its range returns to the free space
  // at once either way, so where later blocks land never depends on when work
  // completes; with leases open it stays a pending block that keeps its granules
  // mapped (I2) until they retire.
  [[gnu::always_inline]] void file_freed(std::uint32_t b, std::uint64_t size) {
    if (!blocks[b].leased) [[likely]] {  // the hot path: no work ever named the block
      release_block(b, size);
      return;
    }
    file_leased(b, size);
  }
  [[gnu::noinline]] void file_leased(std::uint32_t b, std::uint64_t size);

  void file_pending(std::uint32_t b);

  void unfile_pending(std::uint32_t b);

  void retire_block(std::uint32_t b);

  // Releases the granules of pending blocks whose leases retired. Looks only at
  // the blocks whose lease completed and, when a stream advanced, at the blocks
  // leased on several streams: O(work retired), not O(pending).
  void retire_pending() {
    if (pending.empty()) return;  // the hot path
    retire_completed();
  }
  [[gnu::noinline]] void retire_completed();

  // --- placement over freed ranges ---------------------------------------------

  // A new block at [addr, addr+size) of region ri takes over the pending blocks
  // it overlaps: it inherits their leases (I2: the old work still touches these
  // bytes, and the new block's own free must keep them mapped until it is done),
  // and what of them lies outside it stays pending. Placement never looks at
  // them, so this is the one place a lease's timing meets the free space.
  void inherit_pending(std::uint8_t ri, std::uint32_t nb, std::uint64_t addr, std::uint64_t size) {
    if (regions[ri].pending_at.empty()) [[likely]] return;  // the hot path: nothing pending
    take_over_pending(ri, nb, addr, size);
  }
  [[gnu::noinline]] void take_over_pending(std::uint8_t ri, std::uint32_t nb, std::uint64_t addr,
                                           std::uint64_t size);

  void split_pending(std::uint32_t from, std::uint64_t addr, std::uint64_t size);

  UseSet foreign_points(std::uint32_t b, StreamId stream);

  std::uint8_t region_for(std::uint64_t size) const {
    return (regions.size() > 1 && size > options.small_limit) ? 1 : 0;
  }

  // try_fit's answers besides a block: no place fits, or the place found lies on
  // granules a driver call of another caller is mapping or unmapping (wait, then fit again).
  static constexpr std::uint32_t kNoFit = kNoBlock;
  static constexpr std::uint32_t kRetry = kNoBlock - 1;

  // Where a block of `size` goes: the offset allocator's quick fit when it lands
  // in granules live blocks use already (the hot path), else fit_scan.
  [[gnu::always_inline]] std::uint32_t try_fit(std::uint64_t size) {
    const std::uint8_t ri = region_for(size);
    Region& r = regions[ri];
    auto a = r.place.allocate(size / kAlign);
    if (!a) [[unlikely]] return fit_scan(size, ri, detail::OffsetAllocator::kNone, UINT64_MAX);
    const std::uint64_t addr = r.place.addr_of(a->offset);
    const std::uint64_t fresh = r.place.new_granules(addr, size);
    if (fresh > 0) return fit_scan(size, ri, a->node, fresh);
    // The hot path: every granule under the block is in use, so mapped already,
    // unless another caller's map of it is still running.
    auto [first, last] = r.place.granule_span(addr, size);
    if (r.map.span_busy(first, last)) [[unlikely]] {
      r.place.free(a->node);
      return kRetry;
    }
    r.place.take_refs(first, last);
    return place(ri, *a, addr, size);
  }

  // try_fit until no driver call of another caller is in the way.
  std::uint32_t fit(std::uint64_t size) {
    return fit_again(size, try_fit(size));
  }
  std::uint32_t fit_again(std::uint64_t size, std::uint32_t b) {
    while (b == kRetry) {
      await_driver();
      retire_pending();
      b = try_fit(size);
    }
    return b;
  }

  // A place for a block: a place in the free space of `region`.
  struct Placement {
    std::uint8_t region = 0;
    detail::PlacementCore::Candidate at;
  };

  Placement scan_placement(std::uint8_t own, std::uint64_t size) const;

  [[gnu::noinline]] std::uint32_t fit_scan(std::uint64_t size, std::uint8_t ri, std::uint32_t quick,
                                           std::uint64_t fresh);

  // A block for the allocator node `a` of region `ri`, whose granules are
  // referenced; it inherits the leases of the pending blocks it lands on.
  std::uint32_t place(std::uint8_t ri, detail::OffsetAllocator::Allocation a, std::uint64_t addr,
                      std::uint64_t size) {
    const std::uint32_t b = new_block();
    Block& blk = blocks[b];
    blk.region = ri;
    blk.node = a.node;
    blk.addr = addr;
    inherit_pending(ri, b, addr, size);
    return b;
  }

  // Orders `stream` after `after` with an event wait (I3), or returns 0 when none
  // is needed. Held work it names is dispatched first: the wait could never
  // finish while that work sits in a held queue. Called with no pool lock held.
  Result<Ticket> order_after(StreamId stream, StreamPoint after);

  // The one place where a block becomes an allocation: the handle exists from
  // here. `size` is the block's (rounded) size.
  DeviceHandle bind(std::uint32_t b, std::uint64_t size, std::uint64_t requested, StreamId stream,
                   bool internal) {
    Block& blk = blocks[b];
    blk.state = BlockState::live;
    blk.requested = requested;
    blk.stream = static_cast<std::uint8_t>(stream);
    blk.internal = internal;
    st.allocated_bytes += size;
    st.requested_bytes += requested;
    ++(internal ? st.internal_allocs : st.allocs);
    // Reserved bytes rise only where granules are mapped (reference_granules);
    // active_bytes is set where it is read (stats()).
    st.peak_allocated_bytes = std::max(st.peak_allocated_bytes, st.allocated_bytes);
    st.peak_requested_bytes = std::max(st.peak_requested_bytes, st.requested_bytes);
    st.peak_active_bytes = std::max(st.peak_active_bytes, st.allocated_bytes + st.pending_free_bytes);
    const DeviceHandle h{id, b, blk.generation};
    if (note_blocks) backend.note_block(blk.addr, size, h, {});
    return h;
  }

  // bind, then the block is stream-ordered on `stream` (I3): work it inherited on
  // other streams gets an event wait each, enqueued with no pool lock held
  // (submit takes the stream's lock, then lease() takes the pool's).
  [[gnu::always_inline]] Result<DeviceHandle> bind_ordered(std::uint32_t b, std::uint64_t size,
                                                           std::uint64_t requested, StreamId stream,
                                                           bool internal) {
    const DeviceHandle h = bind(b, size, requested, stream, internal);
    if (!blocks[b].leased && queued.empty()) [[likely]] {  // the hot path: it inherited no work
      check();
      return h;
    }
    return order_inherited(h, stream);
  }
  [[gnu::noinline]] Result<DeviceHandle> order_inherited(DeviceHandle h, StreamId stream);

  // A live block's handle is dropped and the block filed by its leases.
  [[gnu::always_inline]] void release_handle(std::uint32_t b) {
    Block& blk = blocks[b];
    // I1: a sub-block never outlives the block it names.
    if (blk.has_subs) [[unlikely]] drop_subs(b);
    // I1: a freed slot's generation changes, so every copy of the handle goes stale;
    // one that would wrap retires with the block instead, so no generation is ever
    // handed out twice.
    if (blk.generation == kLastGeneration) [[unlikely]] blk.slot_retired = true;
    else ++blk.generation;
    const std::uint64_t size = size_of(blk);
    st.allocated_bytes -= size;
    st.requested_bytes -= blk.requested;
    ++(blk.internal ? st.internal_frees : st.frees);
    file_freed(b, size);
  }

  [[gnu::noinline]] Error stale(DeviceHandle h) const;

  // The block of a live handle, or kNoBlock.
  std::uint32_t find_block(DeviceHandle h) const {
    if (h.pool != id || h.slot >= blocks.size()) return kNoBlock;
    const Block& blk = blocks[h.slot];
    if (blk.generation != h.generation || blk.state != BlockState::live) return kNoBlock;
    return h.slot;
  }

  // The record of a live handle, a block's or a sub-block's.
  Result<std::uint32_t> find(DeviceHandle h) const {
    std::uint32_t b = find_block(h);
    if (b == kNoBlock) [[unlikely]] b = find_sub(h);
    if (b == kNoBlock) return stale(h);
    return b;
  }

  // --- sub-blocks (sub_blocks.cpp) -------------------------------------------

  // The sub record of a live sub-block handle, or kNoBlock.
  [[gnu::noinline]] std::uint32_t find_sub(DeviceHandle h) const;
  // The block whose leases and stream order record b's bytes follow: b's own, or
  // its parent's for a sub record.
  std::uint32_t holder(std::uint32_t b) const {
    return blocks[b].state == BlockState::sub ? leases[b].parent : b;
  }
  // The bytes record b names: a block's size, or a sub-block's rounded request.
  std::uint64_t span_of(std::uint32_t b) const {
    return blocks[b].state == BlockState::sub ? detail::align_up(blocks[b].requested, kAlign)
                                              : size_of(blocks[b]);
  }
  // Sub record s goes stale (its slot spare, or retired at its last generation).
  void drop_sub(std::uint32_t s);
  // The program frees sub-block s: it goes stale and leaves its parent's list.
  void free_sub(std::uint32_t s);
  // Every sub record of live block b goes stale.
  [[gnu::noinline]] void drop_subs(std::uint32_t b);
  bool validate_subs(std::string* why) const;

  std::uint64_t largest_free_extent() const;

  std::string diagnostic(std::uint64_t bytes, StreamId stream) const;

  [[gnu::noinline]] Error refuse(std::uint64_t bytes, StreamId stream) const;
  [[gnu::noinline]] Error too_large(std::uint64_t bytes, StreamId stream);

  [[gnu::noinline]] Result<DeviceHandle> survive_pressure(std::uint64_t bytes, std::uint64_t size, StreamId stream,
                                                          bool internal);

  void check() const {
    if (options.validate_each_op) [[unlikely]] check_now();
  }
  [[gnu::noinline]] void check_now() const;

  bool validate_locked(std::string* why) const;
  // What validate's passes count from the blocks, for the later passes to check.
  struct ValidateTally {
    std::uint64_t live = 0, requested = 0, pending = 0;
    std::vector<std::vector<std::uint32_t>> refs, pending_refs;  // per region, per granule
  };
  static bool fail(std::string* why, std::string what) {
    if (why) *why = std::move(what);
    return false;
  }
  bool validate_regions(std::string* why, ValidateTally& t) const;
  bool validate_lists(std::string* why, std::vector<std::uint8_t>& is_spare, std::vector<std::uint8_t>& filed) const;
  bool validate_blocks(std::string* why, const std::vector<std::uint8_t>& is_spare,
                       const std::vector<std::uint8_t>& filed, ValidateTally& t) const;
  bool validate_granules(std::string* why, const ValidateTally& t) const;

  [[gnu::always_inline]] Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, bool internal) {
    if (!status.ok() || bytes == 0 || stream >= kMaxStreams) [[unlikely]] return refuse(bytes, stream);
    std::lock_guard lock(mu);
    if (bytes > capacity) [[unlikely]] return too_large(bytes, stream);
    const std::uint64_t size = detail::align_up(bytes, kAlign);  // bytes <= capacity: no overflow
    retire_pending();
    std::uint32_t b = try_fit(size);
    if (b < kRetry) [[likely]] return bind_ordered(b, size, bytes, stream, internal);
    b = fit_again(size, b);
    if (b != kNoFit) return bind_ordered(b, size, bytes, stream, internal);
    return survive_pressure(bytes, size, stream, internal);
  }
};

}  // namespace ferry
