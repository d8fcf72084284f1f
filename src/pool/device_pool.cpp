#include "ferry/device_pool.hpp"

#include <algorithm>
#include <bit>
#include <atomic>
#include <map>
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <new>
#include <utility>

#include "core/invariant.hpp"
#include "core/offset_allocator.hpp"
#include "core/testing_hooks.hpp"
#include "core/text.hpp"
#include "pool/futex_mutex.hpp"
#include "ferry/user_kernel.hpp"
#include "pool/pool_test_access.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kAlign = 256;  // every block starts and ends on this
constexpr std::uint32_t kNoBlock = UINT32_MAX;
std::atomic<std::uint32_t> next_pool_id{1};

std::string bytes_str(std::uint64_t b) { return text::human_bytes(b, 2); }

}  // namespace

struct DevicePool::Impl {
  // A block's index is its handle's slot: one record holds the slot's generation
  // and the block, so a free touches one cache line for both. A record is spare
  // (no block; its generation not handed out yet), live (its handle resolves),
  // pending (freed, leases open: no handle resolves to it), or retired.
  // A live block owns its allocator node. A pending block is a freed range whose
  // leases have not retired: its address range is free space already (node kNone),
  // and the block only keeps its granules mapped and names the work a later
  // block placed over it must be ordered after.
  enum class BlockState : std::uint8_t { spare, live, pending, retired };

  // What every allocate and free touches, in half a cache line; what only leased
  // blocks need lives in `leases` beside it (the churn loop touches no lease).
  // A live block's size is its allocator node's (size_of), so it is not kept twice.
  struct alignas(32) Block {
    std::uint64_t addr = 0;
    std::uint64_t requested = 0;  // as asked (live blocks)
    std::uint32_t node = detail::OffsetAllocator::kNone;
    std::uint32_t generation = 1;       // never 0, so {pool,slot,0} never resolves
    std::uint32_t heap_pos = kNoBlock;  // index in pending_on[s], or in pending_multi
    std::uint8_t region = 0;
    BlockState state = BlockState::spare;
    std::uint8_t stream = 0;
    bool leased : 1 = false;        // leases[b].uses may be non-empty  (!leased => uses empty)
    bool ready_set : 1 = false;     // leases[b].ready_after is set  (!ready_set => it is {})
    bool slot_retired : 1 = false;  // freed at kLastGeneration: the slot retires with the block
    bool internal : 1 = false;      // live: ferry's own buffer (allocate_internal)
  };
  static_assert(sizeof(Block) == 32);
  static_assert(kMaxStreams <= 256, "Block::stream is one byte");

  struct Leases {
    UseSet uses;              // leases of enqueued work on this block (I2)
    Ticket pending_key = 0;   // its one lease's ticket, while pending on one stream
    // Set when the block was reused on its stream while older work there still
    // touches it: other streams must wait for this point before using it (I3).
    StreamPoint ready_after{};
    std::uint64_t pending_size = 0;  // a pending block's size (it has no allocator node)
  };

  // I1: a slot whose generation reached this is retired at its free, never reused,
  // so a generation never comes round again.
  static constexpr std::uint32_t kLastGeneration = UINT32_MAX;

  // Granule flags (Region::flags).
  static constexpr std::uint8_t kMapped = 1;  // physical memory mapped under it
  static constexpr std::uint8_t kListed = 2;  // on Region::cached_list
  static constexpr std::uint8_t kFresh = 4;   // mapped by the reference_granules call under way
  // A driver call on it runs outside the pool lock: with kMapped it is being mapped
  // (in use by that placement), without it unmapped (in use by nobody, counted
  // neither reserved nor cached). Nobody places over a busy granule: they wait.
  static constexpr std::uint8_t kBusy = 8;

  // One reserved address range, carved by an offset allocator; physical granules
  // are mapped under it on demand. The per-granule arrays cover the granules used
  // so far (a prefix of the range) and grow with it.
  //   granule g is in use  <=>  refs[g] > 0  or  pending_refs[g] > 0
  //   granule g is mapped  <=>  it is in use  or  it is cached
  //   a cached granule (mapped, not in use) is on cached_list  (entries may be stale)
  //   pending blocks are disjoint, lie in free space, and are all in pending_at
  struct Region {
    std::uint64_t base = 0;
    std::uint64_t bytes = 0;
    detail::OffsetAllocator space;
    std::vector<std::uint32_t> refs;          // live blocks touching each granule: placement reads these
    std::vector<std::uint32_t> pending_refs;  // pending blocks touching each granule (I2: stays mapped)
    std::vector<std::uint8_t> flags;
    std::vector<std::uint32_t> cached_list;  // granules that became cached, for trim and eviction
    std::map<std::uint64_t, std::uint32_t> pending_at;  // pending blocks by address
    Region(std::uint64_t b, std::uint64_t n) : base(b), bytes(n), space(n / kAlign) {}
    std::uint32_t ref(std::uint64_t g) const { return g < refs.size() ? refs[g] : 0; }
    bool in_use(std::uint64_t g) const { return refs[g] > 0 || pending_refs[g] > 0; }
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
  // unmap run in without_lock, on granules flagged kBusy meanwhile).
  mutable detail::FutexMutex mu;
  std::vector<Region> regions;  // [0] small, [1] large (one region without VMM)
  std::vector<Block> blocks;  // I1: indexed by slot; a slot index never moves or gets renumbered
  std::vector<Leases> leases;  // parallel to blocks
  std::vector<std::uint32_t> spare;  // the spare records
  // Freed blocks whose leases have not retired (their ranges are free space
  // already). pending_on[s]: every open lease is on stream s; a min-heap by that
  // lease's ticket, so retiring them looks only at the ones that completed.
  std::array<std::vector<std::uint32_t>, kMaxStreams> pending_on;
  std::vector<std::uint32_t> pending_multi;  // leases on several streams
  std::uint64_t pending_streams = 0;  // bit s set  <=>  !pending_on[s].empty()
  std::uint64_t multi_streams = 0;    // streams the leases of pending_multi name (a superset)
  std::array<Ticket, kMaxStreams> multi_seen{};  // completion seen at pending_multi's last sweep
  std::uint64_t retired_slots = 0;  // records in state retired
  PoolStats st;
  // Unmaps decided and not started. Empty whenever the lock is free: whoever
  // queues runs them before releasing it (without_lock, settle), so a busy granule
  // another caller finds always has a driver call running for it.
  std::vector<Unmap> queued;
  std::vector<Mapping> mapping;        // placements whose maps run now
  std::uint64_t busy_granules = 0;     // granules flagged kBusy
  std::uint64_t unmapping_bytes = 0;   // busy granules being unmapped: still on the device
  // Bumped at every commit of driver calls; callers that found a busy granule
  // sleep on it without the lock (await_driver).
  std::atomic<std::uint32_t> driver_epoch{0};
  std::atomic<std::uint32_t> driver_waiters{0};  // written under mu; atomic so tests read it without mu

  Impl(StreamOrder& o, PoolOptions opt)
      : order(o), backend(o.backend()), options(opt), id(next_pool_id.fetch_add(1)),
        note_blocks(backend.race_log() != nullptr) {
    const DeviceInfo& info = backend.info();
    granule = std::bit_ceil(std::max<std::uint64_t>(info.granularity, kAlign));
    granule_shift = static_cast<unsigned>(std::countr_zero(granule));
    const std::uint64_t available =
        info.available == 0 ? info.capacity : std::min(info.available, info.capacity);
    // Without VMM the whole capacity is one allocation made now: asking for more than
    // is free can never succeed. With VMM granules map on demand, so an explicit
    // capacity may exceed what is free today (a map then fails as out_of_memory).
    const std::uint64_t ceiling = info.virtual_memory ? info.capacity : available;
    const std::uint64_t device_cap = ceiling / granule * granule;
    capacity = options.capacity == 0 ? available / granule * granule : std::min(options.capacity, device_cap);
    capacity = capacity / granule * granule;
    if (capacity == 0) {
      status = options.capacity == 0
                   ? make_error(ErrorCode::out_of_memory,
                                "the device has " + bytes_str(available) +
                                    " available, less than one granule (" + bytes_str(granule) + ")")
                   : make_error(ErrorCode::invalid_argument,
                                "pool capacity " + std::to_string(options.capacity) +
                                    " B is smaller than one device granule (" + bytes_str(granule) + ")");
      return;
    }
    // With virtual memory, address space is cheap: the large range has room for
    // fragmentation, because only mapped granules cost memory. Its size follows the
    // device, not the capacity, so that where a block lands never depends on the
    // capacity: only whether it fits does (a trace that replays at C replays at
    // every capacity above C).
    std::vector<std::uint64_t> sizes;
    if (info.virtual_memory) sizes = {device_cap, device_cap * 4};
    else sizes = {capacity};
    for (std::uint64_t bytes : sizes) {
      Result<std::uint64_t> base = backend.reserve_address(bytes);
      if (!base.ok()) {
        status = make_error(base.error().code,
                            "pool could not reserve " + bytes_str(bytes) + " of address space: " +
                                base.error().message);
        return;
      }
      regions.emplace_back(*base, bytes);
    }
  }

