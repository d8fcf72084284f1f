// A PyTorch memory snapshot's history as a ferry trace (torch_snapshot.hpp;
// docs/spec.md §3 "PyTorch memory snapshots" gives the mapping).
#include "ferry/torch_snapshot.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ferry/names.hpp"
#include "ferry/stream.hpp"
#include "import/block_list.hpp"
#include "import/json_text.hpp"
#include "import/pickle.hpp"

namespace ferry {
namespace {

using import::Kind;
using import::Tree;
using import::Value;
using import::append_json_text;

// Every size and figure of one device's history stays below this: no device
// holds a pebibyte, and with each step checked against it no sum can overflow.
constexpr std::uint64_t kMaxDeviceBytes = std::uint64_t{1} << 50;
// A frame's tag ("file:line:name") is cut to this many bytes, so every line the
// importer writes is far inside the replayer's line limit (kMaxTraceLineBytes).
constexpr std::size_t kMaxTagBytes = 512;
// The trace text may be this many bytes per input byte (and a floor): a memo
// reference repeats an entry for two bytes, so the text is bounded separately.
constexpr std::uint64_t kTraceBytesPerInputByte = 64;
constexpr std::uint64_t kMinTraceBudget = std::uint64_t{1} << 20;

enum class Action : std::uint8_t {
  alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot
};

// The history's actions, as PyTorch's CUDACachingAllocator names them.
constexpr NamedValue<Action> kActions[] = {
    {Action::alloc, "alloc"},
    {Action::free_requested, "free_requested"},
    {Action::free_completed, "free_completed"},
    {Action::segment_alloc, "segment_alloc"},
    {Action::segment_free, "segment_free"},
    {Action::segment_map, "segment_map"},
    {Action::segment_unmap, "segment_unmap"},
    {Action::oom, "oom"},
    {Action::snapshot, "snapshot"},
};

std::optional<Action> parse_action(std::string_view s) noexcept {
  for (const NamedValue<Action>& n : kActions) {
    if (n.name == s) return n.value;
  }
  return std::nullopt;
}

// One line of the trace to be: an alloc or a free of id `id`.
struct TraceLine {
  std::uint64_t bytes = 0;
  std::uint32_t id = 0;  // allocation number; reconstructed blocks have their own numbers
  std::uint32_t tag = 0;  // index into tags; 0: none
  bool alloc = false;
  bool reconstructed = false;
  std::uint8_t stream = 0;
};

struct Block {
  std::uint32_t id = 0;
  std::uint32_t tag = 0;
  bool reconstructed = false;
  std::uint64_t size = 0;
  bool free_requested = false;
  std::uint64_t requested_at = 0;  // entry index of its free_requested
  std::uint64_t since = 0;         // entry index of its alloc (a reconstructed block: of its first free)
};

// A history entry as read from the pickle: what the walk needs, nothing more.
struct Entry {
  std::uint64_t addr = 0, size = 0, stream = 0;
  std::uint32_t tag = 0;
  Action action = Action::snapshot;
};

// A device's history taken as the unpickler appended it (the tree never holds it).
struct History {
  import::BlockList<Entry> entries;  // up to the first entry that could not be read
  std::uint64_t count = 0;       // entries appended
  std::string problem;           // that entry's problem, after its location
};

class Importer final : public import::AppendSink {
 public:
  explicit Importer(std::string_view name) : name_(name) { tags_.emplace_back(); }

  bool take(const Tree& tree, Value list, const Value* items, std::size_t count) override {
    auto it = histories_.find(Tree::container_id(list));
    if (it == histories_.end()) {
      // A list becomes a history when its first item is a dict with an action.
      if (tree.size(list) != 0 || items[0].kind() != Kind::dict || !tree.find(items[0], "action")) return false;
      it = histories_.emplace(Tree::container_id(list), History{}).first;
    }
    History& h = it->second;
    for (std::size_t i = 0; i < count; ++i, ++h.count) {
      if (!h.problem.empty()) continue;
      Entry e;
      h.problem = read_entry(tree, items[i], e);
      if (h.problem.empty()) h.entries.push_back(e);
    }
    spent_ = spent_ || tree.exhausted();
    return true;
  }

