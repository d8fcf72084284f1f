// The restricted unpickler (pickle.hpp). Opcode facts follow Python's
// pickletools documentation; the machine is a loop over the bytes.
#include "import/pickle.hpp"

#include "import/block_list.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>

namespace ferry::import {
namespace {

enum Op : std::uint8_t {
  MARK = '(', STOP = '.', POP = '0', POP_MARK = '1', DUP = '2', FLOAT = 'F', INT = 'I', BININT = 'J',
  BININT1 = 'K', LONG = 'L', BININT2 = 'M', NONE = 'N', PERSID = 'P', BINPERSID = 'Q', REDUCE = 'R',
  STRING = 'S', BINSTRING = 'T', SHORT_BINSTRING = 'U', UNICODE = 'V', BINUNICODE = 'X', APPEND = 'a',
  BUILD = 'b', GLOBAL = 'c', DICT = 'd', EMPTY_DICT = '}', APPENDS = 'e', GET = 'g', BINGET = 'h',
  INST = 'i', LONG_BINGET = 'j', LIST = 'l', EMPTY_LIST = ']', OBJ = 'o', PUT = 'p', BINPUT = 'q',
  LONG_BINPUT = 'r', SETITEM = 's', TUPLE = 't', EMPTY_TUPLE = ')', SETITEMS = 'u', BINFLOAT = 'G',
  PROTO = 0x80, NEWOBJ = 0x81, EXT1 = 0x82, EXT2 = 0x83, EXT4 = 0x84, TUPLE1 = 0x85, TUPLE2 = 0x86,
  TUPLE3 = 0x87, NEWTRUE = 0x88, NEWFALSE = 0x89, LONG1 = 0x8a, LONG4 = 0x8b, BINBYTES = 'B',
  SHORT_BINBYTES = 'C', SHORT_BINUNICODE = 0x8c, BINUNICODE8 = 0x8d, BINBYTES8 = 0x8e, EMPTY_SET = 0x8f,
  ADDITEMS = 0x90, FROZENSET = 0x91, NEWOBJ_EX = 0x92, STACK_GLOBAL = 0x93, MEMOIZE = 0x94, FRAME = 0x95,
  BYTEARRAY8 = 0x96, NEXT_BUFFER = 0x97, READONLY_BUFFER = 0x98,
};

const char* op_name(std::uint8_t op) noexcept {
  switch (op) {
    case MARK: return "MARK"; case STOP: return "STOP"; case POP: return "POP"; case POP_MARK: return "POP_MARK";
    case DUP: return "DUP"; case FLOAT: return "FLOAT"; case INT: return "INT"; case BININT: return "BININT";
    case BININT1: return "BININT1"; case LONG: return "LONG"; case BININT2: return "BININT2";
    case NONE: return "NONE"; case PERSID: return "PERSID"; case BINPERSID: return "BINPERSID";
    case REDUCE: return "REDUCE"; case STRING: return "STRING"; case BINSTRING: return "BINSTRING";
    case SHORT_BINSTRING: return "SHORT_BINSTRING"; case UNICODE: return "UNICODE";
    case BINUNICODE: return "BINUNICODE"; case APPEND: return "APPEND"; case BUILD: return "BUILD";
    case GLOBAL: return "GLOBAL"; case DICT: return "DICT"; case EMPTY_DICT: return "EMPTY_DICT";
    case APPENDS: return "APPENDS"; case GET: return "GET"; case BINGET: return "BINGET"; case INST: return "INST";
    case LONG_BINGET: return "LONG_BINGET"; case LIST: return "LIST"; case EMPTY_LIST: return "EMPTY_LIST";
    case OBJ: return "OBJ"; case PUT: return "PUT"; case BINPUT: return "BINPUT"; case LONG_BINPUT: return "LONG_BINPUT";
    case SETITEM: return "SETITEM"; case TUPLE: return "TUPLE"; case EMPTY_TUPLE: return "EMPTY_TUPLE";
    case SETITEMS: return "SETITEMS"; case BINFLOAT: return "BINFLOAT"; case PROTO: return "PROTO";
    case NEWOBJ: return "NEWOBJ"; case EXT1: return "EXT1"; case EXT2: return "EXT2"; case EXT4: return "EXT4";
    case TUPLE1: return "TUPLE1"; case TUPLE2: return "TUPLE2"; case TUPLE3: return "TUPLE3";
    case NEWTRUE: return "NEWTRUE"; case NEWFALSE: return "NEWFALSE"; case LONG1: return "LONG1";
    case LONG4: return "LONG4"; case BINBYTES: return "BINBYTES"; case SHORT_BINBYTES: return "SHORT_BINBYTES";
    case SHORT_BINUNICODE: return "SHORT_BINUNICODE"; case BINUNICODE8: return "BINUNICODE8";
    case BINBYTES8: return "BINBYTES8"; case EMPTY_SET: return "EMPTY_SET"; case ADDITEMS: return "ADDITEMS";
    case FROZENSET: return "FROZENSET"; case NEWOBJ_EX: return "NEWOBJ_EX"; case STACK_GLOBAL: return "STACK_GLOBAL";
    case MEMOIZE: return "MEMOIZE"; case FRAME: return "FRAME"; case BYTEARRAY8: return "BYTEARRAY8";
    case NEXT_BUFFER: return "NEXT_BUFFER"; case READONLY_BUFFER: return "READONLY_BUFFER";
    default: return nullptr;
  }
}

// Why an opcode is refused outright, or nullptr when the machine runs it.
const char* refusal(std::uint8_t op) noexcept {
  switch (op) {
    case GLOBAL: case STACK_GLOBAL: case INST: case EXT1: case EXT2: case EXT4:
      return "names a Python object: refused, nothing is executed";
    case REDUCE: case BUILD: case OBJ: case NEWOBJ: case NEWOBJ_EX:
      return "calls a Python object: refused, nothing is executed";
    case PERSID: case BINPERSID:
      return "asks for a persistent object: refused, nothing is executed";
    case NEXT_BUFFER: case READONLY_BUFFER:
      return "needs an out-of-band buffer: refused";
    case INT: case LONG: case FLOAT: case STRING: case UNICODE: case GET: case PUT:
      return "is a protocol 0 text opcode: refused (a snapshot is pickled with protocol 2 to 5)";
    default: return nullptr;
  }
}

constexpr std::int64_t kInlineMin = -(std::int64_t{1} << 59);
constexpr std::int64_t kInlineMax = (std::int64_t{1} << 59) - 1;
constexpr std::uint64_t kPayloadMask = (std::uint64_t{1} << 60) - 1;

}  // namespace

std::string_view to_string(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::real: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
    case Kind::set: return "set";
    case Kind::external: return "history value";
  }
  return "unknown";
}