  ~Impl() {
    // I2 holds at teardown too: nothing is unmapped while enqueued work may
    // still touch it (bounded waits; a failed wait cannot be reported here).
    UseSet in_flight;
    for (std::uint32_t b = 0; b < blocks.size(); ++b)
      if (has_block(blocks[b]) && blocks[b].leased) in_flight.merge(leases[b].uses);
    (void)order.wait(in_flight);
    for (Region& r : regions) {
      for (std::uint64_t g = 0; g < r.flags.size(); ++g) {
        if (r.flags[g] & kMapped) (void)backend.unmap(r.base + g * granule, granule);
      }
      (void)backend.release_address(r.base, r.bytes);
    }
  }

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
    return regions[blk.region].space.size_of(blk.node) * kAlign;
  }
  // Any block's size, live or pending.
  std::uint64_t block_size(std::uint32_t b) const {
    return blocks[b].state == BlockState::pending ? leases[b].pending_size : size_of(blocks[b]);
  }

  // --- granules -------------------------------------------------------------

  std::pair<std::uint64_t, std::uint64_t> granule_span(const Region& r, std::uint64_t addr,
                                                       std::uint64_t size) const {
    // granule is a power of two; shifts keep divisions off the hot path.
    const std::uint64_t first = (addr - r.base) >> granule_shift;
    const std::uint64_t last = (addr - r.base + size - 1) >> granule_shift;
    return {first, last};
  }

  // Granules a block at [addr, addr+size) would be the first live block to touch,
  // when the range lies in free space: a granule strictly inside a free extent is
  // touched by no live block, so only the two end granules can be. Pending blocks
  // do not count: when their work completes depends on timing, and placement
  // must not (a trace that replays at C replays at every capacity above C).
  std::uint64_t new_granules(const Region& r, std::uint64_t addr, std::uint64_t size) const {
    auto [first, last] = granule_span(r, addr, size);
    std::uint64_t n = last - first + 1;
    if (r.ref(first) > 0) --n;
    if (last != first && r.ref(last) > 0) --n;
    return n;
  }

  void cover(Region& r, std::uint64_t last) {
    if (last < r.refs.size()) return;
    // Growth is geometric, so steady-state work never allocates here.
    const std::uint64_t n = std::min<std::uint64_t>(std::max<std::uint64_t>(last + 1, 2 * r.refs.size()),
                                                    r.bytes >> granule_shift);
    // Every array is reserved before any grows, so a throw leaves their lengths
    // equal; the cached list holds a granule at most once (kListed), so no push
    // to it allocates after this.
    r.refs.reserve(n);
    r.pending_refs.reserve(n);
    r.flags.reserve(n);
    r.cached_list.reserve(n);
    r.refs.resize(n, 0);
    r.pending_refs.resize(n, 0);
    r.flags.resize(n, 0);
  }

  // What reference_granules did: the granules are referenced; a busy granule of
  // another caller is in the way (wait for its driver call, then fit again); or
  // the capacity has no room, or a map failed (nothing changed either way).
  enum class Referenced : std::uint8_t { yes, busy, no_room };

  // True when a driver call of another caller runs on a granule of [first, last].
  bool span_busy(const Region& r, std::uint64_t first, std::uint64_t last) const {
    if (busy_granules == 0) return false;
    for (std::uint64_t g = first; g <= last; ++g)
      if (r.flags[g] & kBusy) return true;
    return false;
  }

  // Takes references on the granules under [addr, addr+size), mapping the ones
  // that are not mapped; `fresh` granules of them are touched by no live block yet.
  // Refuses (no_room, nothing changed) when the granules in use would exceed the
  // capacity; cached granules elsewhere are unmapped to make room, so whether a
  // placement fits depends on the blocks alone, never on what is cached.
  // The driver calls run without the lock: the caller holds the allocator node at
  // `addr`, so nobody places over it, and its fresh granules stay kBusy until the
  // maps return, so nobody else uses them before they are mapped.
  Referenced reference_granules(Region& r, std::uint64_t addr, std::uint64_t size, std::uint64_t fresh) {
    auto [first, last] = granule_span(r, addr, size);
    cover(r, last);
    if (span_busy(r, first, last)) return Referenced::busy;
    if (fresh == 0) {  // every granule is in use, so mapped already
      for (std::uint64_t g = first; g <= last; ++g) ++r.refs[g];
      return Referenced::yes;
    }
    std::uint64_t unused = 0;  // granules no block, live or pending, touches
    for (std::uint64_t g = first; g <= last; ++g) unused += r.in_use(g) ? 0 : 1;
    if (referenced_bytes() + unused * granule > capacity) return Referenced::no_room;
    // Runs of unmapped granules, mapped with one call each. Collected before
    // anything changes, so that an allocation that throws leaves no trace.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> runs;  // first granule, count
    for (std::uint64_t g = first; g <= last;) {
      if (r.flags[g] & kMapped) { ++g; continue; }
      std::uint64_t end = g;
      while (end <= last && !(r.flags[end] & kMapped)) ++end;
      runs.emplace_back(g, end - g);
      g = end;
    }
    const auto ri = static_cast<std::uint8_t>(&r - regions.data());
    if (!runs.empty()) mapping.push_back({ri, addr, size});
    // The runs count as reserved from here, so no other placement counts on their room.
    for (const auto& [g, n] : runs) {
      for (std::uint64_t u = g; u < g + n; ++u) r.flags[u] |= kMapped | kFresh | kBusy;
      busy_granules += n;
      st.reserved_bytes += n * granule;
    }
    for (std::uint64_t g = first; g <= last; ++g) {
      if (!(r.flags[g] & kFresh) && !r.in_use(g)) st.cached_bytes -= granule;  // a cached granule is back in use
      ++r.refs[g];
    }
    if (runs.empty()) return Referenced::yes;
    std::size_t runs_mapped = 0;
    Referenced outcome = Referenced::no_room;
    // An eviction whose unmap fails leaves its granule cached, at the front of the
    // list, so the next round evicts others first; a round per granule cached now
    // bounds the rounds (and ends in no_room).
    std::uint64_t rounds = st.cached_bytes / granule + 1;
    try {
      for (; rounds > 0; --rounds) {
        // Memory on its way out is on the device until its unmap returns: the
        // caller's own queued unmaps run before its maps, other callers' are in flight.
        const std::uint64_t others = unmapping_bytes - queued.size() * granule;
        const std::uint64_t need = st.reserved_bytes + others;
        // Cached granules elsewhere make the room.
        if (need > capacity && !evict_cached(need - capacity, r, first, last)) {
          if (others > 0) outcome = Referenced::busy;  // their unmaps return room: wait for them
          break;
        }
        bool unmapped_all = false;
        without_lock([&](bool all) {
          unmapped_all = all;
          if (!all) return;  // the room counted on an unmap that failed: make it again
          for (; runs_mapped < runs.size(); ++runs_mapped) {
            const std::uint64_t at = r.base + runs[runs_mapped].first * granule;
            const std::uint64_t bytes = runs[runs_mapped].second * granule;
            if (!driver_ok([&] { return backend.map(at, bytes); })) {
              for (std::size_t k = 0; k < runs_mapped; ++k)  // all or nothing
                (void)driver_ok([&] { return backend.unmap(r.base + runs[k].first * granule, runs[k].second * granule); });
              return;
            }
          }
        });
        if (unmapped_all) {
          if (runs_mapped == runs.size()) outcome = Referenced::yes;
          break;
        }
      }
    } catch (const std::bad_alloc&) {  // queueing an eviction: the placement fails and rolls back
      outcome = Referenced::no_room;
    }
    st.maps += runs_mapped;  // successful calls, as counted before a rollback too
    mapping.erase(std::find_if(mapping.begin(), mapping.end(),
                               [&](const Mapping& m) { return m.region == ri && m.addr == addr; }));
    const bool mapped = outcome == Referenced::yes;
    for (std::uint64_t g = first; g <= last; ++g) {
      if (!(r.flags[g] & kFresh)) {
        if (!mapped) drop_ref(r, g);
        continue;
      }
      --busy_granules;
      if (mapped) {
        r.flags[g] &= static_cast<std::uint8_t>(~(kFresh | kBusy));
      } else {
        r.flags[g] &= static_cast<std::uint8_t>(~(kMapped | kFresh | kBusy));
        st.reserved_bytes -= granule;
        --r.refs[g];
      }
    }
    driver_done();
    if (mapped) st.peak_reserved_bytes = std::max(st.peak_reserved_bytes, st.reserved_bytes);
    return outcome;
  }

