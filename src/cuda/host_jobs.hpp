// ferry — the jobs of the CUDA backend's host functions (cudaLaunchHostFunc): the
// memcpy between a pinned staging buffer and the caller's pageable memory.
//
// A job used to free itself when its host function ran. After a sticky device error
// the driver never calls the host functions still queued, so their jobs leaked. Now
// the backend owns every job until its host function has run, and frees the rest at
// teardown — after synchronizing, when a job not yet run never will be.
//
// Thread safety: add and cancel on the issuing thread, run on the driver's callback
// thread (it takes only this registry's lock, a leaf; it must not call CUDA),
// release_all at teardown when no host function can still run.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace ferry::cuda_detail {

class HostJobs {
 public:
  struct Job {
    void* dst;
    const void* src;
    std::size_t bytes;
    HostJobs* owner;
  };

  // A job to hand to cudaLaunchHostFunc with run() as the function.
  Job* add(void* dst, const void* src, std::size_t bytes) {
    auto job = std::make_unique<Job>(Job{dst, src, bytes, this});
    Job* raw = job.get();
    std::lock_guard lock(mu_);
    jobs_.emplace(raw, std::move(job));
    return raw;
  }
  // The launch failed: the driver will never run it.
  void cancel(Job* job) { take(job); }
  // The host function: copies, then frees its job.
  static void run(void* data) {
    auto* job = static_cast<Job*>(data);
    std::memcpy(job->dst, job->src, job->bytes);
    job->owner->take(job);
  }
  // Teardown: frees the jobs whose host functions never ran; how many there were.
  std::size_t release_all() {
    std::lock_guard lock(mu_);
    const std::size_t left = jobs_.size();
    jobs_.clear();
    return left;
  }
  std::size_t pending() const {
    std::lock_guard lock(mu_);
    return jobs_.size();
  }

 private:
  void take(Job* job) {
    std::unique_ptr<Job> gone;  // freed outside the lock
    std::lock_guard lock(mu_);
    if (auto it = jobs_.find(job); it != jobs_.end()) {
      gone = std::move(it->second);
      jobs_.erase(it);
    }
  }

  mutable std::mutex mu_;
  std::unordered_map<Job*, std::unique_ptr<Job>> jobs_;
};

}  // namespace ferry::cuda_detail
