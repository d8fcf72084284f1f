// A mutex for short critical sections: one compare-exchange to lock and one
// fetch-sub to unlock when uncontended (std::mutex's pthread path costs about five
// times that, a measurable share of the pool's alloc+free pair), and a real sleep
// (std::atomic::wait, a futex on Linux) when contended, never a spin.
// BasicLockable, so std::lock_guard and std::unique_lock take it. Not recursive.
#pragma once

#include <atomic>
#include <cstdint>

namespace ferry::detail {

class FutexMutex {
 public:
  [[gnu::always_inline]] void lock() noexcept {
    std::uint32_t c = kFree;
    if (!state_.compare_exchange_strong(c, kLocked, std::memory_order_acquire)) [[unlikely]] lock_contended(c);
  }
  [[gnu::always_inline]] void unlock() noexcept {
    if (state_.fetch_sub(1, std::memory_order_release) != kLocked) [[unlikely]] wake();
  }

 private:
  [[gnu::noinline]] void lock_contended(std::uint32_t c) noexcept {
    // Contended: mark the lock as having sleepers, so the unlock wakes one.
    if (c != kContended) c = state_.exchange(kContended, std::memory_order_acquire);
    while (c != kFree) {
      state_.wait(kContended, std::memory_order_relaxed);
      c = state_.exchange(kContended, std::memory_order_acquire);
    }
  }
  [[gnu::noinline]] void wake() noexcept {
    state_.store(kFree, std::memory_order_release);
    state_.notify_one();
  }

  static constexpr std::uint32_t kFree = 0, kLocked = 1, kContended = 2;
  std::atomic<std::uint32_t> state_{kFree};
};

}  // namespace ferry::detail
