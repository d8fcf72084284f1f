#include "ferry/trace_recorder.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <mutex>
#include <ostream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/output_file.hpp"
#include "ferry/graph.hpp"

namespace ferry {
namespace {

using Line = nlohmann::ordered_json;

std::uint64_t key_of(DeviceHandle h) noexcept {
  return (std::uint64_t{h.slot} << 32) | h.generation;
}

}  // namespace

struct RecordingPool::Impl {
  struct Entry {
    std::string id;
    bool live = true;
  };

  PoolCalls& up;  // the calls the recorder forwards to
  std::unique_ptr<std::ostream> owned;  // set by to_file()
  std::ostream& out;

  mutable std::mutex mu;  // guards what follows; never held while the pool runs
  std::optional<std::uint32_t> pool_id;  // learnt from the first allocation
  std::unordered_map<std::uint64_t, Entry> ids;  // live handles and remembered frees
  std::deque<std::uint64_t> freed;  // remembered frees, oldest first
  std::uint64_t allocations = 0;    // N of the ids handed out
  std::uint64_t next_seed = 1;      // seeds of uploads and input-less computes
  // Graph capture (note_graph): the name of the graph each stream captures, the
  // live graphs' names and private pools by their GraphEvent numbers.
  std::array<std::optional<std::string>, kMaxStreams> capturing;
  std::map<std::uint64_t, std::pair<std::string, std::uint64_t>> graphs;  // graph -> (name, pool)
  std::uint64_t captures = 0;  // N of the graph names "g<N>"
  RecordingStats st;
  Result<void> write_status;

  Impl(PoolCalls& u, std::ostream& o) : up(u), out(o) { write_start(); }
  Impl(PoolCalls& u, std::unique_ptr<std::ostream> f) : up(u), owned(std::move(f)), out(*owned) {
    write_start();
  }

  void write_start() {
    write_meta();
    write_existing();
  }

  // The blocks live before recording began, as allocs marked "existing": later
  // lines that use them name their ids instead of going unrecorded.
  void write_existing() {
    const std::vector<LiveBlock> live = up.pool().live_blocks();
    std::lock_guard lock(mu);
    for (const LiveBlock& b : live) {
      if (!pool_id) pool_id = b.handle.pool;
      std::string id = "b" + std::to_string(++allocations);
      write_locked(Line{{"op", "alloc"}, {"id", id}, {"bytes", b.bytes}, {"stream", b.stream}, {"existing", true}},
                   nullptr);
      ids[key_of(b.handle)] = Entry{std::move(id), true};
    }
  }

  // The first line: the capacity the program ran with, which a replay uses
  // when given none, so that pressure (and each expected OOM) happens again.
  void write_meta() {
    std::lock_guard lock(mu);
    write_locked(Line{{"op", "meta"}, {"capacity", up.pool().capacity()}}, nullptr);
  }

  // The id of `h`, when this recorder knows it. Caller holds mu.
  const Entry* find(DeviceHandle h) const {
    if (!pool_id || h.pool != *pool_id) return nullptr;
    auto it = ids.find(key_of(h));
    return it == ids.end() ? nullptr : &it->second;
  }

  // Looks up every handle; nullopt when one is unknown (and counts it).
  std::optional<std::vector<std::string>> lookup(std::span<const DeviceHandle> handles) {
    std::lock_guard lock(mu);
    std::vector<std::string> out_ids;
    out_ids.reserve(handles.size());
    for (DeviceHandle h : handles) {
      const Entry* e = find(h);
      if (e == nullptr) {
        ++st.unrecorded;
        return std::nullopt;
      }
      out_ids.push_back(e->id);
    }
    return out_ids;
  }

  void unrecorded() {
    std::lock_guard lock(mu);
    ++st.unrecorded;
  }

