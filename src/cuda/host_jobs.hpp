// ferry — the host side of the CUDA backend's copies of pageable memory: the jobs
// its host functions (cudaLaunchHostFunc) run, and the worker thread that fills a
// stream's pinned staging buffers for uploads.
//
// A staged upload of chunk k (staging buffer b = k % 2) puts on the stream
//   gate(k) -> DMA staging[b] -> device -> finish(k)
// and hands the memcpy of chunk k into staging[b] to the worker, which starts it
// once every earlier use of staging[b] on that stream has finished (the DMA of
// chunk k - 2 has read it). The gate holds the stream until the worker has copied,
// so the DMA of chunk k runs while the worker copies chunk k + 1: the two buffers
// overlap instead of taking turns. A download's chunk (DMA into staging[b], then a
// host function copying it out) is a use of staging[b] too, finished by that host
// function.
//
// No deadlock, whatever the driver's callback threads: a gate waits for the worker
// and for submit(), which the issuing thread calls right after enqueuing the gate
// and before any other CUDA call (an enqueue may block until the stream moves);
// the worker waits only for finish() of uses that precede the gate on the same
// stream (so they ran already, in stream order), never for another stream: it
// takes the oldest upload that can start.
//
// The caller's memory: once abandon() has returned (the device faulted, or a failed
// issue could not be drained) the worker reads no source again, so the error can be
// reported and the caller may free it.
//
// Ownership. The registry owns every job until its last host function has run,
// and frees the rest at teardown (release_all), after synchronizing: after a sticky
// device error the driver never calls the host functions still queued.
//
// Thread safety: start_worker, add_*, submit, cancel and end_on_copy on the issuing
// thread; abandon on any; run, gate and finish on the driver's callback threads;
// work on the worker. They take only this registry's lock (a leaf) and make no CUDA
// call. stop_worker and release_all at teardown, when no host function can still run.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry::cuda_detail {

class HostJobs {
 public:
  // One stream's two staging buffers: uses handed out, and uses finished, per
  // buffer. Uses of a buffer finish in the order they were handed out (stream
  // order), so finished[b] == u means uses 0..u-1 of buffer b are done.
  struct Lane {
    std::array<std::uint64_t, 2> issued{};
    std::array<std::uint64_t, 2> finished{};
  };

  struct Job {
    void* dst;
    const void* src;
    std::size_t bytes;
    HostJobs* owner;
    Lane* lane = nullptr;  // set: the job is a use of staging buffer `buffer`
    unsigned buffer = 0;
    std::uint64_t use = 0;        // an upload starts once lane->finished[buffer] == use
    bool copied = false;          // an upload's bytes are in the staging buffer
    bool gated = false;           // an upload's gate has run
    bool finish_on_copy = false;  // an upload whose DMA or finish() never got onto the stream:
                                  // its use ends when copied, the job when also gated
  };

  HostJobs() = default;
  ~HostJobs() { release_all(); }
  HostJobs(const HostJobs&) = delete;
  HostJobs& operator=(const HostJobs&) = delete;

  // A copy to hand to cudaLaunchHostFunc with run() as the function. With `lane`,
  // the copy is the last step of a use of its staging buffer (a staged download).
  Job* add_copy(void* dst, const void* src, std::size_t bytes, Lane* lane = nullptr, unsigned buffer = 0) {
    std::lock_guard lock(mu_);
    Job* job = insert(Job{dst, src, bytes, this});
    if (lane != nullptr) claim(*job, *lane, buffer);
    return job;
  }
  // Starts the worker if it is not running: false if the thread could not be made
  // (std::thread throws; the backend's API returns errors). Before the first submit().
  bool start_worker() {
    std::lock_guard lock(mu_);
    if (worker_.joinable()) return true;
    try {
      worker_ = std::thread([this] { work(); });  // it blocks on mu_ until this returns
    } catch (const std::system_error&) {
      return false;
    }
    return true;
  }
  // A staged upload of [src, src + bytes) into `staging`, buffer `buffer` of
  // `lane`: enqueue gate(), submit(), then enqueue its DMA and finish().
  Job* add_upload(Lane& lane, unsigned buffer, void* staging, const void* src, std::size_t bytes) {
    std::lock_guard lock(mu_);
    Job* job = insert(Job{staging, src, bytes, this});
    claim(*job, lane, buffer);
    return job;
  }
  // Hands an upload whose gate is on the stream to the worker.
  void submit(Job* job) {
    {
      std::lock_guard lock(mu_);
      if (abandoned_) return;  // never copied: its gate opens, release_all frees it
      pending_.push_back(job);
    }
    changed_.notify_all();
  }
  // The job's first host function could not be enqueued, so it never runs: the job
  // goes and its use of a staging buffer (the newest one) is given back. A download's
  // DMA into that buffer may be on the stream already; no use can follow before it
  // is done, since the failed issue drains the stream (or, failing, faults the
  // backend, which then issues nothing) before the error is returned.
  void cancel(Job* job) {
    std::unique_ptr<Job> gone;  // freed outside the lock
    std::lock_guard lock(mu_);
    if (job->lane != nullptr) --job->lane->issued[job->buffer];
    gone = take(job);
  }
  // An upload submitted with its gate on the stream but whose DMA or finish() is
  // not: its use ends once the worker has copied (now, if it has), the job once its
  // gate has run too (the failed issue drains the stream before anything can reuse
  // the buffer).
  void end_on_copy(Job* job) {
    std::unique_ptr<Job> gone;  // freed outside the lock
    {
      std::lock_guard lock(mu_);
      job->finish_on_copy = true;
      if (!job->copied) return;  // the worker ends the use, the gate frees the job
      ++job->lane->finished[job->buffer];
      if (job->gated) gone = take(job);
    }
    changed_.notify_all();  // an upload waiting for this buffer may start
  }
  // The device faulted or a failed issue could not be drained: the worker starts no
  // copy from now on and the one in flight, if any, is done when this returns, so
  // nothing reads the caller's memory after the error is returned. Gates open
  // without their bytes (their stream is lost). The jobs go at release_all.
  void abandon() {
    {
      std::unique_lock lock(mu_);
      abandoned_ = true;
      pending_.clear();
      changed_.wait(lock, [&] { return !copying_; });
    }
    changed_.notify_all();
  }