  // A driver call's success; a throw (the sim's bookkeeping out of memory) is a failure.
  template <class Call>
  static bool driver_ok(Call&& call) noexcept {
    try {
      return call().ok();
    } catch (...) {
      return false;
    }
  }

  // Drops one live reference on granule g; unused, it becomes cached.
  void drop_ref(Region& r, std::uint64_t g) {
    if (--r.refs[g] == 0 && r.pending_refs[g] == 0) {
      st.cached_bytes += granule;
      list_cached(r, g);
    }
  }
  void list_cached(Region& r, std::uint64_t g) {
    if (r.flags[g] & kListed) return;
    r.flags[g] |= kListed;
    r.cached_list.push_back(static_cast<std::uint32_t>(g));
  }

  // Queues the unmap of cached granules until `bytes` are released (true) or none
  // is left (false), except granules [keep_first, keep_last] of `keep` (the
  // placement under way). From the back of the list: the most recently cached first.
  bool evict_cached(std::uint64_t bytes, const Region& keep, std::uint64_t keep_first,
                    std::uint64_t keep_last) {
    std::uint64_t released = 0;
    for (Region& r : regions) {
      auto& list = r.cached_list;
      for (std::size_t i = list.size(); i-- > 0 && released < bytes;) {
        const std::uint32_t g = list[i];
        const bool cached = (r.flags[g] & kMapped) && !r.in_use(g);
        if (cached && &r == &keep && g >= keep_first && g <= keep_last) continue;
        if (cached) {
          queue_unmap(r, g);
          released += granule;
        }
        r.flags[g] &= static_cast<std::uint8_t>(~kListed);
        list[i] = list.back();
        list.pop_back();
      }
    }
    return released >= bytes;
  }

  // Drops the references of a block (live ones in refs, pending ones in
  // pending_refs); granules nobody touches become cached, and cached memory
  // beyond the release threshold is queued for unmapping. Only called for blocks
  // whose leases have all retired, so unmapping here never races queued work (I2).
  // `pending` is a template argument so a live block's free tests only the other count.
  template <bool pending>
  [[gnu::always_inline]] void release_granules(Region& r, std::uint64_t addr, std::uint64_t size) {
    auto [first, last] = granule_span(r, addr, size);
    auto& counts = pending ? r.pending_refs : r.refs;
    const auto& others = pending ? r.refs : r.pending_refs;
    for (std::uint64_t g = first; g <= last; ++g) {
      if (--counts[g] == 0 && others[g] == 0) {
        st.cached_bytes += granule;
        list_cached(r, g);
      }
    }
    if (st.cached_bytes > options.release_threshold) {
      for (std::uint64_t g = first; g <= last && st.cached_bytes > options.release_threshold; ++g) {
        if (!r.in_use(g) && (r.flags[g] & kMapped)) queue_unmap(r, g);
      }
    }
  }

  // Cached granule g of r goes to the driver: from here it counts as neither
  // reserved nor cached, and it stays busy until its unmap returns (commit_unmaps).
  void queue_unmap(Region& r, std::uint64_t g) {
    queued.push_back({static_cast<std::uint8_t>(&r - regions.data()), static_cast<std::uint32_t>(g)});
    r.flags[g] = static_cast<std::uint8_t>((r.flags[g] & ~kMapped) | kBusy);
    st.reserved_bytes -= granule;
    st.cached_bytes -= granule;
    unmapping_bytes += granule;
    ++busy_granules;
  }