  // A frames list or a frame dict is kept as its tag; the rest is not needed again.
  std::optional<std::uint64_t> keep(const Tree& tree, Value v) override {
    std::uint32_t tag = 0;
    std::optional<std::uint64_t> kept;
    if (v.kind() == Kind::list) {
      if (frames_tag(tree, v, tag).empty()) kept = tag;
    } else if (v.kind() == Kind::dict && tree.find(v, "filename")) {
      if (frame_tag(tree, v, tag).empty()) kept = tag;
    }
    spent_ = spent_ || tree.exhausted();
    return kept;
  }

  // True when a read of the tree ran out of its visit budget: what was read may
  // be short, so nothing read may be reported.
  bool spent() const noexcept { return spent_; }

  // Reads the tree (which may be dropped after) and returns the source figures.
  Result<TorchSnapshotSource> run(const Tree& tree, std::optional<int> device) {
    tree_ = &tree;
    const Value root = tree.root();
    if (root.kind() != Kind::dict) return fail("the pickle holds a " + kind(root) + ", not a snapshot dict");
    const std::optional<Value> traces = tree.find(root, "device_traces");
    if (!traces) return fail("no device_traces: not a memory snapshot with history (record it with _record_memory_history)");
    if (traces->kind() != Kind::list) return fail("device_traces is a " + kind(*traces) + ", not a list");
    std::vector<Value> lists;
    std::string problem;
    tree.for_each(*traces, [&](Value v) {
      if (v.kind() != Kind::list) {
        problem = "device_traces[" + std::to_string(lists.size()) + "] is a " + kind(v) + ", not a list";
        return false;
      }
      lists.push_back(v);
      return true;
    });
    if (!problem.empty()) return fail(problem);
    if (lists.empty()) return fail("device_traces is empty: no device has a history");
    const auto entries = [&](Value list) {
      const auto h = histories_.find(Tree::container_id(list));
      return h == histories_.end() ? tree.size(list) : h->second.count;
    };
    source_.devices = static_cast<int>(lists.size());
    if (device) {
      if (*device < 0 || static_cast<std::size_t>(*device) >= lists.size()) {
        return fail("--device " + std::to_string(*device) + ": the snapshot has histories for devices 0.." +
                    std::to_string(lists.size() - 1));
      }
      device_ = *device;
    } else {
      for (std::size_t d = 1; d < lists.size(); ++d) {
        if (entries(lists[d]) > entries(lists[static_cast<std::size_t>(device_)])) device_ = static_cast<int>(d);
      }
    }
    source_.device = device_;
    const Value history = lists[static_cast<std::size_t>(device_)];
    source_.events = entries(history);
    if (source_.events == 0) return fail("device " + std::to_string(device_) + " has no history");
    lines_.reserve(source_.events);

    std::uint64_t index = 0;
    if (const auto h = histories_.find(Tree::container_id(history)); h != histories_.end()) {
      const import::BlockList<Entry>& taken = h->second.entries;
      for (std::size_t i = 0; i < taken.size() && problem.empty(); ++i) problem = walk(taken[i], index++);
      if (problem.empty() && !h->second.problem.empty()) problem = where(index) + h->second.problem;
    } else {
      tree.for_each(history, [&](Value item) {
        Entry e;
        if (problem = read_entry(tree, item, e); !problem.empty()) {
          problem = where(index) + problem;
          return false;
        }
        problem = walk(e, index++);
        return problem.empty();
      });
    }
    if (!problem.empty()) return fail(problem);
    histories_.clear();
    if (std::string why = read_segments(); !why.empty()) return fail(why);

    // Each term is below kMaxDeviceBytes (checked where it grew): no sum here overflows.
    source_.peak_requested_bytes = initial_requested_ + max_requested_delta_;
    if (source_.peak_requested_bytes > kMaxDeviceBytes) {
      return fail(beyond("its blocks alive before it began and those live at " + where(max_requested_at_),
                         source_.peak_requested_bytes));
    }
    const std::int64_t initial_reserved = static_cast<std::int64_t>(final_reserved_) - reserved_delta_;
    if (initial_reserved > static_cast<std::int64_t>(kMaxDeviceBytes)) {
      return fail(beyond("the segments' bytes at the snapshot and those the history freed beyond what it allocated",
                         static_cast<std::uint64_t>(initial_reserved)));
    }
    source_.peak_reserved_bytes =
        static_cast<std::uint64_t>(std::max<std::int64_t>(0, initial_reserved) + max_reserved_delta_);
    if (source_.peak_reserved_bytes > kMaxDeviceBytes) {
      return fail(beyond("PyTorch's reserved bytes before the history and at " + where(max_reserved_at_),
                         source_.peak_reserved_bytes));
    }
    // Steps were taken at history lines; the reconstructed allocs come first in the trace.
    source_.reserved_steps.reserve(reserved_steps_.size() + 1);
    const std::int64_t before = std::max<std::int64_t>(0, initial_reserved);  // as peak_reserved_bytes counts it
    source_.reserved_steps.emplace_back(0, static_cast<std::uint64_t>(before));
    for (const auto& [line, delta] : reserved_steps_) {
      const auto bytes = static_cast<std::uint64_t>(std::max<std::int64_t>(0, before + delta));
      const std::uint64_t after = reconstructed_.size() + line;
      if (source_.reserved_steps.back().first == after) {
        source_.reserved_steps.back().second = bytes;
      } else {
        source_.reserved_steps.emplace_back(after, bytes);
      }
    }
    source_.reconstructed_blocks = reconstructed_.size();
    source_.streams = stream_count_;
    tree_ = nullptr;
    return source_;
  }

