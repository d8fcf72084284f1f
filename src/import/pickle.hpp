// A restricted unpickler: pickle bytes (protocols 2 to 5) to a small value tree,
// executing nothing.
//
// It knows the opcodes of plain data (dict, list, tuple, set, str, bytes, int,
// float, bool, None), marks, the memo and frames. Every opcode that names or
// calls something (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ,
// NEWOBJ_EX, EXT1/2/4, PERSID, BINPERSID) is refused, as is every opcode it does
// not know. Parsing is a loop over the bytes, never a recursion on nesting depth.
//
// Memory is bounded by the input: a value is 8 bytes; strings and bytes point
// into the input (which must outlive the tree); each opcode adds at most one
// container, one chunk and the stack items it consumes, so the tree holds at
// most a few times the input's size (tree_bytes() says how much). An
// AppendSink takes the items of a long list as they are appended, so a
// million-entry history never stands as a tree (its storage is given back).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string_view>
#include <vector>

#include "ferry/result.hpp"

namespace ferry::import {

// `external`: a value an AppendSink took and kept as a number of its own.
enum class Kind : std::uint8_t { none, boolean, integer, real, string, bytes, list, tuple, dict, set, external };

std::string_view to_string(Kind kind) noexcept;

// A value of the tree: the kind in the low 4 bits, a payload in the rest
// (inline for none, bool, small ints and strings; an index otherwise).
class Value {
 public:
  constexpr Value() = default;
  Kind kind() const noexcept { return tag() == kWideTag ? Kind::integer : static_cast<Kind>(tag()); }
  bool operator==(const Value&) const = default;

 private:
  friend class Tree;
  friend class Unpickler;
  static constexpr std::uint64_t kWideTag = 0xF;  // an int kept in Tree::wide_ints_
  static constexpr std::uint64_t kGoneTag = 0xE;  // a memo entry whose storage an AppendSink consumed
  static constexpr Value make(Kind k, std::uint64_t payload) noexcept {
    return tagged(static_cast<std::uint64_t>(k), payload);
  }
  static constexpr Value tagged(std::uint64_t tag, std::uint64_t payload) noexcept {
    Value v;
    v.bits_ = (payload << 4) | tag;
    return v;
  }
  std::uint64_t tag() const noexcept { return bits_ & 0xF; }
  std::uint64_t payload() const noexcept { return bits_ >> 4; }
  std::uint64_t bits_ = 0;  // Kind::none
};

// What an integer holds: Python ints are unbounded, the tree keeps those in
// [-2^63, 2^64) and marks the rest as out of range.
struct Integer {
  bool in_range = true;
  bool negative = false;
  std::uint64_t magnitude = 0;
};

class Tree {
 public:
  Value root() const noexcept { return root_; }

  std::optional<Integer> integer(Value v) const noexcept;
  std::optional<double> real(Value v) const noexcept;
  std::optional<bool> boolean(Value v) const noexcept;
  std::optional<std::string_view> string(Value v) const noexcept;  // str (UTF-8 as pickled) or bytes
  std::optional<std::uint64_t> external(Value v) const noexcept;   // the sink's number for it
  // A number naming a container while the tree lives (what an AppendSink gets).
  static std::uint64_t container_id(Value v) noexcept { return v.payload(); }

  // Items of a list, tuple or set; a dict's keys and values alternate. 0 for a scalar.
  std::uint64_t size(Value v) const noexcept;
  // Calls f on each item in order until it returns false. A dict gives keys and
  // values alternately. Returns false when f stopped it, or when the visit
  // budget ran out (then exhausted() is true).
  template <class F>
  bool for_each(Value container, F&& f) const {
    if (!is_container(container.kind())) return true;
    for (std::uint32_t c = containers_[container.payload()].first_chunk; c != kNoChunk; c = chunks_[c].next) {
      const Chunk& chunk = chunks_[c];
      for (std::uint32_t i = 0; i < chunk.count; ++i) {
        if (!spend_visit() || !f(items_[chunk.begin + i])) return false;
      }
    }
    return true;
  }
  // The value under a str key of a dict (the last one set wins, as in Python).
  // Each item it passes is a visit.
  std::optional<Value> find(Value dict, std::string_view key) const;