  // Queues the unmap of every mapped granule that no block touches (or, unless
  // `all`, only down to the release threshold). O(granules that became cached
  // since the last call), not O(capacity).
  void unmap_unused(bool all) {
    for (Region& r : regions) {
      auto& list = r.cached_list;
      std::size_t kept = 0;
      for (std::size_t i = 0; i < list.size(); ++i) {
        const std::uint32_t g = list[i];
        const bool cached = (r.flags[g] & kMapped) && !r.in_use(g);
        const bool wanted = all || st.cached_bytes > options.release_threshold;
        if (cached && !wanted) {
          list[kept++] = g;  // stays cached, stays listed
          continue;
        }
        if (cached) queue_unmap(r, g);
        r.flags[g] &= static_cast<std::uint8_t>(~kListed);
      }
      list.resize(kept);
    }
  }

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
      const std::uint64_t at = regions[u.region].base + std::uint64_t{u.granule} * granule;
      u.ok = driver_ok([&] { return backend.unmap(at, granule); });
      all &= u.ok;
    }
    work(all);
  }
  // Runs what is queued before a public operation returns.
  void settle() {
    if (!queued.empty()) without_lock([](bool) {});
  }

  void commit_unmaps(const std::vector<Unmap>& jobs) {
    for (const Unmap& u : jobs) {
      Region& r = regions[u.region];
      r.flags[u.granule] &= static_cast<std::uint8_t>(~kBusy);
      unmapping_bytes -= granule;
      --busy_granules;
      if (u.ok) {
        ++st.unmaps;
        continue;
      }
      r.flags[u.granule] |= kMapped;  // still mapped: cached again, evicted last
      st.reserved_bytes += granule;
      st.cached_bytes += granule;
      if (!(r.flags[u.granule] & kListed)) {
        r.flags[u.granule] |= kListed;
        r.cached_list.insert(r.cached_list.begin(), u.granule);  // no allocation: reserved in cover()
      }
    }
    driver_done();
  }

  void driver_done() {
    driver_epoch.fetch_add(1, std::memory_order_release);
    if (driver_waiters > 0) driver_epoch.notify_all();
  }

  // Sleeps without the lock until a driver call of another caller commits, or
  // first runs this caller's queued unmaps and returns (the caller fits again).
  // Called after a fit found its granules busy: that caller runs the call now
  // (queued is empty whenever the lock is free) and commits under the lock, after `seen`.
  void await_driver() {
    if (!queued.empty()) {  // this caller's unmaps first, committed: others may need their room
      settle();
      return;
    }
    const std::uint32_t seen = driver_epoch.load(std::memory_order_relaxed);
    ++driver_waiters;
    without_lock([&](bool) { driver_epoch.wait(seen, std::memory_order_acquire); });
    --driver_waiters;
  }

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
  [[gnu::noinline]] void drop_marked(std::uint32_t b) {
    Block& blk = blocks[b];
    blk.heap_pos = kNoBlock;
    leases[b].uses.clear();  // keeps its capacity: steady state allocates nothing
    leases[b].pending_key = 0;
    leases[b].ready_after = {};
    leases[b].pending_size = 0;
    blk.leased = blk.ready_set = false;
    if (blk.slot_retired) {
      blk.state = BlockState::retired;
      ++retired_slots;
      return;
    }
    blk.state = BlockState::spare;
    spare.emplace_back(b);
  }

  // Returns a live block without open leases to the free space.
  [[gnu::always_inline]] void release_block(std::uint32_t b, std::uint64_t size) {
    Block& blk = blocks[b];
    Region& r = regions[blk.region];
    release_granules</*pending=*/false>(r, blk.addr, size);
    r.space.free(blk.node);
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
  [[gnu::noinline]] void file_leased(std::uint32_t b, std::uint64_t size) {
    UseSet& uses = leases[b].uses;
    if (uses.empty() || uses.retire(order)) {
      release_block(b, size);
      return;
    }
    Block& blk = blocks[b];
    Region& r = regions[blk.region];
    r.space.free(blk.node);
    blk.node = detail::OffsetAllocator::kNone;
    // Its references move from the live count to the pending one: nothing unmaps.
    auto [first, last] = granule_span(r, blk.addr, size);
    for (std::uint64_t g = first; g <= last; ++g) {
      --r.refs[g];
      ++r.pending_refs[g];
    }
    blk.state = BlockState::pending;
    leases[b].pending_size = size;
    file_pending(b);
  }

  // Enters pending block b in the address index and the retirement lists.
  void file_pending(std::uint32_t b) {
    Block& blk = blocks[b];
    const UseSet& uses = leases[b].uses;
    st.pending_free_bytes += leases[b].pending_size;
    regions[blk.region].pending_at.emplace(blk.addr, b);
    if (auto s = uses.single_stream()) {
      push_pending(*s, b);
      return;
    }
    blk.heap_pos = static_cast<std::uint32_t>(pending_multi.size());
    pending_multi.push_back(b);
    for (const StreamPoint& p : uses.points()) multi_streams |= std::uint64_t{1} << p.stream;
  }

  // Takes pending block b out of the retirement lists and the address index; the
  // caller releases its granules or keeps them for what replaces it.
  void unfile_pending(std::uint32_t b) {
    st.pending_free_bytes -= leases[b].pending_size;
    regions[blocks[b].region].pending_at.erase(blocks[b].addr);
    const auto points = leases[b].uses.points();
    if (points.size() == 1) {
      remove_pending(points[0].stream, b);
    } else {
      remove_multi(b);
    }
  }

  // A pending block whose leases all retired, out of its retirement list: its
  // granules may unmap now (I2).
  void retire_block(std::uint32_t b) {
    const std::uint64_t size = leases[b].pending_size;
    st.pending_free_bytes -= size;
    Region& r = regions[blocks[b].region];
    r.pending_at.erase(blocks[b].addr);
    release_granules</*pending=*/true>(r, blocks[b].addr, size);
    drop_record(b);
  }

  void remove_multi(std::uint32_t b) {
    const std::uint32_t i = blocks[b].heap_pos;
    const std::uint32_t last = pending_multi.back();
    pending_multi[i] = last;
    blocks[last].heap_pos = i;
    pending_multi.pop_back();
    blocks[b].heap_pos = kNoBlock;
  }

  // --- the per-stream heaps of pending blocks ----------------------------------

  bool earlier(std::uint32_t a, std::uint32_t b) const { return leases[a].pending_key < leases[b].pending_key; }
  void heap_put(std::vector<std::uint32_t>& h, std::size_t i, std::uint32_t b) {
    h[i] = b;
    blocks[b].heap_pos = static_cast<std::uint32_t>(i);
  }
  void sift_up(std::vector<std::uint32_t>& h, std::size_t i) {
    const std::uint32_t b = h[i];
    while (i > 0 && earlier(b, h[(i - 1) / 2])) {
      heap_put(h, i, h[(i - 1) / 2]);
      i = (i - 1) / 2;
    }
    heap_put(h, i, b);
  }
  void sift_down(std::vector<std::uint32_t>& h, std::size_t i) {
    const std::uint32_t b = h[i];
    for (;;) {
      std::size_t c = 2 * i + 1;
      if (c >= h.size()) break;
      if (c + 1 < h.size() && earlier(h[c + 1], h[c])) ++c;
      if (!earlier(h[c], b)) break;
      heap_put(h, i, h[c]);
      i = c;
    }
    heap_put(h, i, b);
  }
  void push_pending(StreamId s, std::uint32_t b) {
    leases[b].pending_key = leases[b].uses.points()[0].ticket;
    auto& h = pending_on[s];
    h.push_back(b);
    sift_up(h, h.size() - 1);
    pending_streams |= std::uint64_t{1} << s;
  }
  void remove_pending(StreamId s, std::uint32_t b) {
    auto& h = pending_on[s];
    const std::size_t i = blocks[b].heap_pos;
    const std::uint32_t last = h.back();
    h.pop_back();
    blocks[b].heap_pos = kNoBlock;
    if (i < h.size()) {
      heap_put(h, i, last);
      sift_up(h, i);
      sift_down(h, blocks[last].heap_pos);
    }
    if (h.empty()) pending_streams &= ~(std::uint64_t{1} << s);
  }

  // Releases the granules of pending blocks whose leases retired. Looks only at
  // the blocks whose lease completed (heap tops) and, when a stream advanced, at
  // the blocks leased on several streams: O(work retired), not O(pending).
  void retire_pending() {
    if (pending_streams == 0 && pending_multi.empty()) return;  // the hot path
    retire_completed();
  }
  [[gnu::noinline]] void retire_completed() {
    if (!pending_multi.empty()) sweep_multi();
    for (std::uint64_t mask = pending_streams; mask != 0; mask &= mask - 1) {
      const auto s = static_cast<StreamId>(std::countr_zero(mask));
      auto& h = pending_on[s];
      while (!h.empty() && order.is_complete({s, leases[h.front()].pending_key})) {
        const std::uint32_t b = h.front();
        remove_pending(s, b);
        retire_block(b);
      }
    }
    // active_bytes follows pending_free_bytes, which the sweep lowered.
    note_peaks();
  }

  void sweep_multi() {
    bool advanced = false;
    for (std::uint64_t mask = multi_streams; mask != 0; mask &= mask - 1) {
      const auto s = static_cast<StreamId>(std::countr_zero(mask));
      const Ticket c = order.completed(s);
      advanced |= c != multi_seen[s];
      multi_seen[s] = c;
    }
    // Nothing completed since the last sweep: no block here can have retired.
    if (!advanced) return;
    multi_streams = 0;
    for (std::size_t i = 0; i < pending_multi.size();) {
      const std::uint32_t b = pending_multi[i];
      UseSet& uses = leases[b].uses;
      if (uses.retire(order)) {
        remove_multi(b);
        retire_block(b);
        continue;
      }
      // A block whose remaining leases narrowed to one stream moves to that
      // stream's heap.
      if (auto s = uses.single_stream()) {
        remove_multi(b);
        push_pending(*s, b);
        continue;
      }
      for (const StreamPoint& p : uses.points()) multi_streams |= std::uint64_t{1} << p.stream;
      ++i;
    }
  }

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
                                           std::uint64_t size) {
    auto& index = regions[ri].pending_at;
    const std::uint64_t end = addr + size;
    auto it = index.upper_bound(addr);
    if (it != index.begin()) {
      auto prev = std::prev(it);
      if (prev->first + leases[prev->second].pending_size > addr) it = prev;
    }
    while (it != index.end() && it->first < end) {
      const std::uint32_t b = it->second;
      ++it;  // unfile_pending erases b's entry
      unfile_pending(b);
      const std::uint64_t b_addr = blocks[b].addr, b_end = b_addr + leases[b].pending_size;
      if (!leases[b].uses.retire(order)) {
        blocks[nb].leased = true;
        leases[nb].uses.merge(leases[b].uses);
        // The parts outside the new block stay pending under the same leases; their
        // references are taken before b's are dropped, so no granule unmaps between.
        if (b_addr < addr) split_pending(b, b_addr, addr - b_addr);
        if (b_end > end) split_pending(b, end, b_end - end);
      }
      release_granules</*pending=*/true>(regions[ri], b_addr, b_end - b_addr);
      drop_record(b);  // a slot retired at its last generation retires here (I1)
    }
  }

  // A new pending block over [addr, addr+size), part of pending block `from`, with its leases.
  void split_pending(std::uint32_t from, std::uint64_t addr, std::uint64_t size) {
    const std::uint32_t p = new_block();  // may reallocate blocks: take references after
    Block& part = blocks[p];
    const Block& src = blocks[from];
    part.region = src.region;
    part.state = BlockState::pending;
    part.stream = src.stream;
    part.addr = addr;
    part.leased = true;
    leases[p].uses = leases[from].uses;
    leases[p].pending_size = size;
    Region& r = regions[part.region];
    auto [first, last] = granule_span(r, addr, size);
    for (std::uint64_t g = first; g <= last; ++g) ++r.pending_refs[g];
    file_pending(p);
  }

  // Orders the new block after the work it inherited: later work on `stream`
  // follows it by FIFO for its own points and by event waits for the others
  // (enqueued by allocate, outside the lock); other streams wait for `stream`
  // past that point (make_ready). Returns the points `stream` must wait for.
  UseSet foreign_points(std::uint32_t b, StreamId stream) {
    UseSet& uses = leases[b].uses;
    UseSet foreign;
    if (uses.empty() || uses.retire(order)) return foreign;
    bool own = false;
    for (const StreamPoint& p : uses.points()) {
      if (p.stream == stream) {
        blocks[b].ready_set = true;
        leases[b].ready_after = p;
        own = true;
      } else {
        foreign.add(p);
      }
    }
    if (own && foreign.empty()) ++st.same_stream_reuses;
    return foreign;
  }

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
    auto a = r.space.allocate(size / kAlign);
    if (!a) [[unlikely]] return fit_scan(size, ri, detail::OffsetAllocator::kNone, UINT64_MAX);
    const std::uint64_t addr = r.base + a->offset * kAlign;
    const std::uint64_t fresh = new_granules(r, addr, size);
    if (fresh > 0) return fit_scan(size, ri, a->node, fresh);
    // The hot path: every granule under the block is in use, so mapped already,
    // unless another caller's map of it is still running.
    auto [first, last] = granule_span(r, addr, size);
    if (span_busy(r, first, last)) [[unlikely]] {
      r.space.free(a->node);
      return kRetry;
    }
    for (std::uint64_t g = first; g <= last; ++g) ++r.refs[g];
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

  // A place for a block: free node `node` of `region`, at `offset` (units).
  struct Placement {
    std::uint8_t region = 0;
    std::uint32_t node = detail::OffsetAllocator::kNone;
    std::uint64_t offset = 0;
    std::uint64_t fresh = UINT64_MAX;  // granules no live block touches yet
    std::uint64_t span = UINT64_MAX;   // last granule - first granule
  };

  // The place, in either region, that touches the fewest granules no live block
  // uses, so small blocks fill partly used granules instead of holding fresh
  // ones; for a block that fits in one granule, among those the one spanning the
  // fewest, so that it does not straddle two (a granule under two blocks stays
  // mapped while either lives). Candidates: both ends of each free extent,
  // and the first granule boundary in it and the last one a block can end on.
  // The choice reads the live blocks and the free space only, never the
  // capacity, what is mapped or what work completed: only whether the place fits
  // depends on the capacity, which keeps the pool monotone in capacity.
  Placement scan_placement(std::uint8_t own, std::uint64_t size) const {
    const std::uint64_t units = size / kAlign;
    const std::uint64_t granule_units = granule / kAlign;
    const bool within_one = size <= granule;  // only a block that fits one granule can avoid straddling
    Placement best;
    // The quick fit's own region first, so a tie keeps the block in its class.
    for (std::uint8_t k = 0; k < regions.size() && best.fresh > 0; ++k) {
      const auto rk = static_cast<std::uint8_t>(k == 0 ? own : (own == 0 ? k : k - 1));
      const Region& r = regions[rk];
      r.space.for_each_free_from(units, [&](std::uint32_t node, std::uint64_t off, std::uint64_t n) {
        const std::uint64_t up = (off + granule_units - 1) / granule_units * granule_units;
        const std::uint64_t down = (off + n) / granule_units * granule_units;
        // The extent's end last: on a tie the lower place wins, so the free tail of
        // a range is used from its start and the granule arrays stay a short prefix.
        const std::uint64_t candidates[] = {off, up + units <= off + n ? up : off,
                                            down >= off + units ? down - units : off, off + n - units};
        for (std::uint64_t at : candidates) {
          const std::uint64_t addr = r.base + at * kAlign;
          const std::uint64_t fresh = new_granules(r, addr, size);
          const auto [first, last] = granule_span(r, addr, size);
          if (fresh < best.fresh || (fresh == best.fresh && within_one && last - first < best.span))
            best = {rk, node, at, fresh, last - first};
        }
        return best.fresh > 0;
      });
    }
    return best;
  }

  // The quick fit's node `quick` of region `ri` (kNone: there was none) would
  // touch `fresh` unused granules: place the block by scan_placement instead.
  // Scalar arguments only, so the hot path that calls it builds no argument frame.
  [[gnu::noinline]] std::uint32_t fit_scan(std::uint64_t size, std::uint8_t ri, std::uint32_t quick,
                                           std::uint64_t fresh) {
    if (quick != detail::OffsetAllocator::kNone) regions[ri].space.free(quick);
    // Unmaps queued in this critical section run before any map: the capacity counts on them.
    settle();
    const Placement best = scan_placement(ri, size);
    if (best.node == detail::OffsetAllocator::kNone) return kNoFit;
    ri = best.region;
    const auto a = regions[ri].space.allocate_range(best.node, best.offset, size / kAlign);
    Region& r = regions[ri];
    const std::uint64_t addr = r.base + a.offset * kAlign;
    const Referenced referenced = reference_granules(r, addr, size, best.fresh);
    if (referenced != Referenced::busy && best.fresh < fresh) ++st.tight_fits;  // once per placement tried
    if (referenced != Referenced::yes) {
      r.space.free(a.node);
      return referenced == Referenced::busy ? kRetry : kNoFit;
    }
    return place(ri, a, addr, size);
  }

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
  Result<Ticket> order_after(StreamId stream, StreamPoint after) {
    if (after.ticket == 0 || after.stream == stream || order.is_complete(after)) return Ticket{0};
    if (testing_hooks::dropped(testing_hooks::WaitSite::pool_reuse)) return Ticket{0};
    FERRY_TRY(backend.flush(after.stream));
    return order.order_after(stream, after);
  }

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
  [[gnu::noinline]] Result<DeviceHandle> order_inherited(DeviceHandle h, StreamId stream) {
    const UseSet foreign = blocks[h.slot].leased ? foreign_points(h.slot, stream) : UseSet{};
    if (foreign.empty()) {
      settle();
      check();
      return h;
    }
    check();
    Ticket last = 0;
    Result<void> ordered;
    without_lock([&](bool) {
      for (const StreamPoint& point : foreign.points()) {
        Result<Ticket> t = order_after(stream, point);
        if (!t.ok()) {
          ordered = std::move(t).error();
          break;
        }
        last = std::max(last, *t);
      }
    });
    // Only a forged copy of h can have freed the block meanwhile: then nothing is left to order.
    const std::uint32_t b = find_block(h);
    if (!ordered.ok()) {
      if (b != kNoBlock) {  // backend_error: nothing allocated, so neither an alloc nor a free is counted
        const bool internal = blocks[b].internal;
        release_handle(b);
        --(internal ? st.internal_allocs : st.allocs);
        --(internal ? st.internal_frees : st.frees);
      }
      settle();
      check();
      return std::move(ordered).error();
    }
    // Other streams wait for `stream` past these waits (make_ready).
    if (b != kNoBlock && last != 0) {
      blocks[b].ready_set = true;
      leases[b].ready_after = {stream, last};
    }
    return h;
  }

  // A live block's handle is dropped and the block filed by its leases.
  [[gnu::always_inline]] void release_handle(std::uint32_t b) {
    Block& blk = blocks[b];
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

  // Errors are built out of line, so the hot path carries no string code.
  [[gnu::noinline]] Error stale(DeviceHandle h) const {
    if (h.pool != id) {
      return make_error(ErrorCode::stale_handle,
                        "handle {pool " + std::to_string(h.pool) + ", slot " + std::to_string(h.slot) +
                            "} belongs to another pool (this is pool " + std::to_string(id) + ")");
    }
    return make_error(ErrorCode::stale_handle,
                      "handle {slot " + std::to_string(h.slot) + ", generation " +
                          std::to_string(h.generation) + "} is stale: " +
                          (h.slot >= blocks.size()
                               ? std::string("no such slot")
                               : "slot is at generation " + std::to_string(blocks[h.slot].generation) +
                                     (blocks[h.slot].state != BlockState::live ? " and free" : "")));
  }

  // The block of a live handle, or kNoBlock.
  std::uint32_t find_block(DeviceHandle h) const {
    if (h.pool != id || h.slot >= blocks.size()) return kNoBlock;
    const Block& blk = blocks[h.slot];
    if (blk.generation != h.generation || blk.state != BlockState::live) return kNoBlock;
    return h.slot;
  }

  Result<std::uint32_t> find(DeviceHandle h) const {
    const std::uint32_t b = find_block(h);
    if (b == kNoBlock) return stale(h);
    return b;
  }

  // The largest request that would fit now without reclaiming anything: a run of
  // free address space whose granules are in use already, or that capacity left
  // unreferenced can map (cached granules count as room: they are unmapped on
  // demand). Scans every free extent: for diagnostics, not for hot paths.
  std::uint64_t largest_free_extent() const {
    const std::uint64_t room = (capacity - referenced_bytes()) >> granule_shift;  // granules
    std::uint64_t best = 0;
    for (const Region& r : regions) {
      r.space.for_each_free([&](std::uint32_t, std::uint64_t off, std::uint64_t n) {
        const std::uint64_t addr = r.base + off * kAlign, bytes = n * kAlign;
        auto [first, last] = granule_span(r, addr, bytes);
        // Only the end granules can be in use by a neighbour; the rest would be fresh.
        const std::uint64_t lead = r.ref(first) > 0 ? std::min(bytes, ((first + 1) << granule_shift) - (addr - r.base)) : 0;
        const std::uint64_t trail = last != first && r.ref(last) > 0 ? (addr - r.base + bytes) - (last << granule_shift) : 0;
        const std::uint64_t fresh = new_granules(r, addr, bytes);
        std::uint64_t fits = bytes;
        if (fresh > room) fits = std::min(bytes, std::max(lead, trail) + (room << granule_shift));
        best = std::max(best, fits);
      });
    }
    return best;
  }

  std::string diagnostic(std::uint64_t bytes, StreamId stream) const {
    const std::uint64_t held = st.allocated_bytes + st.pending_free_bytes;
    // Past the capacity the rounding (and held + size) would wrap: a request that
    // large is named as such, never as fragmentation.
    const std::uint64_t size = bytes > capacity ? 0 : (bytes + kAlign - 1) / kAlign * kAlign;
    const std::string cause =
        bytes > capacity ? std::string("capacity: the request is larger than the whole capacity")
        : held + size > capacity
            ? "capacity: live + pending-free + the request exceed the capacity by " +
                  bytes_str(held + size - capacity)
            : "fragmentation: " + bytes_str(capacity - held) +
                  " are not held by any block, but no free extent can take the request";
    return "out of memory: request of " + bytes_str(bytes) + " (" + std::to_string(bytes) +
           " B) on stream " + std::to_string(stream) + "; capacity " + bytes_str(capacity) +
           ", reserved " + bytes_str(st.reserved_bytes) + ", live " + bytes_str(st.allocated_bytes) +
           ", pending-free " + bytes_str(st.pending_free_bytes) + ", cached " +
           bytes_str(st.cached_bytes) + ", largest free extent " + bytes_str(largest_free_extent()) +
           "; cause: " + cause;
  }

  // allocate()'s refusals, out of line like stale().
  [[gnu::noinline]] Error refuse(std::uint64_t bytes, StreamId stream) const {
    if (!status.ok()) return status.error();
    if (bytes == 0) {
      return make_error(ErrorCode::invalid_argument, "allocation of 0 bytes on stream " +
                                                         std::to_string(stream) + " (sizes must be > 0)");
    }
    return check_stream(stream, "allocation").error();
  }
  [[gnu::noinline]] Error too_large(std::uint64_t bytes, StreamId stream) {
    ++st.ooms;
    return make_error(ErrorCode::out_of_memory, diagnostic(bytes, stream));
  }

  // allocate() after a failed fit (`size`: the rounded request).
  [[gnu::noinline]] Result<DeviceHandle> survive_pressure(std::uint64_t bytes, std::uint64_t size, StreamId stream,
                                                          bool internal) {
    // I4: survive pressure before reporting it.
    ++st.reclaims;
    auto succeed = [&](std::uint32_t b) {
      ++st.ooms_survived;
      return bind_ordered(b, size, bytes, stream, internal);
    };
    // 1. Dispatch held commands, so held work can complete and release its leases.
    //    No pool lock while the backend works (queued unmaps are committed first,
    //    so their room does not wait for the flush).
    settle();
    Result<void> flushed;
    without_lock([&](bool) { flushed = backend.flush_all(); });
    if (!flushed.ok()) return std::move(flushed).error();
    // 2. Reuse frees whose work has completed; then, if other callers' maps are in
    //    flight, wait for them once: a map that fails gives its room back.
    retire_pending();
    if (const std::uint32_t b = fit(size); b != kNoFit) return succeed(b);
    settle();
    if (busy_granules * granule > unmapping_bytes) {
      await_driver();
      retire_pending();
      if (const std::uint32_t b = fit(size); b != kNoFit) return succeed(b);
    }
    // 3. Cached free memory is released by every fit as it needs the room
    //    (reference_granules), so no retry here could place differently.
    // 4. Wait (bounded) for in-flight frees, then retry.
    for (int round = 0; round < 2; ++round) {
      UseSet in_flight;
      for (std::uint32_t b : pending_multi) in_flight.merge(leases[b].uses);
      for (auto& list : pending_on)
        for (std::uint32_t b : list) in_flight.merge(leases[b].uses);
      if (in_flight.empty()) break;
      settle();
      Result<void> waited;  // waiting holds no lock another caller needs
      without_lock([&](bool) { waited = order.wait(in_flight); });
      retire_pending();
      if (const std::uint32_t b = fit(size); b != kNoFit) return succeed(b);
      if (!waited.ok()) break;
    }
    ++st.ooms;
    settle();
    check();
    return make_error(ErrorCode::out_of_memory, diagnostic(bytes, stream));
  }

  void check() const {
    if (options.validate_each_op) [[unlikely]] check_now();
  }
  [[gnu::noinline]] void check_now() const {
    detail::check_invariants(true, "DevicePool", [&](std::string* why) { return validate_locked(why); });
  }

  bool validate_locked(std::string* why) const {
    auto fail = [&](std::string what) {
      if (why) *why = std::move(what);
      return false;
    };
    std::uint64_t live = 0, requested = 0, pending = 0;
    std::vector<std::vector<std::uint32_t>> refs, pending_refs;
    for (const Region& r : regions) {
      std::string inner;
      if (!r.space.validate(&inner)) return fail("region allocator: " + inner);
      if (r.refs.size() != r.flags.size() || r.pending_refs.size() != r.flags.size())
        return fail("granule arrays disagree in length");
      refs.emplace_back(r.refs.size(), 0);
      pending_refs.emplace_back(r.refs.size(), 0);
    }
    if (leases.size() != blocks.size()) return fail("lease records and blocks disagree in number");
    std::vector<std::uint8_t> is_spare(blocks.size(), 0);
    for (std::uint32_t b : spare) {
      if (b >= blocks.size() || is_spare[b]++) return fail("spare record listed twice or out of range");
      if (blocks[b].state != BlockState::spare) return fail("a listed spare record holds a block");
    }
    std::vector<std::uint8_t> filed(blocks.size(), 0);
    for (std::size_t i = 0; i < pending_multi.size(); ++i) {
      const std::uint32_t b = pending_multi[i];
      ++filed[b];
      if (blocks[b].heap_pos != i) return fail("pending_multi position wrong");
      if (leases[b].uses.points().size() < 2) return fail("a block on pending_multi is leased on one stream");
      for (const StreamPoint& p : leases[b].uses.points())
        if (!((multi_streams >> p.stream) & 1u)) return fail("multi_streams misses a lease's stream");
    }
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      const auto& h = pending_on[s];
      for (std::size_t i = 0; i < h.size(); ++i) {
        const std::uint32_t b = h[i];
        ++filed[b];
        if (blocks[b].heap_pos != i) return fail("pending heap position wrong");
        if (i > 0 && earlier(b, h[(i - 1) / 2])) return fail("pending heap out of order");
        const auto points = leases[b].uses.points();
        if (points.size() != 1 || points[0].stream != s || points[0].ticket != leases[b].pending_key)
          return fail("block pending on one stream holds a lease on another, or its key is stale");
      }
      if (((pending_streams >> s) & 1u) != !h.empty()) return fail("pending_streams mask wrong");
    }
    std::uint64_t retired = 0;
    for (std::uint32_t b = 0; b < blocks.size(); ++b) {
      const Block& blk = blocks[b];
      if (blk.generation == 0) return fail("slot generation 0");
      if (blk.state == BlockState::spare && !is_spare[b]) return fail("a spare record is not listed");
      if (blk.state == BlockState::retired) ++retired;
      if (!has_block(blk)) {
        if (filed[b]) return fail("a record without a block is on a pending list");
        if (blk.leased || blk.ready_set || !leases[b].uses.empty())
          return fail("a record without a block keeps its leases");
        continue;
      }
      const Region& r = regions[blk.region];
      if (blk.slot_retired && (blk.state != BlockState::pending || blk.generation != kLastGeneration))
        return fail("a slot retires with a block that is not pending at the last generation");
      if (!blk.leased && !leases[b].uses.empty()) return fail("a block not marked leased holds a lease");
      if (!blk.ready_set && leases[b].ready_after != StreamPoint{}) return fail("a ready point is set unmarked");
      if (blk.state == BlockState::live) {
        if (blk.node >= r.space.node_count() || !r.space.is_used(blk.node) ||
            r.base + r.space.offset_of(blk.node) * kAlign != blk.addr)
          return fail("block disagrees with its allocator node");
        if (leases[b].pending_size != 0) return fail("a live block keeps a pending size");
      }
      const std::uint64_t size = block_size(b);
      if (blk.addr % kAlign || size % kAlign || size == 0) return fail("misaligned block");
      if (blk.state == BlockState::live) {
        if (filed[b]) return fail("live block is on a pending list");
        live += size;
        requested += blk.requested;
      } else {
        if (filed[b] != 1) return fail("pending block not filed exactly once");
        if (leases[b].uses.empty()) return fail("pending block has no open lease");
        if (blk.node != detail::OffsetAllocator::kNone) return fail("a pending block holds an allocator node");
        auto at = r.pending_at.find(blk.addr);
        if (at == r.pending_at.end() || at->second != b) return fail("a pending block is not in the address index");
        pending += size;
      }
      auto [first, last] = granule_span(r, blk.addr, size);
      if (last >= r.refs.size()) return fail("a block lies beyond the granule arrays");
      auto& counts = blk.state == BlockState::live ? refs : pending_refs;
      for (std::uint64_t g = first; g <= last; ++g) ++counts[blk.region][g];
    }
    for (const Mapping& m : mapping) {  // a placement being mapped holds references, no block yet
      auto [first, last] = granule_span(regions[m.region], m.addr, m.size);
      for (std::uint64_t g = first; g <= last; ++g) ++refs[m.region][g];
    }
    // Pending blocks are disjoint from each other and from every live block: a
    // live block's range overlapping one would mean placement skipped inheriting it.
    std::uint64_t indexed = 0;
    for (const Region& r : regions) {
      std::uint64_t end = 0;
      for (const auto& [addr, b] : r.pending_at) {
        if (b >= blocks.size() || blocks[b].state != BlockState::pending || blocks[b].addr != addr)
          return fail("address index is stale");
        if (addr < end) return fail("two pending blocks overlap");
        end = addr + leases[b].pending_size;
        ++indexed;
      }
    }
    for (std::uint32_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b].state != BlockState::live) continue;
      const auto& index = regions[blocks[b].region].pending_at;
      auto it = index.lower_bound(blocks[b].addr + size_of(blocks[b]));
      if (it != index.begin() && std::prev(it)->first + leases[std::prev(it)->second].pending_size > blocks[b].addr)
        return fail("a live block overlaps a pending one");
    }
    std::uint64_t pending_blocks = pending_multi.size();
    for (const auto& h : pending_on) pending_blocks += h.size();
    if (indexed != pending_blocks) return fail("address index and pending lists disagree");
    // live + pending_free <= reserved <= capacity
    if (live != st.allocated_bytes) return fail("allocated_bytes disagrees with live blocks");
    if (requested != st.requested_bytes) return fail("requested_bytes disagrees with live blocks");
    if (pending != st.pending_free_bytes) return fail("pending_free_bytes disagrees with pending blocks");
    std::uint64_t mapped = 0, cached = 0, busy = 0, unmapping = 0;
    for (std::size_t ri = 0; ri < regions.size(); ++ri) {
      const Region& r = regions[ri];
      std::uint64_t listed = 0;
      for (std::uint64_t g = 0; g < r.refs.size(); ++g) {
        const bool is_mapped = r.flags[g] & kMapped;
        if (r.refs[g] != refs[ri][g]) return fail("granule reference count wrong");
        if (r.pending_refs[g] != pending_refs[ri][g]) return fail("granule pending reference count wrong");
        if (r.in_use(g) && !is_mapped) return fail("a block touches an unmapped granule");
        if ((r.flags[g] & kFresh) && !(r.flags[g] & kBusy)) return fail("a granule is left marked fresh");
        if (r.flags[g] & kBusy) {
          ++busy;
          if (!is_mapped) unmapping += granule;
          if (is_mapped != r.in_use(g)) return fail("a busy granule is unmapped in use, or mapped for nobody");
        }
        if (r.flags[g] & kListed) ++listed;
        if (is_mapped) mapped += granule;
        if (is_mapped && !r.in_use(g)) {
          cached += granule;
          if (!(r.flags[g] & kListed)) return fail("a cached granule is not on the cached list");
        }
      }
      if (listed != r.cached_list.size()) return fail("cached list and listed flags disagree");
    }
    if (mapped != st.reserved_bytes) return fail("reserved_bytes disagrees with mapped granules");
    if (busy != busy_granules || unmapping != unmapping_bytes)
      return fail("busy granule counts disagree with the busy flags");
    for (const Unmap& u : queued)
      if ((regions[u.region].flags[u.granule] & (kBusy | kMapped)) != kBusy) return fail("a queued unmap is not busy");
    if (cached != st.cached_bytes) return fail("cached_bytes disagrees with unused mapped granules");
    if (st.reserved_bytes > capacity) return fail("reserved exceeds capacity");
    if (retired != retired_slots) return fail("retired slot count wrong");
    return true;
  }

  [[gnu::always_inline]] Result<DeviceHandle> allocate(std::uint64_t bytes, StreamId stream, bool internal) {
    if (!status.ok() || bytes == 0 || stream >= kMaxStreams) [[unlikely]] return refuse(bytes, stream);
    std::lock_guard lock(mu);
    if (bytes > capacity) [[unlikely]] return too_large(bytes, stream);
    const std::uint64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
    retire_pending();
    std::uint32_t b = try_fit(size);
    if (b < kRetry) [[likely]] return bind_ordered(b, size, bytes, stream, internal);
    b = fit_again(size, b);
    if (b != kNoFit) return bind_ordered(b, size, bytes, stream, internal);
    return survive_pressure(bytes, size, stream, internal);
  }
};