  // The trace text; call after the tree is gone (the peak is then file + text).
  // Refused when it would exceed kTraceBytesPerInputByte per byte of the input.
  Result<std::string> render(std::size_t input_bytes) const {
    // Sized exactly first: growing by doubling would hold the text twice at the peak.
    std::size_t total = 0;
    std::string scratch;
    for (const auto* part : {&reconstructed_, &lines_}) {
      for (const TraceLine& l : *part) {
        scratch.clear();
        line_into(scratch, l);
        total += scratch.size();
      }
    }
    const std::uint64_t budget = kMinTraceBudget + kTraceBytesPerInputByte * input_bytes;
    if (total > budget) {
      return fail("its trace would be " + std::to_string(total) + " bytes, over " +
                  std::to_string(kTraceBytesPerInputByte) + " bytes per byte of the file (" + std::to_string(budget) +
                  "): its entries repeat shared values too often to be a recorded history");
    }
    std::string out;
    out.reserve(total);
    for (const TraceLine& l : reconstructed_) line_into(out, l);
    for (const TraceLine& l : lines_) line_into(out, l);
    return out;
  }

  Error budget_spent(std::size_t input_bytes) const {
    return fail("reading it takes more than " + std::to_string(import::kVisitsPerInputByte) +
                " visits per byte (" + std::to_string(import::visit_budget(input_bytes)) +
                " for this file): its values are shared too often to be a recorded history");
  }

 private:
  Error fail(const std::string& why) const {
    return make_error(ErrorCode::invalid_argument, std::string(name_) + ": " + why);
  }
  static std::string kind(Value v) { return std::string(import::to_string(v.kind())); }

  std::string where(std::uint64_t index) const {
    return "device_traces[" + std::to_string(device_) + "][" + std::to_string(index) + "]";
  }
  static std::string beyond(const std::string& what, std::uint64_t bytes) {
    return what + " come to " + std::to_string(bytes) + " bytes, beyond any device (" +
           std::to_string(kMaxDeviceBytes) + "): the history cannot be true";
  }
  static std::string range(std::uint64_t addr, std::uint64_t size) {
    return "[" + std::to_string(addr) + ", " + std::to_string(addr + size) + ")";
  }

