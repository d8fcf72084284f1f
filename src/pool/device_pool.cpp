#include "ferry/device_pool.hpp"

#include <algorithm>
#include <bit>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <mutex>
#include <optional>
#include <utility>

#include "core/invariant.hpp"
#include "core/offset_allocator.hpp"
#include "core/testing_hooks.hpp"
#include "core/text.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kAlign = 256;  // every block starts and ends on this
constexpr std::uint32_t kNoBlock = UINT32_MAX;
std::atomic<std::uint32_t> next_pool_id{1};

std::string bytes_str(std::uint64_t b) { return text::human_bytes(b, 2); }

}  // namespace

struct DevicePool::Impl {
  enum class BlockState : std::uint8_t { live, pending };

  struct Block {
    std::uint8_t region = 0;
    std::uint32_t node = detail::OffsetAllocator::kNone;
    std::uint64_t addr = 0;
    std::uint64_t size = 0;       // rounded to kAlign
    std::uint64_t requested = 0;  // as asked (live blocks)
    StreamId stream = 0;
    BlockState state = BlockState::live;
    std::uint32_t slot = kNoBlock;
    UseSet uses;                  // leases of enqueued work on this block (I2)
    // Set when the block was reused on its stream while older work there still
    // touches it: other streams must wait for this point before using it (I3).
    StreamPoint ready_after{};
  };

  struct Slot {
    std::uint32_t generation = 1;  // never 0, so {pool,slot,0} never resolves
    std::uint32_t block = kNoBlock;  // kNoBlock while the slot is free
  };

  // One reserved address range, carved by an offset allocator; physical granules
  // are mapped under it on demand.
  //   granule g is mapped  <=>  refs[g] > 0  or  it is cached
  struct Region {
    std::uint64_t base = 0;
    std::uint64_t bytes = 0;
    detail::OffsetAllocator space;
    std::vector<std::uint32_t> refs;  // blocks (live or pending) touching each granule
    std::vector<std::uint8_t> mapped;
    Region(std::uint64_t b, std::uint64_t n, std::uint64_t granule)
        : base(b), bytes(n), space(n / kAlign), refs(n / granule, 0), mapped(n / granule, 0) {}
  };

  StreamOrder& order;
  Backend& backend;
  PoolOptions options;
  std::uint32_t id;
  std::uint64_t granule;
  unsigned granule_shift = 0;
  std::uint64_t capacity;
  Result<void> status;

  mutable std::mutex mu;  // guards everything below; never held across a wait
  std::vector<Region> regions;  // [0] small, [1] large (one region without VMM)
  std::vector<Block> blocks;
  std::vector<std::uint32_t> spare_blocks;
  std::vector<Slot> slots;  // I1: a slot index never moves or gets renumbered
  std::vector<std::uint32_t> spare_slots;
  // Freed blocks whose leases have not retired. pending_on[s]: every open lease is
  // on stream s, so later work on s may reuse them at once (I3).
  std::array<std::vector<std::uint32_t>, kMaxStreams> pending_on;
  std::vector<std::uint32_t> pending_multi;  // leases on several streams
  std::uint64_t pending_streams = 0;  // bit s set  <=>  !pending_on[s].empty()
  PoolStats st;

  Impl(StreamOrder& o, PoolOptions opt)
      : order(o), backend(o.backend()), options(opt), id(next_pool_id.fetch_add(1)) {
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
    // With virtual memory, address space is cheap: the large range has room
    // for fragmentation, because only mapped granules cost memory.
    std::vector<std::uint64_t> sizes;
    if (info.virtual_memory) sizes = {capacity, capacity * 4};
    else sizes = {capacity};
    for (std::uint64_t bytes : sizes) {
      Result<std::uint64_t> base = backend.reserve_address(bytes);
      if (!base.ok()) {
        status = make_error(base.error().code,
                            "pool could not reserve " + bytes_str(bytes) + " of address space: " +
                                base.error().message);
        return;
      }
      regions.emplace_back(*base, bytes, granule);
    }
  }