DevicePool::DevicePool(StreamOrder& order, PoolOptions options)
    : impl_(std::make_unique<Impl>(order, options)) {}

DevicePool::~DevicePool() = default;

const Result<void>& DevicePool::status() const noexcept { return impl_->status; }
std::uint64_t DevicePool::capacity() const noexcept { return impl_->capacity; }
StreamOrder& DevicePool::order() noexcept { return impl_->order; }

Result<DeviceHandle> DevicePool::allocate(std::uint64_t bytes, StreamId stream) {
  FERRY_TRY(refuse_inside_user_kernel("allocate"));
  return impl_->allocate(bytes, stream, false);
}

Result<DeviceHandle> DevicePool::allocate_internal(std::uint64_t bytes, StreamId stream) {
  return impl_->allocate(bytes, stream, true);
}

Result<void> DevicePool::free(DeviceHandle handle) {
  FERRY_TRY(refuse_inside_user_kernel("free"));
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  const std::uint32_t b = p.find_block(handle);
  if (b == kNoBlock) return p.stale(handle);
  p.release_handle(b);
  if (!p.queued.empty()) [[unlikely]] p.settle();
  // A free moves bytes from live to pending or releases them: no peak can rise.
  p.check();
  return {};
}

Result<DeviceSpan> DevicePool::resolve(DeviceHandle handle) const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  return DeviceSpan{p.blocks[*b].addr, p.blocks[*b].requested};
}

