// An append-only sequence in large fixed blocks: growing never copies what is
// there (no doubling peak), and each block is big enough that the C library
// maps it on its own, so clearing the list gives its memory back to the system
// instead of leaving it in the heap for smaller requests only.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace ferry::import {

template <class T>
class BlockList {
 public:
  static constexpr std::size_t kPerBlock = (std::size_t{1} << 20) / sizeof(T);  // 1 MiB blocks

  void push_back(const T& v) {
    if (size_ == blocks_.size() * kPerBlock) blocks_.push_back(std::make_unique_for_overwrite<T[]>(kPerBlock));
    blocks_[size_ / kPerBlock][size_ % kPerBlock] = v;
    ++size_;
  }
  // Grows to n items (new ones value-initialized) or drops the items past n.
  void resize(std::size_t n) {
    while (size_ < n) push_back(T{});
    size_ = n;
    blocks_.resize((n + kPerBlock - 1) / kPerBlock);
  }
  T& operator[](std::size_t i) noexcept { return blocks_[i / kPerBlock][i % kPerBlock]; }
  const T& operator[](std::size_t i) const noexcept { return blocks_[i / kPerBlock][i % kPerBlock]; }
  std::size_t size() const noexcept { return size_; }
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < size_; ++i) f((*this)[i]);
  }

 private:
  std::vector<std::unique_ptr<T[]>> blocks_;
  std::size_t size_ = 0;
};

}  // namespace ferry::import
