// A PyTorch memory snapshot's history as a ferry trace (torch_snapshot.hpp;
// docs/spec.md §3 "PyTorch memory snapshots" gives the mapping).
#include "ferry/torch_snapshot.hpp"

#include <algorithm>
#include <charconv>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "import/pickle.hpp"

namespace ferry {
namespace {

using import::Kind;
using import::Tree;
using import::Value;

constexpr std::size_t kMaxStreams = 64;  // ferry's streams: 0..63 (docs/spec.md §3)

enum class Action : std::uint8_t {
  alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot
};

std::optional<Action> parse_action(std::string_view s) noexcept {
  if (s == "alloc") return Action::alloc;
  if (s == "free_requested") return Action::free_requested;
  if (s == "free_completed") return Action::free_completed;
  if (s == "segment_alloc") return Action::segment_alloc;
  if (s == "segment_free") return Action::segment_free;
  if (s == "segment_map") return Action::segment_map;
  if (s == "segment_unmap") return Action::segment_unmap;
  if (s == "oom") return Action::oom;
  if (s == "snapshot") return Action::snapshot;
  return std::nullopt;
}

// One line of the trace to be: an alloc or a free of id `id`.
struct TraceLine {
  bool alloc = false;
  std::uint32_t id = 0;  // allocation number; reconstructed blocks have their own numbers
  bool reconstructed = false;
  std::uint64_t bytes = 0;
  std::uint8_t stream = 0;
  std::uint32_t tag = 0;  // index into tags; 0: none
};

struct Block {
  std::uint32_t id = 0;
  std::uint32_t tag = 0;
  bool reconstructed = false;
  std::uint64_t size = 0;
  bool free_requested = false;
  std::uint64_t requested_at = 0;  // entry index of its free_requested
};

class Importer {
 public:
  Importer(const Tree& tree, std::string_view name) : tree_(&tree), name_(name) { tags_.emplace_back(); }

  // Walks the tree (which may be dropped after) and returns the source figures.
  Result<TorchSnapshotSource> run(std::optional<int> device) {
    const Value root = tree_->root();
    if (root.kind() != Kind::dict) return fail("the pickle holds a " + kind(root) + ", not a snapshot dict");
    const std::optional<Value> traces = tree_->find(root, "device_traces");
    if (!traces) return fail("no device_traces: not a memory snapshot with history (record it with _record_memory_history)");
    if (traces->kind() != Kind::list) return fail("device_traces is a " + kind(*traces) + ", not a list");
    std::vector<Value> lists;
    std::string problem;
    tree_->for_each(*traces, [&](Value v) {
      if (v.kind() != Kind::list) {
        problem = "device_traces[" + std::to_string(lists.size()) + "] is a " + kind(v) + ", not a list";
        return false;
      }
      lists.push_back(v);
      return true;
    });
    if (!problem.empty()) return fail(problem);
    if (lists.empty()) return fail("device_traces is empty: no device has a history");
    source_.devices = static_cast<int>(lists.size());
    if (device) {
      if (*device < 0 || static_cast<std::size_t>(*device) >= lists.size()) {
        return fail("--device " + std::to_string(*device) + ": the snapshot has histories for devices 0.." +
                    std::to_string(lists.size() - 1));
      }
      device_ = *device;
    } else {
      for (std::size_t d = 1; d < lists.size(); ++d) {
        if (tree_->size(lists[d]) > tree_->size(lists[static_cast<std::size_t>(device_)])) device_ = static_cast<int>(d);
      }
    }
    source_.device = device_;
    const Value history = lists[static_cast<std::size_t>(device_)];
    if (tree_->size(history) == 0) return fail("device " + std::to_string(device_) + " has no history");
    source_.events = tree_->size(history);
    lines_.reserve(source_.events);

    std::uint64_t index = 0;
    tree_->for_each(history, [&](Value entry) {
      problem = walk(entry, index++);
      return problem.empty();
    });
    if (!problem.empty()) return fail(problem);
    if (std::string why = read_segments(); !why.empty()) return fail(why);

    source_.peak_requested_bytes = initial_requested_ + max_requested_delta_;
    const std::int64_t initial_reserved = static_cast<std::int64_t>(final_reserved_) - reserved_delta_;
    source_.peak_reserved_bytes =
        static_cast<std::uint64_t>(std::max<std::int64_t>(0, initial_reserved) + max_reserved_delta_);
    source_.reconstructed_blocks = reconstructed_.size();
    source_.streams = stream_count_;
    return source_;
  }