bool is_pickle(std::string_view bytes) noexcept {
  return bytes.size() >= 2 && static_cast<std::uint8_t>(bytes[0]) == PROTO &&
         static_cast<std::uint8_t>(bytes[1]) >= 2 && static_cast<std::uint8_t>(bytes[1]) <= 5;
}

class Unpickler {
 public:
  Unpickler(std::string_view in, AppendSink* sink, std::uint64_t visits) : in_(in), sink_(sink) {
    tree_.input_ = in;
    tree_.visits_left_ = visits;
  }

  Result<Tree> run() {
    if (in_.empty()) return make_error(ErrorCode::invalid_argument, "empty file: not a pickle");
    if (in_.size() > kMaxPickleBytes) {
      return make_error(ErrorCode::invalid_argument,
                        "larger than " + std::to_string(kMaxPickleBytes) + " bytes: refused");
    }
    if (!is_pickle(in_)) {
      return make_error(ErrorCode::invalid_argument,
                        "not a pickle of protocol 2 to 5 (it must open with PROTO 0x80 and 2..5)");
    }
    while (pos_ < in_.size()) {
      at_ = pos_;
      op_ = byte(pos_++);
      if (const char* why = refusal(op_)) return fail(why);
      if (!step()) return std::move(*error_);
      if (done_) return std::move(tree_);
    }
    return make_error(ErrorCode::invalid_argument,
                      "truncated: the input ends at byte " + std::to_string(in_.size()) + " before STOP");
  }