  // An int field in [0, 2^64): "" and the value, or why not (after the dict's location).
  static std::string u64(const Tree& tree, Value dict, std::string_view field, std::uint64_t& out,
                         bool required = true) {
    const auto at = [&] { return "." + std::string(field); };
    const std::optional<Value> v = tree.find(dict, field);
    if (!v) return required ? at() + ": missing" : "";
    const std::optional<import::Integer> i = tree.integer(*v);
    if (!i || v->kind() == Kind::boolean) return at() + ": a " + kind(*v) + ", not an int";
    if (!i->in_range) return at() + ": out of range";
    if (i->negative && i->magnitude != 0) return at() + ": negative (-" + std::to_string(i->magnitude) + ")";
    out = i->magnitude;
    return "";
  }

  template <class Loc>
  std::string stream_of(std::uint64_t raw, const Loc& at, std::uint8_t& out) {
    if (raw == 0) {
      if (!seen_default_) {
        seen_default_ = true;
        ++stream_count_;
      }
      out = 0;
      return "";
    }
    auto [it, fresh] = streams_.try_emplace(raw, 0);
    if (fresh) {
      if (streams_.size() >= kMaxStreams) {
        return at() + ".stream: a " + std::to_string(kMaxStreams) + "th stream besides the default one; ferry has streams 0.." +
               std::to_string(kMaxStreams - 1);
      }
      it->second = static_cast<std::uint8_t>(streams_.size());
      ++stream_count_;
    }
    out = it->second;
    return "";
  }

  // A frame dict as "file:line:name", interned (a kept one is its tag already).
  std::string frame_tag(const Tree& tree, Value frame, std::uint32_t& tag) {
    if (const std::optional<std::uint64_t> kept = tree.external(frame)) {
      tag = static_cast<std::uint32_t>(*kept);
      return "";
    }
    if (frame.kind() != Kind::dict) return ": a " + kind(frame) + ", not a dict";
    const std::optional<Value> file = tree.find(frame, "filename");
    const std::optional<Value> func = tree.find(frame, "name");
    std::uint64_t line = 0;
    if (!file || file->kind() != Kind::string) return ".filename: missing or not a str";
    if (!func || func->kind() != Kind::string) return ".name: missing or not a str";
    if (std::string why = u64(tree, frame, "line", line); !why.empty()) return why;
    std::string text(tree.string(*file)->substr(0, kMaxTagBytes));
    text += ':' + std::to_string(line) + ':';
    text += tree.string(*func)->substr(0, kMaxTagBytes);
    cut_tag(text);
    auto [it, fresh] = tag_index_.try_emplace(text, static_cast<std::uint32_t>(tags_.size()));
    if (fresh) tags_.push_back(std::move(text));
    tag = it->second;
    return "";
  }
  // Cut at a UTF-8 boundary with "..." at the end, so the tag stays readable.
  static void cut_tag(std::string& text) {
    if (text.size() <= kMaxTagBytes) return;
    std::size_t end = kMaxTagBytes - 3;
    while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
    text.resize(end);
    text += "...";
  }
  // The top frame of a frames list (0: none).
  std::string frames_tag(const Tree& tree, Value frames, std::uint32_t& tag) {
    tag = 0;
    if (const std::optional<std::uint64_t> kept = tree.external(frames)) {
      tag = static_cast<std::uint32_t>(*kept);
      return "";
    }
    if (frames.kind() == Kind::none) return "";
    if (frames.kind() != Kind::list) return ": a " + kind(frames) + ", not a list";
    std::optional<Value> top;
    tree.for_each(frames, [&](Value f) {
      top = f;
      return false;
    });
    if (!top) return "";
    if (std::string why = frame_tag(tree, *top, tag); !why.empty()) return "[0]" + why;
    return "";
  }
  // The dict's top frame (`frames`, or `history` in older snapshots).
  std::string top_frame(const Tree& tree, Value dict, std::uint32_t& tag) {
    tag = 0;
    std::optional<Value> frames = tree.find(dict, "frames");
    if (!frames) frames = tree.find(dict, "history");
    if (!frames) return "";
    if (std::string why = frames_tag(tree, *frames, tag); !why.empty()) return ".frames" + why;
    return "";
  }