  ~Impl() {
    // I2 holds at teardown too: nothing is unmapped while enqueued work may
    // still touch it (bounded waits; a failed wait cannot be reported here).
    UseSet in_flight;
    std::vector<std::uint8_t> spare(blocks.size(), 0);
    for (std::uint32_t b : spare_blocks) spare[b] = 1;
    for (std::uint32_t b = 0; b < blocks.size(); ++b)
      if (!spare[b]) in_flight.merge(blocks[b].uses);
    (void)order.wait(in_flight);
    for (Region& r : regions) {
      unmap_unused(r, /*all=*/true);
      for (std::uint64_t g = 0; g < r.mapped.size(); ++g) {
        if (r.mapped[g]) (void)backend.unmap(r.base + g * granule, granule);
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

  // --- granules -------------------------------------------------------------

  std::pair<std::uint64_t, std::uint64_t> granule_span(const Region& r, std::uint64_t addr,
                                                       std::uint64_t size) const {
    // granule is a power of two; shifts keep divisions off the hot path.
    const std::uint64_t first = (addr - r.base) >> granule_shift;
    const std::uint64_t last = (addr - r.base + size - 1) >> granule_shift;
    return {first, last};
  }

  // Takes references on the granules under [addr, addr+size), mapping the ones
  // that are not mapped. All or nothing: on failure nothing changed.
  Result<void> reference_granules(Region& r, std::uint64_t addr, std::uint64_t size) {
    auto [first, last] = granule_span(r, addr, size);
    std::uint64_t need = 0;
    for (std::uint64_t g = first; g <= last; ++g) need += r.mapped[g] ? 0 : granule;
    if (st.reserved_bytes + need > capacity) {
      return make_error(ErrorCode::out_of_memory, "physical capacity exhausted");
    }
    // Map runs of unmapped granules with one call each.
    for (std::uint64_t g = first; g <= last;) {
      if (r.mapped[g]) { ++g; continue; }
      std::uint64_t end = g;
      while (end <= last && !r.mapped[end]) ++end;
      Result<void> m = backend.map(r.base + g * granule, (end - g) * granule);
      if (!m.ok()) {
        rollback_new_maps(r, first, g);  // all or nothing
        return m;
      }
      ++st.maps;
      for (std::uint64_t u = g; u < end; ++u) r.mapped[u] = 2;  // 2: mapped by this call
      g = end;
    }
    for (std::uint64_t g = first; g <= last; ++g) {
      if (r.mapped[g] == 2) {
        r.mapped[g] = 1;
        st.reserved_bytes += granule;
      } else if (r.refs[g] == 0) {
        st.cached_bytes -= granule;  // a cached granule is back in use
      }
      ++r.refs[g];
    }
    note_peaks();
    return {};
  }
  void rollback_new_maps(Region& r, std::uint64_t first, std::uint64_t end) {
    for (std::uint64_t u = first; u < end; ++u) {
      if (r.mapped[u] == 2) {
        (void)backend.unmap(r.base + u * granule, granule);
        r.mapped[u] = 0;
      }
    }
  }

  // Drops references; granules nobody touches become cached, and cached memory
  // beyond the release threshold is unmapped. Only called for blocks whose
  // leases have all retired, so unmapping here never races queued work (I2).
  void release_granules(Region& r, std::uint64_t addr, std::uint64_t size) {
    auto [first, last] = granule_span(r, addr, size);
    for (std::uint64_t g = first; g <= last; ++g) {
      if (--r.refs[g] == 0) st.cached_bytes += granule;
    }
    if (st.cached_bytes > options.release_threshold) {
      for (std::uint64_t g = first; g <= last && st.cached_bytes > options.release_threshold; ++g) {
        if (r.refs[g] == 0 && r.mapped[g]) unmap_granule(r, g);
      }
    }
  }

  void unmap_granule(Region& r, std::uint64_t g) {
    if (backend.unmap(r.base + g * granule, granule).ok()) {
      r.mapped[g] = 0;
      st.reserved_bytes -= granule;
      st.cached_bytes -= granule;
      ++st.unmaps;
    }
  }

  // Unmaps every mapped granule that no block touches (or, unless `all`, only
  // down to the release threshold).
  void unmap_unused(Region& r, bool all) {
    for (std::uint64_t g = 0; g < r.mapped.size(); ++g) {
      if (!all && st.cached_bytes <= options.release_threshold) return;
      if (r.mapped[g] && r.refs[g] == 0) unmap_granule(r, g);
    }
  }

  // --- blocks ---------------------------------------------------------------

  std::uint32_t new_block() {
    if (!spare_blocks.empty()) {
      const std::uint32_t b = spare_blocks.back();
      spare_blocks.pop_back();
      blocks[b] = Block{};
      return b;
    }
    blocks.emplace_back();
    return static_cast<std::uint32_t>(blocks.size() - 1);
  }

  // Returns a block whose leases have all retired to the free space.
  void release_block(std::uint32_t b) {
    Block& blk = blocks[b];
    Region& r = regions[blk.region];
    release_granules(r, blk.addr, blk.size);
    r.space.free(blk.node);
    blk.node = detail::OffsetAllocator::kNone;
    spare_blocks.push_back(b);
  }

  // Files a freed block by its open leases: free now, pending on one stream, or
  // pending on several.
  void file_freed(std::uint32_t b) {
    Block& blk = blocks[b];
    if (blk.uses.retire(order)) {
      release_block(b);
      return;
    }
    blk.state = BlockState::pending;
    st.pending_free_bytes += blk.size;
    if (auto s = blk.uses.single_stream()) push_pending(*s, b);
    else pending_multi.push_back(b);
  }

  // Moves pending blocks whose leases retired back to the free space.
  void retire_pending() {
    auto sweep = [&](std::vector<std::uint32_t>& list, std::optional<StreamId> owner) {
      for (std::size_t i = 0; i < list.size();) {
        const std::uint32_t b = list[i];
        Block& blk = blocks[b];
        if (blk.uses.retire(order)) {
          st.pending_free_bytes -= blk.size;
          list[i] = list.back();
          list.pop_back();
          release_block(b);
          continue;
        }
        // A multi-stream block whose remaining leases narrowed to one stream
        // becomes reusable in that stream's order.
        if (!owner) {
          if (auto s = blk.uses.single_stream()) {
            list[i] = list.back();
            list.pop_back();
            push_pending(*s, b);
            continue;
          }
        }
        ++i;
      }
    };
    if (!pending_multi.empty()) sweep(pending_multi, std::nullopt);
    for (std::uint64_t mask = pending_streams; mask != 0; mask &= mask - 1) {
      const auto s = static_cast<StreamId>(std::countr_zero(mask));
      sweep(pending_on[s], s);
      if (pending_on[s].empty()) pending_streams &= ~(std::uint64_t{1} << s);
    }
    // active_bytes follows pending_free_bytes, which the sweep lowered.
    note_peaks();
  }

  void push_pending(StreamId s, std::uint32_t b) {
    pending_on[s].push_back(b);
    pending_streams |= std::uint64_t{1} << s;
  }

  // Stream-ordered reuse: a block freed with open leases on `stream` only may
  // serve later work on that stream at once; the FIFO orders it after them (I3).
  std::optional<std::uint32_t> reuse_on_stream(std::uint64_t size, StreamId stream) {
    auto& list = pending_on[stream];
    if (list.empty()) return std::nullopt;
    std::size_t best = list.size();
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::uint64_t s = blocks[list[i]].size;
      if (s >= size && (best == list.size() || s < blocks[list[best]].size)) best = i;
    }
    if (best == list.size()) return std::nullopt;
    const std::uint32_t b = list[best];
    list[best] = list.back();
    list.pop_back();
    if (list.empty()) pending_streams &= ~(std::uint64_t{1} << stream);
    Block& blk = blocks[b];
    st.pending_free_bytes -= blk.size;
    if (blk.size > size) {
      // The tail stays pending under the same leases.
      Region& r = regions[blk.region];
      const std::uint32_t tail_node = r.space.split(blk.node, size / kAlign);
      const std::uint32_t t = new_block();
      Block& tail = blocks[t];
      Block& head = blocks[b];
      tail.region = head.region;
      tail.node = tail_node;
      tail.addr = head.addr + size;
      tail.size = head.size - size;
      tail.stream = head.stream;
      tail.state = BlockState::pending;
      tail.uses = head.uses;
      head.size = size;
      // Both halves now touch the granule they share.
      auto [hf, hl] = granule_span(r, head.addr, head.size);
      auto [tf, tl] = granule_span(r, tail.addr, tail.size);
      (void)hf;
      (void)tl;
      if (hl == tf) ++r.refs[hl];
      st.pending_free_bytes += tail.size;
      push_pending(stream, t);
    }
    ++st.same_stream_reuses;
    // The new owner inherits the old leases: they name work still queued on it.
    blocks[b].ready_after = {stream, 0};
    for (const StreamPoint& p : blocks[b].uses.points())
      blocks[b].ready_after.ticket = std::max(blocks[b].ready_after.ticket, p.ticket);
    return b;
  }

  std::optional<std::uint32_t> fit_fresh(std::uint64_t size) {
    const std::uint8_t ri = (regions.size() > 1 && size > options.small_limit) ? 1 : 0;
    Region& r = regions[ri];
    auto a = r.space.allocate(size / kAlign);
    if (!a) return std::nullopt;
    const std::uint64_t addr = r.base + a->offset * kAlign;
    if (!reference_granules(r, addr, size).ok()) {
      r.space.free(a->node);
      return std::nullopt;
    }
    const std::uint32_t b = new_block();
    Block& blk = blocks[b];
    blk.region = ri;
    blk.node = a->node;
    blk.addr = addr;
    blk.size = size;
    return b;
  }

  std::uint64_t unmapped_bytes_under(const Region& r, std::uint64_t addr, std::uint64_t size) const {
    auto [first, last] = granule_span(r, addr, size);
    std::uint64_t need = 0;
    for (std::uint64_t g = first; g <= last; ++g) need += r.mapped[g] ? 0 : granule;
    return need;
  }

  // The slow path when the quick fit runs out of physical memory: place the
  // block where it needs the fewest granules mapped (inside partly used ones),
  // in either region. Scans every free extent, so it runs only under pressure.
  std::optional<std::uint32_t> fit_tight(std::uint64_t size) {
    struct Best {
      std::uint8_t region = 0;
      std::uint32_t node = detail::OffsetAllocator::kNone;
      std::uint64_t offset = 0;  // units
      std::uint64_t need = UINT64_MAX;
    } best;
    const std::uint64_t units = size / kAlign;
    for (std::uint8_t ri = 0; ri < regions.size(); ++ri) {
      const Region& r = regions[ri];
      r.space.for_each_free([&](std::uint32_t node, std::uint64_t off, std::uint64_t n) {
        if (n < units || best.need == 0) return;
        for (std::uint64_t at : {off, off + n - units}) {
          const std::uint64_t need = unmapped_bytes_under(r, r.base + at * kAlign, size);
          if (need < best.need) best = {ri, node, at, need};
        }
      });
    }
    if (best.node == detail::OffsetAllocator::kNone ||
        st.reserved_bytes + best.need > capacity) {
      return std::nullopt;
    }
    Region& r = regions[best.region];
    const auto a = r.space.allocate_range(best.node, best.offset, units);
    const std::uint64_t addr = r.base + a.offset * kAlign;
    if (!reference_granules(r, addr, size).ok()) {
      r.space.free(a.node);
      return std::nullopt;
    }
    const std::uint32_t b = new_block();
    blocks[b] = Block{};
    blocks[b].region = best.region;
    blocks[b].node = a.node;
    blocks[b].addr = addr;
    blocks[b].size = size;
    ++st.tight_fits;
    return b;
  }

  std::optional<std::uint32_t> try_fit(std::uint64_t size, StreamId stream) {
    if (auto b = reuse_on_stream(size, stream)) return b;
    if (auto b = fit_fresh(size)) return b;
    return fit_tight(size);
  }

  DeviceHandle bind(std::uint32_t b, std::uint64_t requested, StreamId stream) {
    std::uint32_t slot;
    if (!spare_slots.empty()) {
      slot = spare_slots.back();
      spare_slots.pop_back();
    } else {
      slots.emplace_back();
      slot = static_cast<std::uint32_t>(slots.size() - 1);
    }
    Block& blk = blocks[b];
    blk.state = BlockState::live;
    blk.requested = requested;
    blk.stream = stream;
    blk.slot = slot;
    slots[slot].block = b;
    st.allocated_bytes += blk.size;
    st.requested_bytes += requested;
    ++st.allocs;
    note_peaks();
    return DeviceHandle{id, slot, slots[slot].generation};
  }

  Result<std::uint32_t> find(DeviceHandle h) const {
    if (h.pool != id) {
      return make_error(ErrorCode::stale_handle,
                        "handle {pool " + std::to_string(h.pool) + ", slot " + std::to_string(h.slot) +
                            "} belongs to another pool (this is pool " + std::to_string(id) + ")");
    }
    if (h.slot >= slots.size() || slots[h.slot].generation != h.generation ||
        slots[h.slot].block == kNoBlock) {
      return make_error(ErrorCode::stale_handle,
                        "handle {slot " + std::to_string(h.slot) + ", generation " +
                            std::to_string(h.generation) + "} is stale: " +
                            (h.slot >= slots.size()
                                 ? std::string("no such slot")
                                 : "slot is at generation " + std::to_string(slots[h.slot].generation) +
                                       (slots[h.slot].block == kNoBlock ? " and free" : "")));
    }
    return slots[h.slot].block;
  }

  std::uint64_t largest_free_extent() const {
    std::uint64_t best = 0;
    for (const Region& r : regions) best = std::max(best, r.space.largest_free() * kAlign);
    return std::min(best, capacity - st.reserved_bytes + st.cached_bytes + granule);
  }

  std::string diagnostic(std::uint64_t bytes, StreamId stream) const {
    return "out of memory: request of " + bytes_str(bytes) + " (" + std::to_string(bytes) +
           " B) on stream " + std::to_string(stream) + "; capacity " + bytes_str(capacity) +
           ", reserved " + bytes_str(st.reserved_bytes) + ", live " + bytes_str(st.allocated_bytes) +
           ", pending-free " + bytes_str(st.pending_free_bytes) + ", cached " +
           bytes_str(st.cached_bytes) + ", largest free extent " + bytes_str(largest_free_extent());
  }

  void check() const {
    detail::check_invariants(options.validate_each_op, "DevicePool",
                             [&](std::string* why) { return validate_locked(why); });
  }

  bool validate_locked(std::string* why) const {
    auto fail = [&](std::string what) {
      if (why) *why = std::move(what);
      return false;
    };
    std::uint64_t live = 0, requested = 0, pending = 0;
    std::vector<std::vector<std::uint32_t>> refs;
    for (const Region& r : regions) {
      std::string inner;
      if (!r.space.validate(&inner)) return fail("region allocator: " + inner);
      refs.emplace_back(r.refs.size(), 0);
    }
    std::vector<std::uint8_t> is_spare(blocks.size(), 0);
    for (std::uint32_t b : spare_blocks) is_spare[b] = 1;
    std::vector<std::uint8_t> filed(blocks.size(), 0);
    for (std::uint32_t b : pending_multi) ++filed[b];
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      for (std::uint32_t b : pending_on[s]) {
        ++filed[b];
        for (const StreamPoint& p : blocks[b].uses.points())
          if (p.stream != s) return fail("block pending on one stream holds a lease on another");
      }
    }
    for (StreamId s = 0; s < kMaxStreams; ++s) {
      if (((pending_streams >> s) & 1u) != !pending_on[s].empty()) return fail("pending_streams mask wrong");
    }
    for (std::uint32_t b = 0; b < blocks.size(); ++b) {
      if (is_spare[b]) continue;
      const Block& blk = blocks[b];
      const Region& r = regions[blk.region];
      if (blk.addr % kAlign || blk.size % kAlign || blk.size == 0) return fail("misaligned block");
      if (r.base + r.space.offset_of(blk.node) * kAlign != blk.addr ||
          r.space.size_of(blk.node) * kAlign != blk.size)
        return fail("block disagrees with its allocator node");
      if (blk.state == BlockState::live) {
        if (blk.slot >= slots.size() || slots[blk.slot].block != b) return fail("live block's slot does not point back");
        if (filed[b]) return fail("live block is on a pending list");
        live += blk.size;
        requested += blk.requested;
      } else {
        if (filed[b] != 1) return fail("pending block not filed exactly once");
        if (blk.uses.empty()) return fail("pending block has no open lease");
        pending += blk.size;
      }
      auto [first, last] = granule_span(r, blk.addr, blk.size);
      for (std::uint64_t g = first; g <= last; ++g) ++refs[blk.region][g];
    }
    // live + pending_free <= reserved <= capacity
    if (live != st.allocated_bytes) return fail("allocated_bytes disagrees with live blocks");
    if (requested != st.requested_bytes) return fail("requested_bytes disagrees with live blocks");
    if (pending != st.pending_free_bytes) return fail("pending_free_bytes disagrees with pending blocks");
    std::uint64_t mapped = 0, cached = 0;
    for (std::size_t ri = 0; ri < regions.size(); ++ri) {
      const Region& r = regions[ri];
      for (std::uint64_t g = 0; g < r.refs.size(); ++g) {
        if (r.refs[g] != refs[ri][g]) return fail("granule reference count wrong");
        if (r.refs[g] > 0 && !r.mapped[g]) return fail("a block touches an unmapped granule");
        if (r.mapped[g]) mapped += granule;
        if (r.mapped[g] && r.refs[g] == 0) cached += granule;
      }
    }
    if (mapped != st.reserved_bytes) return fail("reserved_bytes disagrees with mapped granules");
    if (cached != st.cached_bytes) return fail("cached_bytes disagrees with unused mapped granules");
    if (st.reserved_bytes > capacity) return fail("reserved exceeds capacity");
    for (std::uint32_t s = 0; s < slots.size(); ++s) {
      if (slots[s].generation == 0) return fail("slot generation 0");
      if (slots[s].block != kNoBlock && (slots[s].block >= blocks.size() || blocks[slots[s].block].slot != s))
        return fail("slot points at a block that is not its own");
    }
    return true;
  }
};

DevicePool::DevicePool(StreamOrder& order, PoolOptions options)
    : impl_(std::make_unique<Impl>(order, options)) {}

DevicePool::~DevicePool() = default;

const Result<void>& DevicePool::status() const noexcept { return impl_->status; }
std::uint64_t DevicePool::capacity() const noexcept { return impl_->capacity; }
StreamOrder& DevicePool::order() noexcept { return impl_->order; }

Result<DeviceHandle> DevicePool::allocate(std::uint64_t bytes, StreamId stream) {
  Impl& p = *impl_;
  if (!p.status.ok()) return p.status.error();
  if (bytes == 0) {
    return make_error(ErrorCode::invalid_argument, "allocation of 0 bytes on stream " +
                                                       std::to_string(stream) + " (sizes must be > 0)");
  }
  if (stream >= kMaxStreams) {
    return make_error(ErrorCode::invalid_argument,
                      "allocation on stream " + std::to_string(stream) + ": streams are 0.." +
                          std::to_string(kMaxStreams - 1));
  }
  std::unique_lock lock(p.mu);
  if (bytes > p.capacity) {
    ++p.st.ooms;
    return make_error(ErrorCode::out_of_memory,
                      p.diagnostic(bytes, stream) + "; the request is larger than the whole capacity");
  }
  const std::uint64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  p.retire_pending();
  if (auto b = p.try_fit(size, stream)) {
    DeviceHandle h = p.bind(*b, bytes, stream);
    p.check();
    return h;
  }

  // I4: survive pressure before reporting it.
  ++p.st.reclaims;
  auto succeed = [&](std::uint32_t b) {
    ++p.st.recoveries;
    DeviceHandle h = p.bind(b, bytes, stream);
    p.check();
    return h;
  };
  // 1. Dispatch held commands, so held work can complete and release its leases.
  //    No pool lock while the backend works.
  lock.unlock();
  Result<void> flushed = p.backend.flush_all();
  lock.lock();
  if (!flushed.ok()) return std::move(flushed).error();
  // 2. Reuse frees whose work has completed.
  p.retire_pending();
  if (auto b = p.try_fit(size, stream)) return succeed(*b);
  // 3. Release cached free memory.
  for (auto& r : p.regions) p.unmap_unused(r, /*all=*/true);
  if (auto b = p.try_fit(size, stream)) return succeed(*b);
  // 4. Wait (bounded) for in-flight frees, then retry.
  for (int round = 0; round < 2; ++round) {
    UseSet in_flight;
    for (std::uint32_t b : p.pending_multi) in_flight.merge(p.blocks[b].uses);
    for (auto& list : p.pending_on)
      for (std::uint32_t b : list) in_flight.merge(p.blocks[b].uses);
    if (in_flight.empty()) break;
    lock.unlock();  // waiting holds no lock another caller needs
    Result<void> waited = p.order.wait(in_flight);
    lock.lock();
    p.retire_pending();
    for (auto& r : p.regions) p.unmap_unused(r, /*all=*/true);
    if (auto b = p.try_fit(size, stream)) return succeed(*b);
    if (!waited.ok()) break;
  }
  ++p.st.ooms;
  p.check();
  return make_error(ErrorCode::out_of_memory, p.diagnostic(bytes, stream));
}

Result<void> DevicePool::free(DeviceHandle handle) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  Impl::Block& blk = p.blocks[*b];
  Impl::Slot& slot = p.slots[blk.slot];
  // I1: a freed slot's generation changes, so every copy of the handle goes stale.
  if (++slot.generation == 0) slot.generation = 1;
  slot.block = kNoBlock;
  p.spare_slots.push_back(blk.slot);
  blk.slot = kNoBlock;
  p.st.allocated_bytes -= blk.size;
  p.st.requested_bytes -= blk.requested;
  ++p.st.frees;
  p.file_freed(*b);
  p.note_peaks();
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

Result<DeviceSpan> DevicePool::lease(DeviceHandle handle, StreamPoint point) {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  Result<std::uint32_t> b = p.find(handle);
  if (!b.ok()) return std::move(b).error();
  Impl::Block& blk = p.blocks[*b];
  // I2: the block stays this operation's until `point` completes.
  blk.uses.add(point);
  return DeviceSpan{blk.addr, blk.requested};
}

Result<void> DevicePool::make_ready(DeviceHandle handle, StreamId stream) {
  StreamPoint after;
  {
    std::lock_guard lock(impl_->mu);
    Result<std::uint32_t> b = impl_->find(handle);
    if (!b.ok()) return std::move(b).error();
    after = impl_->blocks[*b].ready_after;
  }
  if (after.ticket == 0 || after.stream == stream || impl_->order.is_complete(after)) return {};
  if (testing_hooks::dropped(testing_hooks::WaitSite::pool_reuse)) return {};
  // The wait could never finish while the work it names sits in a held queue.
  FERRY_TRY(impl_->backend.flush(after.stream));
  Result<Ticket> t = impl_->order.order_after(stream, after);
  if (!t.ok()) return std::move(t).error();
  return {};
}

Result<void> DevicePool::trim() {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  ++p.st.reclaims;
  p.retire_pending();
  for (auto& r : p.regions) p.unmap_unused(r, /*all=*/true);
  p.check();
  return {};
}

PoolStats DevicePool::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->st;
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
  std::lock_guard lock(impl_->mu);
  return impl_->largest_free_extent();
}

std::vector<BlockInfo> DevicePool::snapshot() const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  std::vector<std::uint8_t> spare(p.blocks.size(), 0);
  for (std::uint32_t b : p.spare_blocks) spare[b] = 1;
  std::vector<BlockInfo> out;
  for (std::uint32_t b = 0; b < p.blocks.size(); ++b) {
    if (spare[b]) continue;
    const auto& blk = p.blocks[b];
    out.push_back(BlockInfo{blk.addr, blk.size,
                            blk.state == Impl::BlockState::live ? BlockInfo::State::live
                                                                : BlockInfo::State::pending_free,
                            blk.stream});
  }
  std::sort(out.begin(), out.end(), [](const BlockInfo& a, const BlockInfo& b) { return a.addr < b.addr; });
  return out;
}

std::vector<SegmentInfo> DevicePool::segments() const {
  const Impl& p = *impl_;
  std::lock_guard lock(p.mu);
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
    for (std::uint64_t g = 0; g < r.mapped.size(); ++g) {
      if (!r.mapped[g]) continue;
      const std::uint64_t addr = r.base + g * p.granule;
      extend(seg.mapped, addr);
      seg.mapped_bytes += p.granule;
      if (r.refs[g] == 0) {
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