  // Host function of add_copy: copies, finishes its use, frees the job.
  static void run(void* data) {
    auto* job = static_cast<Job*>(data);
    std::memcpy(job->dst, job->src, job->bytes);
    job->owner->finish_use(job);
  }
  // Host function before an upload's DMA: holds the stream until the worker has
  // copied the bytes into the staging buffer.
  static void gate(void* data) {
    auto* job = static_cast<Job*>(data);
    HostJobs& self = *job->owner;
    std::unique_ptr<Job> gone;  // freed after the lock is released
    std::unique_lock lock(self.mu_);
    self.changed_.wait(lock, [&] { return job->copied || self.stopping_ || self.abandoned_; });
    job->gated = true;
    if (job->copied && job->finish_on_copy) gone = self.take(job);  // no finish() follows
  }
  // Host function after an upload's DMA: the staging buffer is free again.
  static void finish(void* data) {
    auto* job = static_cast<Job*>(data);
    job->owner->finish_use(job);
  }

  // Teardown, once synchronized: no upload is copied after this returns (the
  // staging buffers may go), and a gate still waiting lets its stream go.
  void stop_worker() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    if (worker_.joinable()) worker_.join();
  }
  // Teardown: stops the worker and frees the jobs whose host functions never ran;
  // how many there were.
  std::size_t release_all() {
    stop_worker();
    std::unordered_map<Job*, std::unique_ptr<Job>> gone;
    std::lock_guard lock(mu_);
    pending_.clear();
    gone.swap(jobs_);
    return gone.size();
  }
  std::size_t pending() const {
    std::lock_guard lock(mu_);
    return jobs_.size();
  }

 private:
  // mu_ held.
  Job* insert(Job job) {
    auto owned = std::make_unique<Job>(job);
    Job* raw = owned.get();
    jobs_.emplace(raw, std::move(owned));
    return raw;
  }
  void claim(Job& job, Lane& lane, unsigned buffer) {
    job.lane = &lane;
    job.buffer = buffer;
    job.use = lane.issued[buffer]++;
  }
  std::unique_ptr<Job> take(Job* job) {
    std::unique_ptr<Job> gone;
    if (auto it = jobs_.find(job); it != jobs_.end()) {
      gone = std::move(it->second);
      jobs_.erase(it);
    }
    return gone;
  }
  std::unique_ptr<Job> finish_locked(Job* job) {
    if (job->lane != nullptr) ++job->lane->finished[job->buffer];
    return take(job);
  }
  void finish_use(Job* job) {
    std::unique_ptr<Job> gone;
    {
      std::lock_guard lock(mu_);
      gone = finish_locked(job);
    }
    changed_.notify_all();  // an upload waiting for this buffer may start
  }

  // The worker: copies, oldest first, every upload whose buffer is free.
  void work() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      Job* next = nullptr;  // abandon() emptied pending_, and submit() adds nothing after it
      for (auto it = pending_.begin(); it != pending_.end(); ++it) {
        if ((*it)->lane->finished[(*it)->buffer] == (*it)->use) {
          next = *it;
          pending_.erase(it);
          break;
        }
      }
      if (next == nullptr) {
        changed_.wait(lock);
        continue;
      }
      copying_ = true;  // abandon() waits for it to clear
      lock.unlock();
      std::memcpy(next->dst, next->src, next->bytes);  // the job lives until its finish()
      lock.lock();
      copying_ = false;
      next->copied = true;
      // Its use ends here; the job itself is its gate's to free (the gate may not have run).
      if (next->finish_on_copy) ++next->lane->finished[next->buffer];
      changed_.notify_all();  // its gate, and uploads waiting for a buffer
    }
  }
  mutable std::mutex mu_;
  std::condition_variable changed_;  // a copy done, a use finished, a job submitted, stop
  std::unordered_map<Job*, std::unique_ptr<Job>> jobs_;
  std::deque<Job*> pending_;  // submitted uploads not yet copied
  bool stopping_ = false;
  bool abandoned_ = false;
  bool copying_ = false;  // the worker is copying a job it took off pending_
  std::thread worker_;    // started by start_worker, once everything above exists
};

}  // namespace ferry::cuda_detail