  // One entry's fields and types; "" or its problem (after the entry's location).
  std::string read_entry(const Tree& tree, Value entry, Entry& e) {
    if (entry.kind() != Kind::dict) return ": a " + kind(entry) + ", not a dict";
    const std::optional<Value> a = tree.find(entry, "action");
    if (!a) return ".action: missing";
    if (a->kind() != Kind::string) return ".action: a " + kind(*a) + ", not a str";
    const std::optional<Action> action = parse_action(*tree.string(*a));
    if (!action) {
      std::string shown;
      append_json_text(shown, tree.string(*a)->substr(0, 40));
      return ".action: unknown action '" + shown + "'";
    }
    e.action = *action;
    switch (*action) {
      case Action::snapshot: return "";
      case Action::oom: {
        std::uint64_t ignored = 0;
        if (std::string why = u64(tree, entry, "size", ignored, false); !why.empty()) return why;
        return u64(tree, entry, "device_free", ignored, false);
      }
      default: break;
    }
    if (std::string why = u64(tree, entry, "addr", e.addr); !why.empty()) return why;
    if (std::string why = u64(tree, entry, "size", e.size); !why.empty()) return why;
    if (e.size > kMaxDeviceBytes) return ".size: " + std::to_string(e.size) + " is beyond any device";
    if (e.addr > ~std::uint64_t{0} - e.size) return ".addr: the block would end past 2^64";
    if (std::string why = u64(tree, entry, "stream", e.stream, *action == Action::alloc); !why.empty()) return why;
    if (*action == Action::alloc || *action == Action::free_requested || *action == Action::free_completed) {
      return top_frame(tree, entry, e.tag);
    }
    return "";
  }

  // |delta| <= kMaxDeviceBytes on entry and on return (or an error): the sums never overflow.
  std::string requested(std::int64_t delta, std::uint64_t index) {
    requested_delta_ += delta;
    const std::int64_t live = static_cast<std::int64_t>(initial_requested_) + requested_delta_;
    if (live > static_cast<std::int64_t>(kMaxDeviceBytes) ||
        requested_delta_ < -static_cast<std::int64_t>(kMaxDeviceBytes)) {
      return where(index) + ": " + beyond("the live blocks", static_cast<std::uint64_t>(std::max<std::int64_t>(0, live)));
    }
    if (requested_delta_ > 0 && static_cast<std::uint64_t>(requested_delta_) > max_requested_delta_) {
      max_requested_delta_ = static_cast<std::uint64_t>(requested_delta_);
      max_requested_at_ = index;
    }
    return "";
  }
  std::string reserved(std::int64_t delta, std::uint64_t index) {
    reserved_delta_ += delta;
    if (reserved_delta_ > static_cast<std::int64_t>(kMaxDeviceBytes) ||
        reserved_delta_ < -static_cast<std::int64_t>(kMaxDeviceBytes)) {
      return where(index) + ": " +
             beyond("the segments it allocated or freed", static_cast<std::uint64_t>(
                                                              reserved_delta_ < 0 ? -reserved_delta_ : reserved_delta_));
    }
    if (reserved_delta_ > max_reserved_delta_) {
      max_reserved_delta_ = reserved_delta_;
      max_reserved_at_ = index;
    }
    if (!reserved_steps_.empty() && reserved_steps_.back().first == lines_.size()) {
      reserved_steps_.back().second = reserved_delta_;
    } else {
      reserved_steps_.emplace_back(lines_.size(), reserved_delta_);
    }
    return "";
  }

  // Two live blocks never share a byte: "" or the problem naming both entries.
  std::string overlap(std::uint64_t addr, std::uint64_t size, std::uint64_t index) const {
    auto next = live_.lower_bound(addr);
    const auto clash = [&](const std::pair<const std::uint64_t, Block>& other) {
      return where(index) + ".addr: the block " + range(addr, size) + " overlaps the live block " +
             range(other.first, other.second.size) + " of " + where(other.second.since);
    };
    if (next != live_.end() && next->first < addr + size) return clash(*next);
    if (next != live_.begin()) {
      const auto& prev = *std::prev(next);
      if (prev.first + prev.second.size > addr) return clash(prev);
    }
    return "";
  }