Result<void> DevicePool::set_tag(DeviceHandle handle, std::string_view tag) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  p.backend.note_block(p.blocks[*b].addr, p.size_of(p.blocks[*b]), handle, tag);
  return {};
}

Result<DeviceSpan> DevicePool::lease(DeviceHandle handle, StreamPoint point) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  Impl::Block& blk = p.blocks[*b];
  // I2: the block stays this operation's until `point` completes.
  blk.leased = true;
  p.leases[*b].uses.add(point);
  return DeviceSpan{blk.addr, blk.requested};
}

Result<void> DevicePool::make_ready(DeviceHandle handle, StreamId stream) {
  StreamPoint after;
  {
    std::lock_guard lock(impl_->mu);
    Result<std::uint32_t> b = impl_->find(handle);
    if (!b.ok()) return std::move(b).error();
    if (impl_->blocks[*b].ready_set) after = impl_->leases[*b].ready_after;
  }
  Result<Ticket> t = impl_->order_after(stream, after);
  if (!t.ok()) return std::move(t).error();
  return {};
}

Result<void> DevicePool::trim() {
  FERRY_TRY(refuse_inside_user_kernel("trim"));
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  ++p.st.reclaims;
  p.retire_pending();
  p.unmap_unused(/*all=*/true);
  p.settle();
  p.check();
  return {};
}