  // The trace text; call after the tree is gone (the peak is then file + text).
  std::string render() const {
    std::string out;
    out.reserve((reconstructed_.size() + lines_.size()) * 48);
    for (const TraceLine& l : reconstructed_) line_into(out, l);
    for (const TraceLine& l : lines_) line_into(out, l);
    return out;
  }

 private:
  Error fail(const std::string& why) const {
    return make_error(ErrorCode::invalid_argument, std::string(name_) + ": " + why);
  }
  static std::string kind(Value v) { return std::string(import::to_string(v.kind())); }

  std::string where(std::uint64_t index, std::string_view field) const {
    return "device_traces[" + std::to_string(device_) + "][" + std::to_string(index) + "]." + std::string(field);
  }

  // An int field in [0, 2^64): "" and the value, or why not.
  // `at` builds the entry's location, only when there is a problem to name.
  template <class Loc>
  std::string u64(Value dict, std::string_view field, const Loc& loc, std::uint64_t& out, bool required = true) const {
    const auto at = [&] { return loc() + "." + std::string(field); };
    const std::optional<Value> v = tree_->find(dict, field);
    if (!v) return required ? at() + ": missing" : "";
    const std::optional<import::Integer> i = tree_->integer(*v);
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
        return at() + ".stream: a 64th stream besides the default one; ferry has streams 0..63";
      }
      it->second = static_cast<std::uint8_t>(streams_.size());
      ++stream_count_;
    }
    out = it->second;
    return "";
  }

  // The top frame as "file:line:name", interned; 0 when there is none.
  template <class Loc>
  std::string top_frame(Value dict, const Loc& at, std::uint32_t& tag) {
    tag = 0;
    std::optional<Value> frames = tree_->find(dict, "frames");
    if (!frames) frames = tree_->find(dict, "history");  // older snapshots
    if (!frames || frames->kind() == Kind::none) return "";
    if (frames->kind() != Kind::list) return at() + ".frames: a " + kind(*frames) + ", not a list";
    std::optional<Value> top;
    tree_->for_each(*frames, [&](Value f) {
      top = f;
      return false;
    });
    if (!top) return "";
    if (top->kind() != Kind::dict) return at() + ".frames[0]: a " + kind(*top) + ", not a dict";
    const std::optional<Value> file = tree_->find(*top, "filename");
    const std::optional<Value> func = tree_->find(*top, "name");
    std::uint64_t line = 0;
    if (!file || file->kind() != Kind::string) return at() + ".frames[0].filename: missing or not a str";
    if (!func || func->kind() != Kind::string) return at() + ".frames[0].name: missing or not a str";
    if (std::string why = u64(*top, "line", [&] { return at() + ".frames[0]"; }, line); !why.empty()) return why;
    std::string text(*tree_->string(*file));
    text += ':' + std::to_string(line) + ':';
    text += *tree_->string(*func);
    auto [it, fresh] = tag_index_.try_emplace(text, static_cast<std::uint32_t>(tags_.size()));
    if (fresh) tags_.push_back(std::move(text));
    tag = it->second;
    return "";
  }

  void requested(std::int64_t delta) {
    requested_delta_ += delta;
    max_requested_delta_ = std::max<std::uint64_t>(max_requested_delta_,
                                                   static_cast<std::uint64_t>(std::max<std::int64_t>(0, requested_delta_)));
  }
  void reserved(std::int64_t delta) {
    reserved_delta_ += delta;
    max_reserved_delta_ = std::max(max_reserved_delta_, reserved_delta_);
  }