  // True once for_each or find stopped for the budget unpickle() was given:
  // every answer read since may be short, so the reader must refuse the input.
  bool exhausted() const noexcept { return exhausted_; }

  static bool is_container(Kind k) noexcept {
    return k == Kind::list || k == Kind::tuple || k == Kind::dict || k == Kind::set;
  }

  // Heap bytes the tree holds (not counting the input it points into).
  std::size_t tree_bytes() const noexcept;

 private:
  friend class Unpickler;
  struct Container {
    std::uint32_t first_chunk = 0, last_chunk = 0;  // kNoChunk when empty
    std::uint32_t count = 0;  // below 2^30: each item took an input byte
  };
  struct Chunk {
    std::uint32_t begin = 0, count = 0, next = 0;  // items_[begin, begin + count); next: kNoChunk at the end
  };
  static constexpr std::uint32_t kNoChunk = 0xFFFFFFFFu;

  bool spend_visit() const noexcept {
    if (visits_left_ == 0) {
      exhausted_ = true;
      return false;
    }
    --visits_left_;
    return true;
  }

  std::string_view input_;
  Value root_;
  // Mutable: reading is const, but a shared subtree read again costs again, and
  // the budget is what bounds the reader's work by the input's size.
  mutable std::uint64_t visits_left_ = ~std::uint64_t{0};
  mutable bool exhausted_ = false;
  // Deques: growing never copies what is there (no doubling peak on a big file).
  std::deque<Container> containers_;  // invariant: the Value naming one has a container kind
  std::deque<Chunk> chunks_;
  std::deque<Value> items_;
  std::vector<Integer> wide_ints_;     // ints that do not fit in a 60-bit payload
  std::vector<double> reals_;
};

// Input limits: a file above this is refused before parsing (the string
// payload keeps offsets and lengths in 30 bits each).
inline constexpr std::size_t kMaxPickleBytes = std::size_t{1} << 30;

// Visits a reader may make per input byte (memo references share a subtree, so
// reading without a budget can cost the square of the input), and a floor for
// small inputs.
inline constexpr std::uint64_t kVisitsPerInputByte = 64;
inline constexpr std::uint64_t kMinVisitBudget = std::uint64_t{1} << 16;
inline std::uint64_t visit_budget(std::size_t input_bytes) noexcept {
  return kMinVisitBudget + kVisitsPerInputByte * static_cast<std::uint64_t>(input_bytes);
}

// Takes list items as they are appended (APPEND, APPENDS), before the tree
// stores them. When take() returns true the items are the sink's: the list does
// not grow, and the storage they used is given back when the batch was a MARK
// ... APPENDS that nothing older points into. Memoized values of that storage
// are offered to keep() first: a number it returns stands for the value from
// then on (Kind::external); without one a later reference to it is refused.
class AppendSink {
 public:
  virtual ~AppendSink() = default;
  // `list`: the list appended to (Tree::container_id names it while the tree lives).
  virtual bool take(const Tree& tree, Value list, const Value* items, std::size_t count) = 0;
  virtual std::optional<std::uint64_t> keep(const Tree& tree, Value memoized) = 0;
};

// True when `bytes` opens like a pickle of protocol 2 to 5 (PROTO, then 2..5).
bool is_pickle(std::string_view bytes) noexcept;

// Parses `bytes` (must outlive the tree). Errors: invalid_argument naming the
// opcode and its byte offset ("byte 17: opcode REDUCE (0x52) calls a callable:
// refused") for a refused or unknown opcode, a truncated or empty input, a
// stack or mark underflow, a wrong-typed operand, a memo miss, or an input
// larger than kMaxPickleBytes, a reference to a value the sink consumed;
// out_of_memory if the host cannot hold the tree. `sink` may be null. The tree's
// readers (the sink's included) share `visits` visits of for_each and find.
Result<Tree> unpickle(std::string_view bytes, AppendSink* sink = nullptr,
                      std::uint64_t visits = ~std::uint64_t{0});

}  // namespace ferry::import