// Reads retire the frees whose work completed first, so an idle device shows no
// pending free (retiring never blocks; the pool is logically unchanged).
PoolStats DevicePool::stats() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  p.st.active_bytes = p.st.allocated_bytes + p.st.pending_free_bytes;
  return p.st;
}

void DevicePool::reset_peak_stats() {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.note_peaks();  // active_bytes current before it becomes the peak
  p.st.peak_allocated_bytes = p.st.allocated_bytes;
  p.st.peak_requested_bytes = p.st.requested_bytes;
  p.st.peak_reserved_bytes = p.st.reserved_bytes;
  p.st.peak_active_bytes = p.st.active_bytes;
  p.check();
}

std::uint64_t DevicePool::largest_free_extent() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  return p.largest_free_extent();
}

std::vector<BlockInfo> DevicePool::snapshot() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  std::vector<BlockInfo> out;
  for (const Impl::Block& blk : p.blocks) {
    if (!Impl::has_block(blk)) continue;
    const auto b = static_cast<std::uint32_t>(&blk - p.blocks.data());
    out.push_back(BlockInfo{blk.addr, p.block_size(b),
                            blk.state == Impl::BlockState::live ? BlockInfo::State::live
                                                                : BlockInfo::State::pending_free,
                            blk.stream});
  }
  std::sort(out.begin(), out.end(), [](const BlockInfo& a, const BlockInfo& b) { return a.addr < b.addr; });
  return out;
}