  std::string walk(Value entry, std::uint64_t index) {
    const auto at = [&] { return "device_traces[" + std::to_string(device_) + "][" + std::to_string(index) + "]"; };
    if (entry.kind() != Kind::dict) return at() + ": a " + kind(entry) + ", not a dict";
    const std::optional<Value> a = tree_->find(entry, "action");
    if (!a) return at() + ".action: missing";
    if (a->kind() != Kind::string) return at() + ".action: a " + kind(*a) + ", not a str";
    const std::optional<Action> action = parse_action(*tree_->string(*a));
    if (!action) {
      std::string shown(tree_->string(*a)->substr(0, 40));
      for (char& c : shown) {
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
      }
      return at() + ".action: unknown action '" + shown + "'";
    }
    std::uint64_t addr = 0, size = 0, raw_stream = 0;
    switch (*action) {
      case Action::snapshot: return "";
      case Action::oom: {
        ++source_.ooms;
        std::uint64_t ignored = 0;
        if (std::string why = u64(entry, "size", at, ignored, false); !why.empty()) return why;
        return u64(entry, "device_free", at, ignored, false);
      }
      default: break;
    }
    if (std::string why = u64(entry, "addr", at, addr); !why.empty()) return why;
    if (std::string why = u64(entry, "size", at, size); !why.empty()) return why;
    if (size > (std::uint64_t{1} << 62)) return at() + ".size: " + std::to_string(size) + " is beyond any device";
    if (std::string why = u64(entry, "stream", at, raw_stream, *action == Action::alloc); !why.empty()) {
      return why;
    }
    const auto signed_size = static_cast<std::int64_t>(size);
    switch (*action) {
      case Action::segment_alloc:
      case Action::segment_map:
        ++source_.segment_allocs;
        reserved(signed_size);
        return "";
      case Action::segment_free:
      case Action::segment_unmap:
        reserved(-signed_size);
        return "";
      case Action::alloc: {
        if (size == 0) return at() + ".size: 0 (an allocation of 0 bytes)";
        if (auto it = live_.find(addr); it != live_.end()) {
          return at() + ".addr: a second alloc at live address " + std::to_string(addr);
        }
        std::uint8_t stream = 0;
        if (std::string why = stream_of(raw_stream, at, stream); !why.empty()) return why;
        std::uint32_t tag = 0;
        if (std::string why = top_frame(entry, at, tag); !why.empty()) return why;
        const auto id = static_cast<std::uint32_t>(source_.allocs++);
        live_.emplace(addr, Block{id, tag, false, size, false, 0});
        seen_.insert(addr);
        lines_.push_back(TraceLine{true, id, false, size, stream, tag});
        requested(signed_size);
        return "";
      }
      case Action::free_requested:
      case Action::free_completed: {
        auto it = live_.find(addr);
        if (it == live_.end()) {
          // Alive before the history starts: the ring buffer dropped its alloc.
          std::uint8_t stream = 0;
          if (std::string why = stream_of(raw_stream, at, stream); !why.empty()) return why;
          std::uint32_t tag = 0;
          if (std::string why = top_frame(entry, at, tag); !why.empty()) return why;
          const auto id = static_cast<std::uint32_t>(reconstructed_.size());
          reconstructed_.push_back(TraceLine{true, id, true, size, stream, tag});
          initial_requested_ += size;
          it = live_.emplace(addr, Block{id, tag, true, size, false, 0}).first;
          seen_.insert(addr);
        }
        Block& b = it->second;
        if (*action == Action::free_requested) {
          if (b.free_requested) return at() + ".addr: a second free_requested of address " + std::to_string(addr);
          b.free_requested = true;
          b.requested_at = index;
          return "";
        }
        if (b.free_requested && index > b.requested_at + 1) ++source_.deferred_frees;
        lines_.push_back(TraceLine{false, b.id, b.reconstructed, 0, 0, b.tag});
        ++source_.frees;
        requested(-static_cast<std::int64_t>(b.size));
        live_.erase(it);
        return "";
      }
      default: return "";
    }
  }

