// ferry — a TLSF-style offset allocator (internal).
//
// Carves a range of abstract units into blocks; its bookkeeping lives entirely
// outside the range, so it can manage device memory, pinned chunks or address
// space alike. O(1) allocate and free: free blocks sit in size-class bins (a
// first level per power of two, kSubBins linear subdivisions of it) found with
// two bitmap scans; a freed block merges with free physical neighbours.
//
// Invariants (validate()):
//   sum(size of every node in physical order) == capacity, offsets contiguous
//   no two free nodes are physical neighbours
//   a node is in bin b  <=>  it is free and bin_of(size) == b
//   free_units == sum(size of free nodes)
//
// Not thread-safe: the owner serializes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ferry::detail {

class OffsetAllocator {
 public:
  static constexpr std::uint32_t kNone = UINT32_MAX;

  struct Allocation {
    std::uint64_t offset = 0;  // units from the start of the range
    std::uint32_t node = kNone;
  };

  explicit OffsetAllocator(std::uint64_t capacity_units);

  // A block of at least `units` (>0) units, or nullopt when no free block fits.
  std::optional<Allocation> allocate(std::uint64_t units);
  // Carves exactly [offset, offset + units) out of free node `node`, which must
  // contain it. The slow path for placement-aware callers.
  Allocation allocate_range(std::uint32_t node, std::uint64_t offset, std::uint64_t units);
  // Calls f(node, offset, size) for every free node. O(free nodes).
  template <class F>
  void for_each_free(F&& f) const {
    for (std::uint32_t head : bin_head_)
      for (std::uint32_t n = head; n != kNone; n = nodes_[n].next_free)
        f(n, nodes_[n].offset, nodes_[n].size);
  }
  // Calls f(node, offset, size) for every free node of at least `units` units,
  // smallest size classes first, until f returns false. O(free nodes visited).
  template <class F>
  void for_each_free_from(std::uint64_t units, F&& f) const {
    for (std::uint32_t b = find_bin_at_least(bin_of(units)); b != kNone;
         b = b + 1 < bin_head_.size() ? find_bin_at_least(b + 1) : kNone)
      for (std::uint32_t n = bin_head_[b]; n != kNone; n = nodes_[n].next_free)
        if (nodes_[n].size >= units && !f(n, nodes_[n].offset, nodes_[n].size)) return;
  }
  // Returns an allocated node to the free space. Precondition: node is allocated.
  void free(std::uint32_t node);
  // Cuts allocated `node` after `head_units`; the tail becomes a new allocated
  // node, which is returned. Precondition: 0 < head_units < size_of(node).
  std::uint32_t split(std::uint32_t node, std::uint64_t head_units);

  std::uint64_t offset_of(std::uint32_t node) const { return nodes_[node].offset; }
  std::uint64_t size_of(std::uint32_t node) const { return nodes_[node].size; }
  std::uint32_t node_count() const noexcept { return static_cast<std::uint32_t>(nodes_.size()); }
  bool is_used(std::uint32_t node) const { return nodes_[node].used; }
  std::uint64_t capacity() const noexcept { return capacity_; }
  std::uint64_t free_units() const noexcept { return free_units_; }
  std::uint64_t largest_free() const;

  bool validate(std::string* why = nullptr) const;

 private:
  static constexpr unsigned kSubBinBits = 4;
  static constexpr unsigned kSubBins = 1u << kSubBinBits;
  static constexpr unsigned kLevels = 64;

  struct Node {
    std::uint64_t offset = 0;
    std::uint64_t size = 0;
    std::uint32_t prev_phys = kNone, next_phys = kNone;
    std::uint32_t prev_free = kNone, next_free = kNone;  // bin list, or node free list
    bool used = false;
    bool in_bin = false;
  };

  static unsigned bin_of(std::uint64_t size);  // bin that holds blocks of this size
  std::uint32_t new_node();
  // Splits node n after head_units into two physical neighbours, neither in a
  // bin; returns the tail (free, unbinned).
  std::uint32_t cut(std::uint32_t n, std::uint64_t head_units);
  void release_node(std::uint32_t n);
  void insert_free(std::uint32_t n);
  void remove_free(std::uint32_t n);
  std::uint32_t find_bin_at_least(unsigned bin) const;  // first non-empty bin >= bin

  std::vector<Node> nodes_;
  std::uint32_t spare_nodes_ = kNone;  // recycled Node entries, linked by next_free
  std::vector<std::uint32_t> bin_head_;  // kLevels * kSubBins
  std::uint64_t level_bitmap_ = 0;
  std::vector<std::uint32_t> sub_bitmap_;  // per level, kSubBins bits
  std::uint64_t capacity_;
  std::uint64_t free_units_ = 0;
};

}  // namespace ferry::detail