  std::string walk(const Entry& e, std::uint64_t index) {
    const auto at = [&] { return where(index); };
    const auto signed_size = static_cast<std::int64_t>(e.size);
    switch (e.action) {
      case Action::snapshot: return "";
      case Action::oom: ++source_.ooms; return "";
      case Action::segment_alloc:
      case Action::segment_map:
        ++source_.segment_allocs;
        return reserved(signed_size, index);
      case Action::segment_free:
      case Action::segment_unmap:
        return reserved(-signed_size, index);
      case Action::alloc: {
        if (e.size == 0) return at() + ".size: 0 (an allocation of 0 bytes)";
        if (auto it = live_.find(e.addr); it != live_.end()) {
          return at() + ".addr: a second alloc at live address " + std::to_string(e.addr) + " (allocated at " +
                 where(it->second.since) + ")";
        }
        if (std::string why = overlap(e.addr, e.size, index); !why.empty()) return why;
        std::uint8_t stream = 0;
        if (std::string why = stream_of(e.stream, at, stream); !why.empty()) return why;
        const auto id = static_cast<std::uint32_t>(source_.allocs++);
        live_.emplace(e.addr, Block{id, e.tag, false, e.size, false, 0, index});
        seen_.insert(e.addr);
        freed_.erase(e.addr);
        lines_.push_back(TraceLine{e.size, id, e.tag, true, false, stream});
        return requested(signed_size, index);
      }
      case Action::free_requested:
      case Action::free_completed: {
        auto it = live_.find(e.addr);
        if (it == live_.end()) {
          // A block the history freed is not alive before it: a second free is a contradiction.
          if (const auto f = freed_.find(e.addr); f != freed_.end()) {
            return at() + ".addr: a free of address " + std::to_string(e.addr) + ", freed already at " +
                   where(f->second) + " and not allocated since";
          }
          // Alive before the history starts: the ring buffer dropped its alloc.
          if (std::string why = overlap(e.addr, e.size, index); !why.empty()) return why;
          std::uint8_t stream = 0;
          if (std::string why = stream_of(e.stream, at, stream); !why.empty()) return why;
          if (initial_requested_ + e.size > kMaxDeviceBytes) {
            return at() + ": " + beyond("the blocks alive before the history", initial_requested_ + e.size);
          }
          const auto id = static_cast<std::uint32_t>(reconstructed_.size());
          reconstructed_.push_back(TraceLine{e.size, id, e.tag, true, true, stream});
          initial_requested_ += e.size;
          it = live_.emplace(e.addr, Block{id, e.tag, true, e.size, false, 0, index}).first;
          seen_.insert(e.addr);
        }
        Block& b = it->second;
        if (e.action == Action::free_requested) {
          if (b.free_requested) return at() + ".addr: a second free_requested of address " + std::to_string(e.addr);
          b.free_requested = true;
          b.requested_at = index;
          return "";
        }
        if (b.free_requested && index > b.requested_at + 1) ++source_.deferred_frees;
        lines_.push_back(TraceLine{0, b.id, b.tag, false, b.reconstructed, 0});
        ++source_.frees;
        const std::int64_t size = static_cast<std::int64_t>(b.size);
        live_.erase(it);
        freed_[e.addr] = index;
        return requested(-size, index);
      }
    }
    return "";
  }

