#include "core/offset_allocator.hpp"

#include <bit>
#include <cassert>

namespace ferry::detail {

OffsetAllocator::OffsetAllocator(std::uint64_t capacity_units)
    : bin_head_(kLevels * kSubBins, kNone), sub_bitmap_(kLevels, 0), capacity_(capacity_units) {
  if (capacity_units == 0) return;
  const std::uint32_t n = new_node();
  nodes_[n].offset = 0;
  nodes_[n].size = capacity_units;
  insert_free(n);
}

unsigned OffsetAllocator::bin_of(std::uint64_t size) {
  if (size < kSubBins) return static_cast<unsigned>(size);
  const unsigned log2 = 63u - static_cast<unsigned>(std::countl_zero(size));
  const unsigned level = log2 - kSubBinBits + 1;
  const unsigned sub = static_cast<unsigned>(size >> (log2 - kSubBinBits)) - kSubBins;
  return level * kSubBins + sub;
}

std::uint32_t OffsetAllocator::new_node() {
  if (spare_nodes_ != kNone) {
    const std::uint32_t n = spare_nodes_;
    spare_nodes_ = nodes_[n].next_free;
    nodes_[n] = Node{};
    return n;
  }
  nodes_.emplace_back();
  return static_cast<std::uint32_t>(nodes_.size() - 1);
}

void OffsetAllocator::release_node(std::uint32_t n) {
  nodes_[n] = Node{};
  nodes_[n].size = 0;
  nodes_[n].next_free = spare_nodes_;
  spare_nodes_ = n;
}

void OffsetAllocator::insert_free(std::uint32_t n) {
  Node& node = nodes_[n];
  const unsigned bin = bin_of(node.size);
  node.used = false;
  node.in_bin = true;
  node.prev_free = kNone;
  node.next_free = bin_head_[bin];
  if (node.next_free != kNone) nodes_[node.next_free].prev_free = n;
  bin_head_[bin] = n;
  level_bitmap_ |= std::uint64_t{1} << (bin / kSubBins);
  sub_bitmap_[bin / kSubBins] |= 1u << (bin % kSubBins);
  free_units_ += node.size;
}

void OffsetAllocator::remove_free(std::uint32_t n) {
  Node& node = nodes_[n];
  assert(node.in_bin);
  const unsigned bin = bin_of(node.size);
  if (node.prev_free != kNone) nodes_[node.prev_free].next_free = node.next_free;
  else bin_head_[bin] = node.next_free;
  if (node.next_free != kNone) nodes_[node.next_free].prev_free = node.prev_free;
  if (bin_head_[bin] == kNone) {
    sub_bitmap_[bin / kSubBins] &= ~(1u << (bin % kSubBins));
    if (sub_bitmap_[bin / kSubBins] == 0) level_bitmap_ &= ~(std::uint64_t{1} << (bin / kSubBins));
  }
  node.in_bin = false;
  node.prev_free = node.next_free = kNone;
  free_units_ -= node.size;
}

std::uint32_t OffsetAllocator::find_bin_at_least(unsigned bin) const {
  const unsigned level = bin / kSubBins;
  if (level >= kLevels) return kNone;
  const std::uint32_t subs = sub_bitmap_[level] & (~0u << (bin % kSubBins));
  if (subs != 0) return level * kSubBins + static_cast<unsigned>(std::countr_zero(subs));
  if (level + 1 >= kLevels) return kNone;
  const std::uint64_t levels = level_bitmap_ & (~std::uint64_t{0} << (level + 1));
  if (levels == 0) return kNone;
  const unsigned l2 = static_cast<unsigned>(std::countr_zero(levels));
  return l2 * kSubBins + static_cast<unsigned>(std::countr_zero(sub_bitmap_[l2]));
}

std::optional<OffsetAllocator::Allocation> OffsetAllocator::allocate(std::uint64_t units) {
  if (units == 0 || units > free_units_) return std::nullopt;
  std::uint32_t found = kNone;
  // A short first-fit walk of the request's own bin keeps the fit tight; the
  // rounded-up search below is the O(1) guarantee.
  const unsigned own_bin = bin_of(units);
  std::uint32_t walk = bin_head_[own_bin];
  for (int steps = 0; walk != kNone && steps < 8; ++steps, walk = nodes_[walk].next_free) {
    if (nodes_[walk].size >= units) {
      found = walk;
      break;
    }
  }
  if (found == kNone) {
    std::uint64_t rounded = units;
    if (units >= kSubBins) {
      const unsigned log2 = 63u - static_cast<unsigned>(std::countl_zero(units));
      const std::uint64_t step = std::uint64_t{1} << (log2 - kSubBinBits);
      if (units > UINT64_MAX - step) return std::nullopt;
      rounded = units + step - 1;
    }
    unsigned bin = bin_of(rounded);
    if (bin == own_bin) ++bin;  // own bin was walked already
    const std::uint32_t b = find_bin_at_least(bin);
    if (b == kNone) return std::nullopt;
    found = bin_head_[b];
  }
  remove_free(found);
  if (nodes_[found].size > units) insert_free(cut(found, units));
  nodes_[found].used = true;
  return Allocation{nodes_[found].offset, found};
}

OffsetAllocator::Allocation OffsetAllocator::allocate_range(std::uint32_t n, std::uint64_t offset,
                                                           std::uint64_t units) {
  assert(nodes_[n].in_bin && offset >= nodes_[n].offset &&
         offset + units <= nodes_[n].offset + nodes_[n].size && units > 0);
  remove_free(n);
  if (offset > nodes_[n].offset) {
    // n keeps the free head; the rest carries on.
    const std::uint32_t rest = cut(n, offset - nodes_[n].offset);
    insert_free(n);
    n = rest;
  }
  if (nodes_[n].size > units) insert_free(cut(n, units));
  nodes_[n].used = true;
  return Allocation{nodes_[n].offset, n};
}

void OffsetAllocator::free(std::uint32_t n) {
  assert(n < nodes_.size() && nodes_[n].used);
  nodes_[n].used = false;
  // Merge with free physical neighbours so free space never stays split.
  const std::uint32_t prev = nodes_[n].prev_phys;
  if (prev != kNone && !nodes_[prev].used) {
    remove_free(prev);
    nodes_[prev].size += nodes_[n].size;
    nodes_[prev].next_phys = nodes_[n].next_phys;
    if (nodes_[n].next_phys != kNone) nodes_[nodes_[n].next_phys].prev_phys = prev;
    release_node(n);
    n = prev;
  }
  const std::uint32_t next = nodes_[n].next_phys;
  if (next != kNone && !nodes_[next].used) {
    remove_free(next);
    nodes_[n].size += nodes_[next].size;
    nodes_[n].next_phys = nodes_[next].next_phys;
    if (nodes_[next].next_phys != kNone) nodes_[nodes_[next].next_phys].prev_phys = n;
    release_node(next);
  }
  insert_free(n);
}

std::uint32_t OffsetAllocator::split(std::uint32_t n, std::uint64_t head_units) {
  assert(nodes_[n].used && head_units > 0 && head_units < nodes_[n].size);
  const std::uint32_t t = cut(n, head_units);
  nodes_[t].used = true;
  return t;
}

std::uint32_t OffsetAllocator::cut(std::uint32_t n, std::uint64_t head_units) {
  const std::uint32_t t = new_node();  // may reallocate nodes_: take references after
  Node& head = nodes_[n];
  Node& tail = nodes_[t];
  tail.offset = head.offset + head_units;
  tail.size = head.size - head_units;
  tail.prev_phys = n;
  tail.next_phys = head.next_phys;
  if (head.next_phys != kNone) nodes_[head.next_phys].prev_phys = t;
  head.next_phys = t;
  head.size = head_units;
  return t;
}

std::uint64_t OffsetAllocator::largest_free() const {
  if (level_bitmap_ == 0) return 0;
  const unsigned level = 63u - static_cast<unsigned>(std::countl_zero(level_bitmap_));
  const unsigned sub = 31u - static_cast<unsigned>(std::countl_zero(sub_bitmap_[level]));
  std::uint64_t best = 0;
  for (std::uint32_t n = bin_head_[level * kSubBins + sub]; n != kNone; n = nodes_[n].next_free) {
    if (nodes_[n].size > best) best = nodes_[n].size;
  }
  return best;
}

bool OffsetAllocator::validate(std::string* why) const {
  auto fail = [&](const char* what) {
    if (why) *why = what;
    return false;
  };
  if (capacity_ == 0) return nodes_.empty() ? true : fail("empty allocator has nodes");
  // Find the physical head: the node at offset 0 with no predecessor.
  std::uint32_t head = kNone;
  for (std::uint32_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i].size != 0 && nodes_[i].prev_phys == kNone) {
      if (head != kNone) return fail("two physical heads");
      head = i;
    }
  }
  if (head == kNone) return fail("no physical head");
  std::uint64_t expect_offset = 0, free_sum = 0, free_count = 0;
  bool prev_free = false;
  for (std::uint32_t n = head; n != kNone; n = nodes_[n].next_phys) {
    const Node& node = nodes_[n];
    if (node.offset != expect_offset) return fail("physical offsets not contiguous");
    if (node.size == 0) return fail("zero-size node in physical list");
    if (node.next_phys != kNone && nodes_[node.next_phys].prev_phys != n)
      return fail("physical links disagree");
    if (!node.used) {
      if (prev_free) return fail("two adjacent free nodes");
      if (!node.in_bin) return fail("free node not in a bin");
      free_sum += node.size;
      ++free_count;
    } else if (node.in_bin) {
      return fail("used node in a bin");
    }
    prev_free = !node.used;
    expect_offset += node.size;
  }
  if (expect_offset != capacity_) return fail("node sizes do not sum to capacity");
  if (free_sum != free_units_) return fail("free_units disagrees with free nodes");
  std::uint64_t binned = 0;
  for (unsigned b = 0; b < bin_head_.size(); ++b) {
    const bool bit = (sub_bitmap_[b / kSubBins] >> (b % kSubBins)) & 1u;
    if (bit != (bin_head_[b] != kNone)) return fail("bin bitmap disagrees with bin list");
    for (std::uint32_t n = bin_head_[b]; n != kNone; n = nodes_[n].next_free) {
      if (bin_of(nodes_[n].size) != b) return fail("node in the wrong bin");
      ++binned;
    }
  }
  for (unsigned l = 0; l < kLevels; ++l) {
    if (((level_bitmap_ >> l) & 1u) != (sub_bitmap_[l] != 0)) return fail("level bitmap wrong");
  }
  if (binned != free_count) return fail("bin lists hold a different number of nodes");
  return true;
}

}  // namespace ferry::detail