  // Writes one line; a failed call's line expects its error. Caller holds mu.
  void write_locked(Line line, const Error* failure) {
    if (failure != nullptr) {
      line["expect"] = std::string(to_string(failure->code));
      ++st.failed_calls;
    }
    if (!write_status.ok()) return;
    out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    if (!out) {
      write_status = make_error(ErrorCode::backend_error,
                                "writing the trace failed after " + std::to_string(st.lines) + " lines");
      return;
    }
    ++st.lines;
  }

  template <class R>
  void write(Line line, const R& result) {
    std::lock_guard lock(mu);
    write_locked(std::move(line), result.ok() ? nullptr : &result.error());
  }

  bool capturing_on(StreamId stream) {
    std::lock_guard lock(mu);
    return stream < kMaxStreams && capturing[stream].has_value();
  }

  // A call on a capturing stream that the capture refused (and so spoiled) but
  // that the format cannot write there (a download, a verified upload or copy):
  // written as the `sync` of that stream, which the capture refuses the same
  // way, so the replayed capture is spoiled too. True when it was written.
  template <class R>
  bool refused_in_capture(StreamId stream, const R& result) {
    if (result.ok() || result.error().code != ErrorCode::invalid_argument || !capturing_on(stream)) return false;
    write(Line{{"op", "sync"}, {"stream", stream}}, result);
    return true;
  }

  // The latest live graph of private pool `pool`, which a capture sharing it names.
  std::optional<std::string> graph_of_pool(std::uint64_t pool) const {
    std::optional<std::string> name;
    for (const auto& [graph, named] : graphs) {
      if (named.second == pool) name = named.first;
    }
    return name;
  }