  // The allocator's state at the snapshot: reserved bytes, and active blocks
  // whose alloc the history does not hold.
  std::string read_segments() {
    const Tree& tree = *tree_;
    const std::optional<Value> segments = tree.find(tree.root(), "segments");
    if (!segments) return "";
    if (segments->kind() != Kind::list) return "segments: a " + kind(*segments) + ", not a list";
    std::string problem;
    std::uint64_t s = 0;
    tree.for_each(*segments, [&](Value seg) {
      const std::uint64_t seg_index = s++;
      const auto at = [&] { return "segments[" + std::to_string(seg_index) + "]"; };
      if (seg.kind() != Kind::dict) {
        problem = at() + ": a " + kind(seg) + ", not a dict";
        return false;
      }
      std::uint64_t dev = 0, total = 0, raw_stream = 0;
      if (problem = u64(tree, seg, "device", dev); !problem.empty()) return (problem = at() + problem), false;
      if (dev != static_cast<std::uint64_t>(device_)) return true;
      if (problem = u64(tree, seg, "total_size", total); !problem.empty()) return (problem = at() + problem), false;
      if (total > kMaxDeviceBytes - final_reserved_) {  // final_reserved_ <= kMaxDeviceBytes: no wrap
        problem = at() + ".total_size: " + std::to_string(total) + " bytes on top of the segments before it (" +
                  std::to_string(final_reserved_) + ") is beyond any device";
        return false;
      }
      if (problem = u64(tree, seg, "stream", raw_stream, false); !problem.empty()) {
        return (problem = at() + problem), false;
      }
      final_reserved_ += total;
      const std::optional<Value> blocks = tree.find(seg, "blocks");
      if (!blocks) return true;
      if (blocks->kind() != Kind::list) {
        problem = at() + ".blocks: a " + kind(*blocks) + ", not a list";
        return false;
      }
      std::uint64_t b = 0;
      tree.for_each(*blocks, [&](Value block) {
        const std::uint64_t block_index = b++;
        problem = read_block(block, [&] { return at() + ".blocks[" + std::to_string(block_index) + "]"; }, raw_stream);
        return problem.empty();
      });
      return problem.empty();
    });
    return problem;
  }

  template <class Loc>
  std::string read_block(Value block, const Loc& at, std::uint64_t raw_stream) {
    const Tree& tree = *tree_;
    if (block.kind() != Kind::dict) return at() + ": a " + kind(block) + ", not a dict";
    std::uint64_t addr = 0, size = 0, requested_size = 0;
    if (std::string why = u64(tree, block, "address", addr); !why.empty()) return at() + why;
    if (std::string why = u64(tree, block, "size", size); !why.empty()) return at() + why;
    requested_size = size;
    if (std::string why = u64(tree, block, "requested_size", requested_size, false); !why.empty()) {
      return at() + why;
    }
    if (requested_size > kMaxDeviceBytes) return at() + ".requested_size: " + beyond("the block", requested_size);
    const std::optional<Value> state = tree.find(block, "state");
    if (!state || state->kind() != Kind::string) return at() + ".state: missing or not a str";
    const std::string_view st = *tree.string(*state);
    if (st != "active_allocated" && st != "active_awaiting_free") return "";
    // One address holds one active block: a second listing would count it twice.
    if (auto [listed, fresh] = active_listed_.try_emplace(addr, at()); !fresh) {
      return at() + ".address: the active block at " + std::to_string(addr) + " is listed already as " +
             listed->second;
    }
    // An address the history touched holds a block the history accounts for.
    if (live_.count(addr) != 0 || seen_.count(addr) != 0) return "";
    if (requested_size == 0) return "";
    std::uint8_t stream = 0;
    if (std::string why = stream_of(raw_stream, at, stream); !why.empty()) return why;
    std::uint32_t tag = 0;
    if (std::string why = top_frame(tree, block, tag); !why.empty()) return at() + why;
    if (initial_requested_ + requested_size > kMaxDeviceBytes) {
      return at() + ": " + beyond("the blocks alive before the history", initial_requested_ + requested_size);
    }
    const auto id = static_cast<std::uint32_t>(reconstructed_.size());
    reconstructed_.push_back(TraceLine{requested_size, id, tag, true, true, stream});
    initial_requested_ += requested_size;
    return "";
  }

