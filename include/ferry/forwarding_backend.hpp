// ferry — the base of backend adaptors (STYLE: policies as adaptors).
//
// Forwards every Backend call to `inner`. An adaptor — a meter, a fault
// injector, a test double — derives from it and overrides only what it changes.
// Thread safety and blocking: those of `inner`, plus whatever the override adds.
// Lifetime: `inner` must outlive the adaptor.
#pragma once

#include <utility>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"

namespace ferry FERRY_API {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  const DeviceInfo& info() const noexcept override { return inner_.info(); }
  Result<std::uint64_t> reserve_address(std::uint64_t bytes) override { return inner_.reserve_address(bytes); }
  Result<void> release_address(std::uint64_t base, std::uint64_t bytes) override {
    return inner_.release_address(base, bytes);
  }
  Result<void> map(std::uint64_t addr, std::uint64_t bytes) override { return inner_.map(addr, bytes); }
  Result<void> unmap(std::uint64_t addr, std::uint64_t bytes) override { return inner_.unmap(addr, bytes); }
  std::uint64_t mapped_bytes() const override { return inner_.mapped_bytes(); }
  Result<Ticket> enqueue(StreamId stream, Op op) override { return inner_.enqueue(stream, std::move(op)); }
  Ticket submitted(StreamId stream) const override { return inner_.submitted(stream); }
  Ticket completed(StreamId stream) override { return inner_.completed(stream); }
  void set_hold(StreamId stream, bool hold) override { inner_.set_hold(stream, hold); }
  bool held(StreamId stream) const override { return inner_.held(stream); }
  Result<void> flush(StreamId stream) override { return inner_.flush(stream); }
  Result<void> flush_all() override { return inner_.flush_all(); }
  Result<void> wait(StreamPoint point, std::chrono::nanoseconds timeout) override {
    return inner_.wait(point, timeout);
  }
  Result<void> synchronize() override { return inner_.synchronize(); }
  Result<std::byte*> allocate_pinned(std::uint64_t bytes) override { return inner_.allocate_pinned(bytes); }
  Result<void> free_pinned(std::byte* ptr) override { return inner_.free_pinned(ptr); }
  Result<void> register_host(std::byte* ptr, std::uint64_t bytes) override {
    return inner_.register_host(ptr, bytes);
  }
  Result<void> unregister_host(std::byte* ptr) override { return inner_.unregister_host(ptr); }
  HostMemoryStats host_stats() const override { return inner_.host_stats(); }
  std::uint64_t now_ns() const override { return inner_.now_ns(); }
  void advance(std::uint64_t ns) override { inner_.advance(ns); }
  FaultCounters fault_counters() const override { return inner_.fault_counters(); }
  std::shared_ptr<const RaceLog> race_log() const override { return inner_.race_log(); }
  Result<void> join_race_checker(Backend& first) override { return inner_.join_race_checker(first); }
  Result<std::optional<PeerLink>> connect_peer(Backend& peer) override { return inner_.connect_peer(peer); }
  void note_host_access(const std::byte* ptr, std::uint64_t bytes, Access access) override {
    inner_.note_host_access(ptr, bytes, access);
  }
  void note_block(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
                  std::string_view tag) override {
    inner_.note_block(addr, bytes, handle, tag);
  }
  Result<void> begin_graph(StreamId stream) override { return inner_.begin_graph(stream); }
  Result<NativeGraph> end_graph(StreamId stream) override { return inner_.end_graph(stream); }
  Backend& innermost() noexcept override { return inner_.innermost(); }
  Result<NativeStream> native_stream(StreamId stream) override { return inner_.native_stream(stream); }
  Result<StreamId> adopt_stream(NativeStream native) override { return inner_.adopt_stream(native); }
  Result<void> release_stream(StreamId stream, std::chrono::nanoseconds timeout) override {
    return inner_.release_stream(stream, timeout);
  }
  Result<NativeEvent> export_event(StreamPoint point) override { return inner_.export_event(point); }
  Result<void> release_event(NativeEvent event) override { return inner_.release_event(event); }

 protected:
  Backend& inner_;
};

}  // namespace ferry