std::vector<LiveBlock> DevicePool::live_blocks() const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  std::vector<LiveBlock> out;
  for (std::size_t b = 0; b < p.blocks.size(); ++b) {
    const Impl::Block& blk = p.blocks[b];
    if (blk.state != Impl::BlockState::live) continue;
    out.push_back(LiveBlock{DeviceHandle{p.id, static_cast<std::uint32_t>(b), blk.generation}, blk.requested,
                            blk.stream});
  }
  return out;
}

std::vector<SegmentInfo> DevicePool::segments() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  p.retire_pending();
  p.settle();
  std::vector<SegmentInfo> out;
  for (std::size_t ri = 0; ri < p.regions.size(); ++ri) {
    const Impl::Region& r = p.regions[ri];
    SegmentInfo seg;
    seg.kind = p.regions.size() == 1 ? SegmentInfo::Kind::shared
               : ri == 0             ? SegmentInfo::Kind::small
                                     : SegmentInfo::Kind::large;
    seg.base = r.base;
    seg.bytes = r.bytes;
    seg.granule = p.granule;
    // Adjacent granules in the same state extend the last run.
    auto extend = [&](std::vector<DeviceRange>& runs, std::uint64_t addr) {
      if (!runs.empty() && runs.back().addr + runs.back().bytes == addr) {
        runs.back().bytes += p.granule;
      } else {
        runs.push_back(DeviceRange{addr, p.granule});
      }
    };
    for (std::uint64_t g = 0; g < r.flags.size(); ++g) {
      if (!(r.flags[g] & Impl::kMapped)) continue;
      const std::uint64_t addr = r.base + g * p.granule;
      extend(seg.mapped, addr);
      seg.mapped_bytes += p.granule;
      if (!r.in_use(g)) {
        extend(seg.cached, addr);
        seg.cached_bytes += p.granule;
      }
    }
    out.push_back(std::move(seg));
  }
  std::sort(out.begin(), out.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.base < b.base; });
  return out;
}

bool detail::PoolTestAccess::set_free_slot_generation(DevicePool& pool, std::uint32_t slot,
                                                      std::uint32_t generation) {
  DevicePool::Impl& p = *pool.impl_;
  std::lock_guard lock(p.mu);
  if (slot >= p.blocks.size() || p.blocks[slot].state != DevicePool::Impl::BlockState::spare || generation == 0) return false;
  p.blocks[slot].generation = generation;
  return true;
}

// Without the pool lock: a test must see a waiter even when a broken pool holds it.
std::uint32_t detail::PoolTestAccess::driver_waiters(const DevicePool& pool) {
  return pool.impl_->driver_waiters.load(std::memory_order_relaxed);
}

bool DevicePool::validate(std::string* why) const {
  std::lock_guard lock(impl_->mu);
  return impl_->validate_locked(why);
}

// --- convenience enqueues ------------------------------------------------------

Result<Ticket> enqueue_fill(DevicePool& pool, StreamId stream, DeviceHandle dst, std::uint64_t seed,
                            Pattern pattern) {
  FERRY_TRY(pool.make_ready(dst, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    Result<DeviceSpan> d = pool.lease(dst, {stream, t});
    if (!d.ok()) return std::move(d).error();
    return Op{FillOp{{d->addr, d->bytes}, seed, pattern}};
  });
}

Result<Ticket> enqueue_compute(DevicePool& pool, StreamId stream, std::span<const DeviceHandle> inputs,
                               DeviceHandle output, double flops, std::uint64_t mem_bytes,
                               Pattern pattern) {
  for (DeviceHandle h : inputs) FERRY_TRY(pool.make_ready(h, stream));
  FERRY_TRY(pool.make_ready(output, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    ComputeOp op;
    op.flops = flops;
    op.mem_bytes = mem_bytes;
    op.pattern = pattern;
    for (DeviceHandle h : inputs) {
      Result<DeviceSpan> s = pool.lease(h, {stream, t});
      if (!s.ok()) return std::move(s).error();
      op.inputs.push_back({s->addr, s->bytes});
    }
    Result<DeviceSpan> o = pool.lease(output, {stream, t});
    if (!o.ok()) return std::move(o).error();
    op.output = {o->addr, o->bytes};
    return Op{std::move(op)};
  });
}

Result<Ticket> enqueue_copy_to_host(DevicePool& pool, StreamId stream, DeviceHandle src,
                                    std::span<std::byte> dst) {
  FERRY_TRY(pool.make_ready(src, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    Result<DeviceSpan> r = pool.resolve(src);
    if (!r.ok()) return std::move(r).error();
    if (dst.size() < r->bytes) {
      return make_error(ErrorCode::invalid_argument,
                        "copy to host: destination holds " + std::to_string(dst.size()) +
                            " B, the block " + std::to_string(r->bytes) + " B");
    }
    Result<DeviceSpan> s = pool.lease(src, {stream, t});
    if (!s.ok()) return std::move(s).error();
    return Op{CopyToHostOp{dst.data(), {s->addr, s->bytes}}};
  });
}

Result<Ticket> enqueue_copy_to_host(DevicePool& pool, StreamId stream, DeviceHandle src,
                                    std::uint64_t offset, std::span<std::byte> dst) {
  FERRY_TRY(pool.make_ready(src, stream));
  return pool.order().submit(stream, [&](Ticket t) -> Result<Op> {
    Result<DeviceSpan> r = pool.resolve(src);
    if (!r.ok()) return std::move(r).error();
    if (offset > r->bytes || dst.size() > r->bytes - offset) {
      return make_error(ErrorCode::invalid_argument,
                        "copy to host: bytes [" + std::to_string(offset) + ", +" + std::to_string(dst.size()) +
                            ") lie outside the block of " + std::to_string(r->bytes) + " B");
    }
    Result<DeviceSpan> s = pool.lease(src, {stream, t});
    if (!s.ok()) return std::move(s).error();
    return Op{CopyToHostOp{dst.data(), {s->addr + offset, dst.size()}}};
  });
}

}  // namespace ferry