  static void number_into(std::string& out, std::uint64_t v) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
  }
  void line_into(std::string& out, const TraceLine& l) const {
    out += l.alloc ? "{\"op\":\"alloc\",\"id\":\"" : "{\"op\":\"free\",\"id\":\"";
    out += l.reconstructed ? 'r' : 'a';
    number_into(out, l.id);
    if (l.tag != 0) {  // the id names the program's line: race reports and the snapshot page show ids
      out += ' ';
      append_json_text(out, tags_[l.tag]);
    }
    out += '"';
    if (l.alloc) {
      out += ",\"bytes\":";
      number_into(out, l.bytes);
      out += ",\"stream\":";
      number_into(out, l.stream);
      if (l.tag != 0) {
        out += ",\"tag\":\"";
        append_json_text(out, tags_[l.tag]);
        out += '"';
      }
    }
    out += "}\n";
  }
  const Tree* tree_ = nullptr;  // set while run() reads it
  std::string_view name_;
  std::unordered_map<std::uint64_t, History> histories_;  // by the list's container id, during the parse
  int device_ = 0;
  TorchSnapshotSource source_;
  std::vector<TraceLine> lines_;
  std::vector<TraceLine> reconstructed_;
  std::map<std::uint64_t, Block> live_;  // ordered: a new block is checked against its neighbours
  std::unordered_set<std::uint64_t> seen_;  // addresses of the history's allocs and reconstructed frees
  std::unordered_map<std::uint64_t, std::uint64_t> freed_;  // address -> entry that freed it, until allocated again
  std::unordered_map<std::uint64_t, std::string> active_listed_;  // segments' active blocks -> where listed
  std::unordered_map<std::uint64_t, std::uint8_t> streams_;
  bool seen_default_ = false;
  std::uint64_t stream_count_ = 0;
  std::vector<std::string> tags_;
  std::unordered_map<std::string, std::uint32_t> tag_index_;
  // Each below kMaxDeviceBytes in magnitude, checked as it changes.
  std::uint64_t initial_requested_ = 0, max_requested_delta_ = 0, final_reserved_ = 0;
  std::int64_t requested_delta_ = 0, reserved_delta_ = 0, max_reserved_delta_ = 0;
  std::uint64_t max_requested_at_ = 0, max_reserved_at_ = 0;  // entries where the deltas peaked
  bool spent_ = false;
  std::vector<std::pair<std::uint64_t, std::int64_t>> reserved_steps_;  // {history lines before, reserved_delta_}
};

}  // namespace

bool is_torch_snapshot(std::string_view bytes) noexcept { return import::is_pickle(bytes); }

Result<TorchSnapshotImport> import_torch_snapshot(std::string_view bytes, std::string_view name,
                                                  std::optional<int> device) {
  try {
    Importer importer(name);
    Result<Tree> tree = import::unpickle(bytes, &importer, import::visit_budget(bytes.size()));
    // A spent budget comes first: a problem found after it may be an artifact of a short read.
    if (importer.spent()) return importer.budget_spent(bytes.size());
    if (!tree.ok()) {
      Error e = std::move(tree).error();
      e.message = std::string(name) + ": " + e.message;
      return e;
    }
    std::optional<Tree> held(std::move(tree).value());
    Result<TorchSnapshotSource> source = importer.run(*held, device);
    const bool spent = held->exhausted();
    held.reset();  // the tree is the largest thing; the trace text is built without it
    if (spent) return importer.budget_spent(bytes.size());
    if (!source.ok()) return std::move(source).error();
    Result<std::string> trace = importer.render(bytes.size());
    if (!trace.ok()) return std::move(trace).error();
    TorchSnapshotImport out;
    out.source = *source;
    out.trace = std::move(trace).value();
    return out;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, std::string(name) + ": host memory cannot hold the import");
  }
}

std::string source_json(const TorchSnapshotSource& s) {
  std::string out = "{\"format\":\"" + s.format + "\"";
  const auto field = [&out](const char* key, std::uint64_t v) {
    out += ",\"";
    out += key;
    out += "\":";
    out += std::to_string(v);
  };
  field("device", static_cast<std::uint64_t>(s.device));
  field("events", s.events);
  field("allocs", s.allocs);
  field("frees", s.frees);
  field("streams", s.streams);
  field("reconstructed_blocks", s.reconstructed_blocks);
  field("peak_requested_bytes", s.peak_requested_bytes);
  field("peak_reserved_bytes", s.peak_reserved_bytes);
  field("segment_allocs", s.segment_allocs);
  field("ooms", s.ooms);
  out += '}';
  return out;
}

}  // namespace ferry
