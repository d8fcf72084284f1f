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
  void lock() noexcept {
    std::uint32_t c = kFree;
    if (state_.compare_exchange_strong(c, kLocked, std::memory_order_acquire)) return;
    // Contended: mark the lock as having sleepers, so the unlock wakes one.
    if (c != kContended) c = state_.exchange(kContended, std::memory_order_acquire);
    while (c != kFree) {
      state_.wait(kContended, std::memory_order_relaxed);
      c = state_.exchange(kContended, std::memory_order_acquire);
    }
  }
  void unlock() noexcept {
    if (state_.fetch_sub(1, std::memory_order_release) != kLocked) {
      state_.store(kFree, std::memory_order_release);
      state_.notify_one();
    }
  }

 private:
  static constexpr std::uint32_t kFree = 0, kLocked = 1, kContended = 2;
  std::atomic<std::uint32_t> state_{kFree};
};

}  // namespace ferry::detail