  // The allocator's state at the snapshot: reserved bytes, and active blocks
  // whose alloc the history does not hold.
  std::string read_segments() {
    const std::optional<Value> segments = tree_->find(tree_->root(), "segments");
    if (!segments) return "";
    if (segments->kind() != Kind::list) return "segments: a " + kind(*segments) + ", not a list";
    std::string problem;
    std::uint64_t s = 0;
    tree_->for_each(*segments, [&](Value seg) {
      const std::uint64_t seg_index = s++;
      const auto at = [&] { return "segments[" + std::to_string(seg_index) + "]"; };
      if (seg.kind() != Kind::dict) {
        problem = at() + ": a " + kind(seg) + ", not a dict";
        return false;
      }
      std::uint64_t dev = 0, total = 0, raw_stream = 0;
      if (problem = u64(seg, "device", at, dev); !problem.empty()) return false;
      if (dev != static_cast<std::uint64_t>(device_)) return true;
      if (problem = u64(seg, "total_size", at, total); !problem.empty()) return false;
      if (problem = u64(seg, "stream", at, raw_stream, false); !problem.empty()) return false;
      final_reserved_ += total;
      const std::optional<Value> blocks = tree_->find(seg, "blocks");
      if (!blocks) return true;
      if (blocks->kind() != Kind::list) {
        problem = at() + ".blocks: a " + kind(*blocks) + ", not a list";
        return false;
      }
      std::uint64_t b = 0;
      tree_->for_each(*blocks, [&](Value block) {
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
    if (block.kind() != Kind::dict) return at() + ": a " + kind(block) + ", not a dict";
    std::uint64_t addr = 0, size = 0, requested_size = 0;
    if (std::string why = u64(block, "address", at, addr); !why.empty()) return why;
    if (std::string why = u64(block, "size", at, size); !why.empty()) return why;
    requested_size = size;
    if (std::string why = u64(block, "requested_size", at, requested_size, false); !why.empty()) {
      return why;
    }
    const std::optional<Value> state = tree_->find(block, "state");
    if (!state || state->kind() != Kind::string) return at() + ".state: missing or not a str";
    const std::string_view st = *tree_->string(*state);
    if (st != "active_allocated" && st != "active_awaiting_free") return "";
    // An address the history touched holds a block the history accounts for.
    if (live_.count(addr) != 0 || seen_.count(addr) != 0) return "";
    if (requested_size == 0) return "";
    std::uint8_t stream = 0;
    if (std::string why = stream_of(raw_stream, at, stream); !why.empty()) return why;
    std::uint32_t tag = 0;
    if (std::string why = top_frame(block, at, tag); !why.empty()) return why;
    const auto id = static_cast<std::uint32_t>(reconstructed_.size());
    reconstructed_.push_back(TraceLine{true, id, true, requested_size, stream, tag});
    initial_requested_ += requested_size;
    return "";
  }

  static void escape_into(std::string& out, std::string_view s) {
    for (const char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        out += '\\';
        out += ch;
      } else if (c < 0x20 || c >= 0x7f) {
        out += '?';  // keeps the trace plain ASCII whatever the file holds
      } else {
        out += ch;
      }
    }
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
      escape_into(out, tags_[l.tag]);
    }
    out += '"';
    if (l.alloc) {
      out += ",\"bytes\":";
      number_into(out, l.bytes);
      out += ",\"stream\":";
      number_into(out, l.stream);
      if (l.tag != 0) {
        out += ",\"tag\":\"";
        escape_into(out, tags_[l.tag]);
        out += '"';
      }
    }
    out += "}\n";
  }
  const Tree* tree_;  // null after the walk
  std::string_view name_;
  int device_ = 0;
  TorchSnapshotSource source_;
  std::vector<TraceLine> lines_;
  std::vector<TraceLine> reconstructed_;
  std::unordered_map<std::uint64_t, Block> live_;
  std::unordered_set<std::uint64_t> seen_;  // addresses of the history's allocs and reconstructed frees
  std::unordered_map<std::uint64_t, std::uint8_t> streams_;
  bool seen_default_ = false;
  std::uint64_t stream_count_ = 0;
  std::vector<std::string> tags_;
  std::unordered_map<std::string, std::uint32_t> tag_index_;
  std::uint64_t initial_requested_ = 0, max_requested_delta_ = 0, final_reserved_ = 0;
  std::int64_t requested_delta_ = 0, reserved_delta_ = 0, max_reserved_delta_ = 0;
};

}  // namespace

bool is_torch_snapshot(std::string_view bytes) noexcept { return import::is_pickle(bytes); }

Result<TorchSnapshotImport> import_torch_snapshot(std::string_view bytes, std::string_view name,
                                                  std::optional<int> device) {
  try {
    Result<Tree> tree = import::unpickle(bytes);
    if (!tree.ok()) {
      Error e = std::move(tree).error();
      e.message = std::string(name) + ": " + e.message;
      return e;
    }
    std::optional<Tree> held(std::move(tree).value());
    Importer importer(*held, name);
    Result<TorchSnapshotSource> source = importer.run(device);
    held.reset();  // the tree is the largest thing; the trace text is built without it
    if (!source.ok()) return std::move(source).error();
    TorchSnapshotImport out;
    out.source = *source;
    out.trace = importer.render();
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