  std::uint64_t fresh_seed() {
    std::lock_guard lock(mu);
    return next_seed++;
  }
};

RecordingPool::RecordingPool(PoolCalls& upstream, std::ostream& out)
    : ForwardingPoolCalls(upstream), impl_(std::make_unique<Impl>(upstream, out)) {}

// The base is built from impl's upstream before impl is moved in.
RecordingPool::RecordingPool(std::unique_ptr<Impl> impl) : ForwardingPoolCalls(impl->up), impl_(std::move(impl)) {}

Result<std::unique_ptr<RecordingPool>> RecordingPool::to_file(PoolCalls& upstream, const std::string& path) {
  Result<std::unique_ptr<std::ostream>> file = open_output_file(path);
  if (!file.ok()) {
    Error e = std::move(file).error();
    e.message = "the trace file " + e.message;
    return e;
  }
  std::unique_ptr<RecordingPool> recorder(new RecordingPool(std::make_unique<Impl>(upstream, std::move(file).value())));
  // The first lines reach the file now: a path that cannot be written (a full
  // device, /proc/self/mem) is refused here, not at the end of the recording.
  if (Result<void> written = recorder->flush(); !written.ok()) {
    return make_error(ErrorCode::invalid_argument,
                      path + ": the trace file cannot be written: " + written.error().message);
  }
  return recorder;
}

RecordingPool::~RecordingPool() { (void)flush(); }

Result<DeviceHandle> RecordingPool::allocate(std::uint64_t bytes, StreamId stream, std::string_view tag) {
  Impl& p = *impl_;
  if (!check_stream(stream, "trace").ok()) {
    p.unrecorded();
    return p.up.allocate(bytes, stream, tag);
  }
  Result<DeviceHandle> h = p.up.allocate(bytes, stream, tag);
  std::lock_guard lock(p.mu);
  const std::uint64_t n = ++p.allocations;
  std::string id = tag.empty() ? std::string("b") : std::string(tag) + "#";
  id += std::to_string(n);  // appended: gcc 12 warns falsely (-Wrestrict) on "b" + ...
  Line line{{"op", "alloc"}, {"id", id}, {"bytes", bytes}, {"stream", stream}};
  if (h.ok()) {
    if (!p.pool_id) p.pool_id = h->pool;
    p.ids[key_of(*h)] = Impl::Entry{std::move(id), true};
  }
  p.write_locked(std::move(line), h.ok() ? nullptr : &h.error());
  return h;
}

Result<void> RecordingPool::free(DeviceHandle handle) {
  Impl& p = *impl_;
  std::optional<std::vector<std::string>> id = p.lookup({&handle, 1});
  Result<void> r = p.up.free(handle);
  if (!id) return r;
  std::lock_guard lock(p.mu);
  if (r.ok()) {
    const std::uint64_t key = key_of(handle);
    if (auto it = p.ids.find(key); it != p.ids.end() && it->second.live) {
      it->second.live = false;
      p.freed.push_back(key);
      if (p.freed.size() > kRememberedFrees) {
        p.ids.erase(p.freed.front());
        p.freed.pop_front();
      }
    }
  }
  p.write_locked(Line{{"op", "free"}, {"id", (*id)[0]}}, r.ok() ? nullptr : &r.error());
  return r;
}

Result<void> RecordingPool::trim() {
  Result<void> r = impl_->up.trim();
  impl_->write(Line{{"op", "trim"}}, r);
  return r;
}

Result<Ticket> RecordingPool::fill(StreamId stream, DeviceHandle dst, std::uint64_t seed) {
  Impl& p = *impl_;
  std::optional<std::vector<std::string>> id;
  if (check_stream(stream, "trace").ok()) id = p.lookup({&dst, 1});
  else p.unrecorded();
  Result<Ticket> t = p.up.fill(stream, dst, seed);
  if (id) p.write(Line{{"op", "fill"}, {"id", (*id)[0]}, {"stream", stream}, {"seed", seed}}, t);
  return t;
}

Result<Ticket> RecordingPool::compute(StreamId stream, std::span<const DeviceHandle> inputs,
                                      DeviceHandle output, double flops, std::uint64_t mem_bytes) {
  Impl& p = *impl_;
  std::vector<DeviceHandle> named(inputs.begin(), inputs.end());
  named.push_back(output);
  std::optional<std::vector<std::string>> ids;
  if (check_stream(stream, "trace").ok()) ids = p.lookup(named);
  else p.unrecorded();
  const std::uint64_t seed = inputs.empty() && ids ? p.fresh_seed() : 0;
  Result<Ticket> t = p.up.compute(stream, inputs, output, flops, mem_bytes);
  if (!ids) return t;
  const std::string out_id = ids->back();
  ids->pop_back();
  if (ids->empty()) {
    p.write(Line{{"op", "fill"}, {"id", out_id}, {"stream", stream}, {"seed", seed}}, t);
  } else {
    p.write(Line{{"op", "compute"}, {"inputs", *ids}, {"output", out_id}, {"stream", stream}}, t);
  }
  return t;
}

Result<Ticket> RecordingPool::user(StreamId stream, std::span<const Operand> operands, UserKernel kernel,
                                   UserCost cost, std::string tag) {
  Impl& p = *impl_;
  std::vector<DeviceHandle> named;
  for (const Operand& o : operands) named.push_back(o.handle);
  std::optional<std::vector<std::string>> ids;
  if (check_stream(stream, "trace").ok() && !named.empty()) ids = p.lookup(named);
  else p.unrecorded();
  Line line{{"op", "user"}, {"stream", stream}};
  if (ids) {
    Line list = Line::array();
    for (std::size_t i = 0; i < operands.size(); ++i) {
      Line o{{"id", (*ids)[i]}, {"access", std::string(to_string(operands[i].access))}};
      if (operands[i].offset != 0) o["offset"] = operands[i].offset;
      if (operands[i].bytes != kRestOfBlock) o["bytes"] = operands[i].bytes;
      list.push_back(std::move(o));
    }
    line["operands"] = std::move(list);
    if (!tag.empty()) line["tag"] = tag;
  }
  Result<Ticket> t = p.up.user(stream, operands, std::move(kernel), cost, std::move(tag));
  if (ids) p.write(std::move(line), t);
  return t;
}

Result<Ticket> RecordingPool::copy_to_host(StreamId stream, DeviceHandle src, std::span<std::byte> dst) {
  Impl& p = *impl_;
  std::optional<std::vector<std::string>> id;
  if (check_stream(stream, "trace").ok()) id = p.lookup({&src, 1});
  else p.unrecorded();
  const bool captured = id && p.capturing_on(stream);
  Result<Ticket> t = p.up.copy_to_host(stream, src, dst);
  if (!id) return t;
  Line line{{"op", "check"}, {"id", (*id)[0]}};
  // In a capture it names the stream: the replay's graph copies at each launch.
  if (captured) line["stream"] = stream;
  p.write(std::move(line), t);
  return t;
}

Result<TransferReceipt> RecordingPool::upload(StreamId stream, const TransferPlan& plan) {
  Impl& p = *impl_;
  // One line per destination, in plan order.
  std::vector<DeviceHandle> dsts;
  for (const TransferRange& r : plan.ranges()) {
    if (std::find(dsts.begin(), dsts.end(), r.dst) == dsts.end()) dsts.push_back(r.dst);
  }
  std::optional<std::vector<std::string>> ids;
  if (check_stream(stream, "trace").ok() && !dsts.empty()) ids = p.lookup(dsts);
  else p.unrecorded();
  Result<TransferReceipt> receipt = p.up.upload(stream, plan);
  if (!ids || p.refused_in_capture(stream, receipt)) return receipt;
  std::lock_guard lock(p.mu);
  for (const std::string& id : *ids) {
    Line line{{"op", "upload"}, {"id", id}, {"stream", stream}, {"seed", p.next_seed++}};
    p.write_locked(std::move(line), receipt.ok() ? nullptr : &receipt.error());
  }
  return receipt;
}

Result<TransferReceipt> RecordingPool::download(StreamId stream, DeviceHandle src, std::uint64_t src_offset,
                                                std::span<std::byte> dst) {
  Impl& p = *impl_;
  std::optional<std::vector<std::string>> id;
  if (check_stream(stream, "trace").ok()) id = p.lookup({&src, 1});
  else p.unrecorded();
  Result<TransferReceipt> r = p.up.download(stream, src, src_offset, dst);
  if (id && !p.refused_in_capture(stream, r)) p.write(Line{{"op", "check"}, {"id", (*id)[0]}}, r);
  return r;
}

Result<TransferReceipt> RecordingPool::copy_on_device(StreamId stream, DeviceHandle dst, std::uint64_t dst_offset,
                                                      DeviceHandle src, std::uint64_t src_offset,
                                                      std::uint64_t bytes) {
  Impl& p = *impl_;
  const DeviceHandle named[] = {src, dst};
  std::optional<std::vector<std::string>> ids;
  if (check_stream(stream, "trace").ok()) ids = p.lookup(named);
  else p.unrecorded();
  Result<TransferReceipt> r = p.up.copy_on_device(stream, dst, dst_offset, src, src_offset, bytes);
  if (ids && !p.refused_in_capture(stream, r)) {
    Line line{{"op", "copy"}, {"src", (*ids)[0]}, {"dst", (*ids)[1]}, {"stream", stream}, {"bytes", bytes}};
    if (src_offset != 0) line["src_offset"] = src_offset;
    if (dst_offset != 0) line["dst_offset"] = dst_offset;
    p.write(std::move(line), r);
  }
  return r;
}

Result<void> RecordingPool::hold(StreamId stream) {
  Impl& p = *impl_;
  if (Result<void> s = check_stream(stream, "trace"); !s.ok()) {
    p.unrecorded();
    return s;
  }
  Result<void> r = p.up.hold(stream);
  p.write(Line{{"op", "hold"}, {"stream", stream}}, r);
  return r;
}

Result<void> RecordingPool::wait(StreamId stream, StreamId for_stream) {
  Impl& p = *impl_;
  for (StreamId s : {stream, for_stream}) {
    if (Result<void> bad = check_stream(s, "trace"); !bad.ok()) {
      p.unrecorded();
      return bad;
    }
  }
  Result<void> r = p.up.wait(stream, for_stream);
  p.write(Line{{"op", "wait"}, {"stream", stream}, {"for", for_stream}}, r);
  return r;
}

Result<void> RecordingPool::release(StreamId stream) {
  Impl& p = *impl_;
  if (Result<void> s = check_stream(stream, "trace"); !s.ok()) {
    p.unrecorded();
    return s;
  }
  Result<void> r = p.up.release(stream);
  p.write(Line{{"op", "release"}, {"stream", stream}}, r);
  return r;
}

Result<void> RecordingPool::synchronize(StreamId stream) {
  Impl& p = *impl_;
  if (Result<void> s = check_stream(stream, "trace"); !s.ok()) {
    p.unrecorded();
    return s;
  }
  Result<void> r = p.up.synchronize(stream);
  p.write(Line{{"op", "sync"}, {"stream", stream}}, r);
  return r;
}

Result<void> RecordingPool::synchronize() {
  Result<void> r = impl_->up.synchronize();
  impl_->write(Line{{"op", "sync"}}, r);
  return r;
}

Result<Ticket> RecordingPool::record_use(StreamId stream, std::span<const DeviceHandle> handles) {
  impl_->unrecorded();
  return impl_->up.record_use(stream, handles);
}

void RecordingPool::note_graph(const GraphEvent& event) {
  Impl& p = *impl_;
  p.up.note_graph(event);
  std::lock_guard lock(p.mu);
  const StreamId s = event.stream;
  const auto named = p.graphs.find(event.graph);
  switch (event.kind) {
    case GraphEvent::Kind::begin_capture: {
      Line line{{"op", "capture"}, {"phase", "begin"}, {"graph", "g" + std::to_string(++p.captures)}, {"stream", s}};
      if (std::optional<std::string> shared = p.graph_of_pool(event.pool); event.pool != 0 && shared) {
        line["pool"] = *shared;
      }
      if (event.error == nullptr) p.capturing[s] = line["graph"].get<std::string>();
      return p.write_locked(std::move(line), event.error);
    }
    case GraphEvent::Kind::end_capture: {
      if (!p.capturing[s]) break;  // begun before recording did
      const std::string name = *std::exchange(p.capturing[s], std::nullopt);  // ended, even when spoiled
      if (event.error == nullptr) p.graphs[event.graph] = {name, event.pool};
      return p.write_locked(Line{{"op", "capture"}, {"phase", "end"}, {"graph", name}, {"stream", s}}, event.error);
    }
    case GraphEvent::Kind::launch:
      if (named == p.graphs.end()) break;
      return p.write_locked(Line{{"op", "replay"}, {"graph", named->second.first}, {"stream", s}}, event.error);
    case GraphEvent::Kind::destroy: {
      if (named == p.graphs.end()) break;
      Line line{{"op", "capture"}, {"phase", "destroy"}, {"graph", named->second.first}};
      p.graphs.erase(named);
      return p.write_locked(std::move(line), event.error);
    }
  }
  ++p.st.unrecorded;  // a graph captured before recording began, or an empty one
}

std::optional<std::string> RecordingPool::id_of(DeviceHandle handle) const {
  std::lock_guard lock(impl_->mu);
  const Impl::Entry* e = impl_->find(handle);
  if (e == nullptr) return std::nullopt;
  return e->id;
}

RecordingStats RecordingPool::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->st;
}

Result<void> RecordingPool::status() const {
  std::lock_guard lock(impl_->mu);
  return impl_->write_status;
}

Result<void> RecordingPool::flush() {
  Impl& p = *impl_;
  std::lock_guard lock(p.mu);
  if (!p.write_status.ok()) return p.write_status;
  p.out.flush();
  if (!p.out) {
    p.write_status = make_error(ErrorCode::backend_error,
                                "flushing the trace failed after " + std::to_string(p.st.lines) + " lines");
  }
  return p.write_status;
}

}  // namespace ferry