 private:
  // A MARK and the tree's sizes when it was pushed (all below 2^32: each took
  // an input byte); min_*: the oldest container grown and memo slot set since.
  struct Mark {
    std::uint32_t stack, containers, chunks, items, wide, reals, memo;
    std::uint64_t min_extended, min_memo_put;
  };
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};

  std::uint8_t byte(std::size_t i) const noexcept { return static_cast<std::uint8_t>(in_[i]); }

  Error fail(std::string_view why) {
    char head[96];
    const char* name = op_name(op_);
    if (name) {
      std::snprintf(head, sizeof head, "byte %zu: opcode %s (0x%02x) ", at_, name, op_);
    } else {
      std::snprintf(head, sizeof head, "byte %zu: opcode 0x%02x ", at_, op_);
    }
    return make_error(ErrorCode::invalid_argument, head + std::string(why));
  }
  bool stop(std::string_view why) {
    error_ = fail(why);
    return false;
  }

  bool take(std::size_t n, std::size_t& at) {
    if (in_.size() - pos_ < n) {
      return stop("is truncated: needs " + std::to_string(n) + " more bytes, " +
                  std::to_string(in_.size() - pos_) + " left");
    }
    at = pos_;
    pos_ += n;
    return true;
  }
  bool uint_le(std::size_t n, std::uint64_t& out) {
    std::size_t at = 0;
    if (!take(n, at)) return false;
    out = 0;
    for (std::size_t i = n; i-- > 0;) out = (out << 8) | byte(at + i);
    return true;
  }

  void push(Value v) { stack_.push_back(v); }
  bool pop(Value& v) {
    if (stack_.size() <= floor()) return stop("finds the stack empty");
    v = stack_.back();
    stack_.pop_back();
    return true;
  }
  std::size_t floor() const noexcept { return marks_.empty() ? 0 : marks_.back().stack; }
  bool pop_mark(std::size_t& from) {
    if (marks_.empty()) return stop("finds no MARK");
    popped_ = marks_.back();
    marks_.pop_back();
    from = popped_.stack;
    if (!marks_.empty()) {  // what the inner mark saw, its parent saw too
      marks_.back().min_extended = std::min(marks_.back().min_extended, popped_.min_extended);
      marks_.back().min_memo_put = std::min(marks_.back().min_memo_put, popped_.min_memo_put);
    }
    return true;
  }
  void push_mark() {
    marks_.push_back(Mark{static_cast<std::uint32_t>(stack_.size()), static_cast<std::uint32_t>(tree_.containers_.size()),
                          static_cast<std::uint32_t>(tree_.chunks_.size()), static_cast<std::uint32_t>(tree_.items_.size()),
                          static_cast<std::uint32_t>(tree_.wide_ints_.size()), static_cast<std::uint32_t>(tree_.reals_.size()),
                          static_cast<std::uint32_t>(memo_.size()), kNone, kNone});
  }

  // Gives back the storage made since mark `m` (its items went to the sink),
  // when nothing older points into it: no older container grew and no older
  // memo slot was set since. Memoized values in it are offered to the sink.
  void give_back(const Mark& m) {
    if (m.min_extended < m.containers || m.min_memo_put < m.memo) return;
    for (std::size_t i = m.memo; i < memo_.size(); ++i) {
      if (!known_[i]) continue;
      Value& v = memo_[i];
      const Kind k = v.tag() == Value::kGoneTag ? Kind::none : v.kind();
      if (Tree::is_container(k) && v.payload() >= m.containers) {
        const std::optional<std::uint64_t> id = sink_->keep(tree_, v);
        v = id ? Value::make(Kind::external, *id & kPayloadMask) : Value::tagged(Value::kGoneTag, 0);
      }
    }
    // Numbers memoized in the region are copied below the mark's sizes.
    std::vector<std::pair<std::size_t, Integer>> wides;
    std::vector<std::pair<std::size_t, double>> reals;
    for (std::size_t i = m.memo; i < memo_.size(); ++i) {
      if (!known_[i]) continue;
      const Value v = memo_[i];
      if (v.tag() == Value::kWideTag && v.payload() >= m.wide) wides.emplace_back(i, tree_.wide_ints_[v.payload()]);
      if (v.tag() != Value::kGoneTag && v.kind() == Kind::real && v.payload() >= m.reals) {
        reals.emplace_back(i, tree_.reals_[v.payload()]);
      }
    }
    tree_.containers_.resize(m.containers);
    tree_.chunks_.resize(m.chunks);
    tree_.items_.resize(m.items);
    tree_.wide_ints_.resize(m.wide);
    tree_.reals_.resize(m.reals);
    for (const auto& [i, w] : wides) {
      tree_.wide_ints_.push_back(w);
      memo_[i] = Value::tagged(Value::kWideTag, tree_.wide_ints_.size() - 1);
    }
    for (const auto& [i, r] : reals) {
      tree_.reals_.push_back(r);
      memo_[i] = Value::make(Kind::real, tree_.reals_.size() - 1);
    }
  }

  Value make_int(bool negative, std::uint64_t magnitude, bool in_range) {
    if (in_range) {
      if (!negative && magnitude <= static_cast<std::uint64_t>(kInlineMax)) {
        return Value::make(Kind::integer, magnitude & kPayloadMask);
      }
      if (negative && magnitude <= static_cast<std::uint64_t>(-kInlineMin)) {
        return Value::make(Kind::integer, (~magnitude + 1) & kPayloadMask);
      }
    }
    tree_.wide_ints_.push_back(Integer{in_range, negative, magnitude});
    return Value::tagged(Value::kWideTag, tree_.wide_ints_.size() - 1);
  }

  bool long_bytes(std::size_t n) {
    std::size_t at = 0;
    if (!take(n, at)) return false;
    if (n == 0) {
      push(make_int(false, 0, true));
      return true;
    }
    const bool negative = (byte(at + n - 1) & 0x80) != 0;
    // Significant bytes: drop the sign-extension bytes at the top.
    std::size_t len = n;
    const std::uint8_t fill = negative ? 0xFF : 0x00;
    while (len > 1 && byte(at + len - 1) == fill) --len;
    // Dropping sign-extension bytes keeps value = raw - 2^(8 len) for a negative.
    if (len > 8) {
      push(make_int(negative, 0, false));
      return true;
    }
    std::uint64_t raw = 0;
    for (std::size_t i = len; i-- > 0;) raw = (raw << 8) | byte(at + i);
    if (negative) {
      const std::uint64_t mag = len == 8 ? ~raw + 1 : (std::uint64_t{1} << (8 * len)) - raw;
      const bool fits = mag != 0 && mag <= (std::uint64_t{1} << 63);
      push(make_int(true, fits ? mag : 0, fits));
    } else {
      push(make_int(false, raw, true));
    }
    return true;
  }

  bool text(Kind kind, std::size_t len_bytes) {
    std::uint64_t n = 0;
    if (!uint_le(len_bytes, n)) return false;
    if (n > in_.size() - pos_) {
      return stop("is truncated: needs " + std::to_string(n) + " more bytes, " +
                  std::to_string(in_.size() - pos_) + " left");
    }
    push(Value::make(kind, (static_cast<std::uint64_t>(pos_) << 30) | n));
    pos_ += n;
    return true;
  }

  Value new_container(Kind kind) {
    tree_.containers_.push_back(Tree::Container{Tree::kNoChunk, Tree::kNoChunk, 0});
    return Value::make(kind, tree_.containers_.size() - 1);
  }
  // Moves stack_[from, end) into the container (as a new chunk, or by growing
  // its last chunk when that one ends the item array).
  void extend(Value c, std::size_t from) {
    const std::size_t n = stack_.size() - from;
    if (n == 0) return;
    if (!marks_.empty()) marks_.back().min_extended = std::min<std::uint64_t>(marks_.back().min_extended, c.payload());
    Tree::Container& box = tree_.containers_[c.payload()];
    const auto begin = static_cast<std::uint32_t>(tree_.items_.size());
    tree_.items_.insert(tree_.items_.end(), stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    box.count += static_cast<std::uint32_t>(n);
    if (box.last_chunk != Tree::kNoChunk) {
      Tree::Chunk& last = tree_.chunks_[box.last_chunk];
      if (last.begin + last.count == begin) {
        last.count += static_cast<std::uint32_t>(n);
        return;
      }
    }
    tree_.chunks_.push_back(Tree::Chunk{begin, static_cast<std::uint32_t>(n), Tree::kNoChunk});
    const auto index = static_cast<std::uint32_t>(tree_.chunks_.size() - 1);
    if (box.last_chunk == Tree::kNoChunk) {
      box.first_chunk = index;
    } else {
      tree_.chunks_[box.last_chunk].next = index;
    }
    box.last_chunk = index;
  }
  bool build(Kind kind, std::size_t from) {
    if (kind == Kind::dict && (stack_.size() - from) % 2 != 0) return stop("has an odd number of items");
    const Value c = new_container(kind);
    extend(c, from);
    push(c);
    return true;
  }
  // The container under stack_[from - 1], checked to be of `kind`.
  bool target(Kind kind, std::size_t from, Value& c) {
    if (from == 0 || from - 1 < floor()) return stop("finds no container below its items");
    c = stack_[from - 1];
    if (c.kind() != kind) {
      return stop("applies to a " + std::string(to_string(kind)) + ", not to a " + std::string(to_string(c.kind())));
    }
    return true;
  }
  // `marked`: the items were MARK ... APPENDS (popped_ is that mark).
  bool add_items(Kind kind, std::size_t from, bool marked = false) {
    Value c;
    if (!target(kind, from, c)) return false;
    if (kind == Kind::dict && (stack_.size() - from) % 2 != 0) return stop("has an odd number of items");
    if (sink_ != nullptr && kind == Kind::list && stack_.size() > from &&
        sink_->take(tree_, c, stack_.data() + from, stack_.size() - from)) {
      stack_.resize(from);
      if (marked) give_back(popped_);
      return true;
    }
    extend(c, from);
    return true;
  }

  bool memo_put(std::uint64_t index) {
    if (stack_.empty()) return stop("finds the stack empty");
    // Bounded by the input: a memo index past the bytes read so far is refused.
    if (index > pos_) return stop("memo index " + std::to_string(index) + " is out of reach");
    if (index >= memo_.size()) {
      memo_.resize(index + 1);
      known_.resize(index + 1, false);
    }
    if (!marks_.empty()) marks_.back().min_memo_put = std::min<std::uint64_t>(marks_.back().min_memo_put, index);
    memo_[index] = stack_.back();
    known_[index] = true;
    return true;
  }
  bool memo_get(std::uint64_t index) {
    if (index >= memo_.size() || !known_[index]) return stop("memo index " + std::to_string(index) + " was never set");
    if (memo_[index].tag() == Value::kGoneTag) {
      return stop("memo index " + std::to_string(index) + " names a value inside a history entry already read: refused");
    }
    push(memo_[index]);
    return true;
  }

  // One opcode: the stack and control ones here, values in step_value, containers
  // and the memo in step_container.
  bool step() {
    std::size_t from = 0;
    std::uint64_t n = 0;
    Value a;
    switch (op_) {
      case PROTO:
        if (!uint_le(1, n)) return false;
        if (n < 2 || n > 5) return stop("names protocol " + std::to_string(n) + ": only 2 to 5 are read");
        return true;
      case FRAME:
        if (!uint_le(8, n)) return false;
        if (n > in_.size() - pos_) return stop("is truncated: the frame runs past the end of the input");
        return true;
      case STOP:
        if (!pop(a)) return false;
        tree_.root_ = a;
        done_ = true;
        return true;
      case MARK: push_mark(); return true;
      case POP:
        if (stack_.size() == floor()) {  // POP of a MARK itself, as pickletools allows
          if (marks_.empty()) return stop("finds the stack empty");
          return pop_mark(from);
        }
        return pop(a);
      case POP_MARK:
        if (!pop_mark(from)) return false;
        stack_.resize(from);
        return true;
      case DUP:
        if (stack_.size() <= floor()) return stop("finds the stack empty");
        push(stack_.back());
        return true;
      default: return step_value();
    }
  }

  bool step_value() {
    std::uint64_t n = 0;
    std::size_t at = 0;
    switch (op_) {
      case NONE: push(Value{}); return true;
      case NEWTRUE: push(Value::make(Kind::boolean, 1)); return true;
      case NEWFALSE: push(Value::make(Kind::boolean, 0)); return true;
      case BININT1:
        if (!uint_le(1, n)) return false;
        push(make_int(false, n, true));
        return true;
      case BININT2:
        if (!uint_le(2, n)) return false;
        push(make_int(false, n, true));
        return true;
      case BININT: {
        if (!uint_le(4, n)) return false;
        const auto v = static_cast<std::int32_t>(static_cast<std::uint32_t>(n));
        push(v < 0 ? make_int(true, static_cast<std::uint64_t>(-static_cast<std::int64_t>(v)), true)
                   : make_int(false, static_cast<std::uint64_t>(v), true));
        return true;
      }
      case LONG1:
        if (!uint_le(1, n)) return false;
        return long_bytes(n);
      case LONG4: {
        if (!uint_le(4, n)) return false;
        if (n & 0x80000000u) return stop("has a negative length");
        return long_bytes(n);
      }
      case BINFLOAT: {
        if (!take(8, at)) return false;
        std::uint64_t bits = 0;
        for (std::size_t i = 0; i < 8; ++i) bits = (bits << 8) | byte(at + i);  // big-endian
        double d = 0;
        std::memcpy(&d, &bits, sizeof d);
        tree_.reals_.push_back(d);
        push(Value::make(Kind::real, tree_.reals_.size() - 1));
        return true;
      }
      case SHORT_BINUNICODE: return text(Kind::string, 1);
      case BINUNICODE: return text(Kind::string, 4);
      case BINUNICODE8: return text(Kind::string, 8);
      case SHORT_BINBYTES: case SHORT_BINSTRING: return text(Kind::bytes, 1);
      case BINBYTES: return text(Kind::bytes, 4);
      case BINSTRING: {
        if (!uint_le(4, n)) return false;
        if (n & 0x80000000u) return stop("has a negative length");
        pos_ -= 4;
        return text(Kind::bytes, 4);
      }
      case BINBYTES8: case BYTEARRAY8: return text(Kind::bytes, 8);
      default: return step_container();
    }
  }

  bool step_container() {
    std::uint64_t n = 0;
    std::size_t from = 0;
    switch (op_) {
      case EMPTY_DICT: push(new_container(Kind::dict)); return true;
      case EMPTY_LIST: push(new_container(Kind::list)); return true;
      case EMPTY_TUPLE: push(new_container(Kind::tuple)); return true;
      case EMPTY_SET: push(new_container(Kind::set)); return true;
      case DICT: return pop_mark(from) && build(Kind::dict, from);
      case LIST: return pop_mark(from) && build(Kind::list, from);
      case TUPLE: return pop_mark(from) && build(Kind::tuple, from);
      case FROZENSET: return pop_mark(from) && build(Kind::set, from);
      case TUPLE1: case TUPLE2: case TUPLE3: {
        const std::size_t k = op_ - TUPLE1 + 1u;
        if (stack_.size() < floor() + k) return stop("finds fewer than " + std::to_string(k) + " items");
        return build(Kind::tuple, stack_.size() - k);
      }
      case APPEND:
        if (stack_.size() < floor() + 2) return stop("finds fewer than 2 items");
        return add_items(Kind::list, stack_.size() - 1);
      case APPENDS: return pop_mark(from) && add_items(Kind::list, from, true);
      case SETITEM:
        if (stack_.size() < floor() + 3) return stop("finds fewer than 3 items");
        return add_items(Kind::dict, stack_.size() - 2);
      case SETITEMS: return pop_mark(from) && add_items(Kind::dict, from);
      case ADDITEMS: return pop_mark(from) && add_items(Kind::set, from);
      case BINPUT: return uint_le(1, n) && memo_put(n);
      case LONG_BINPUT: return uint_le(4, n) && memo_put(n);
      case MEMOIZE: return memo_put(memo_.size());
      case BINGET: return uint_le(1, n) && memo_get(n);
      case LONG_BINGET: return uint_le(4, n) && memo_get(n);
      default: return stop("is not a pickle opcode ferry reads: refused");
    }
  }

  std::string_view in_;
  std::size_t pos_ = 0, at_ = 0;
  std::uint8_t op_ = 0;
  bool done_ = false;
  std::optional<Error> error_;
  std::vector<Value> stack_;
  AppendSink* sink_ = nullptr;
  std::vector<Mark> marks_;
  Mark popped_{};
  BlockList<Value> memo_;  // a big file memoizes most of its values
  std::vector<bool> known_;
  Tree tree_;
};

Result<Tree> unpickle(std::string_view bytes, AppendSink* sink, std::uint64_t visits) {
  try {
    return Unpickler(bytes, sink, visits).run();
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, "host memory cannot hold the unpickled tree");
  }
}

std::optional<Integer> Tree::integer(Value v) const noexcept {
  if (v.tag() == Value::kWideTag) return wide_ints_[v.payload()];
  if (v.kind() == Kind::boolean) return Integer{true, false, v.payload()};
  if (v.kind() != Kind::integer) return std::nullopt;
  const auto raw = static_cast<std::int64_t>(v.payload() << 4) >> 4;  // sign-extend 60 bits
  if (raw < 0) return Integer{true, true, static_cast<std::uint64_t>(-raw)};
  return Integer{true, false, static_cast<std::uint64_t>(raw)};
}

std::optional<double> Tree::real(Value v) const noexcept {
  if (v.kind() != Kind::real) return std::nullopt;
  return reals_[v.payload()];
}

std::optional<bool> Tree::boolean(Value v) const noexcept {
  if (v.kind() != Kind::boolean) return std::nullopt;
  return v.payload() != 0;
}

std::optional<std::string_view> Tree::string(Value v) const noexcept {
  if (v.kind() != Kind::string && v.kind() != Kind::bytes) return std::nullopt;
  const std::uint64_t p = v.payload();
  return input_.substr(p >> 30, p & ((std::uint64_t{1} << 30) - 1));
}

std::optional<std::uint64_t> Tree::external(Value v) const noexcept {
  if (v.kind() != Kind::external) return std::nullopt;
  return v.payload();
}

std::uint64_t Tree::size(Value v) const noexcept {
  return is_container(v.kind()) ? containers_[v.payload()].count : 0;
}

std::optional<Value> Tree::find(Value dict, std::string_view key) const {
  if (dict.kind() != Kind::dict) return std::nullopt;
  std::optional<Value> found;
  bool is_key = true, match = false;
  for_each(dict, [&](Value v) {
    if (is_key) {
      match = v.kind() == Kind::string && string(v) == key;
    } else if (match) {
      found = v;
    }
    is_key = !is_key;
    return true;
  });
  return found;
}

std::size_t Tree::tree_bytes() const noexcept {
  return containers_.size() * sizeof(Container) + chunks_.size() * sizeof(Chunk) +
         items_.size() * sizeof(Value) + wide_ints_.capacity() * sizeof(Integer) +
         reals_.capacity() * sizeof(double);
}

}  // namespace ferry::import
