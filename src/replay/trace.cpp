#include "replay/trace.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <unordered_map>

#include "core/error_codes.hpp"
#include "core/text.hpp"
#include "ferry/names.hpp"
#include "ferry/replay.hpp"

namespace ferry::replay {
namespace {

using nlohmann::json;

constexpr std::array<NamedValue<OpKind>, 17> kOps{{
    {OpKind::alloc, "alloc"},
    {OpKind::free, "free"},
    {OpKind::fill, "fill"},
    {OpKind::upload, "upload"},
    {OpKind::compute, "compute"},
    {OpKind::hold, "hold"},
    {OpKind::release, "release"},
    {OpKind::sync, "sync"},
    {OpKind::trim, "trim"},
    {OpKind::check, "check"},
    {OpKind::wait, "wait"},
    {OpKind::user, "user"},
    {OpKind::copy, "copy"},
    {OpKind::capture, "capture"},
    {OpKind::replay, "replay"},
    {OpKind::copy_peer, "copy_peer"},
    {OpKind::meta, "meta"},
}};

// A JSON value as it appeared, short enough for one message line. dump() with
// `replace` never throws on odd strings.
std::string shown(const json& v) {
  // Containers are named, not dumped: dump() recurses, and a line may nest deeply.
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// Reads typed fields of one op object; the first problem sticks and every later
// read returns nullopt.
class FieldReader {
 public:
  explicit FieldReader(const json& obj) : obj_(obj) {}

  bool failed() const noexcept { return !problem_.empty(); }
  const std::string& problem() const noexcept { return problem_; }
  bool has(const char* key) const { return obj_.contains(key); }

  std::optional<std::string> id(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string() || v->get_ref<const std::string&>().empty()) {
      return fail("field " + text::quoted(key) + " must be a non-empty string (an id), got " + shown(*v));
    }
    return v->get<std::string>();
  }

  std::optional<std::vector<std::string>> ids(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array() || v->empty()) {
      return fail("field " + text::quoted(key) + " must be a non-empty array of ids, got " + shown(*v));
    }
    std::vector<std::string> out;
    out.reserve(v->size());
    for (const json& e : *v) {
      if (!e.is_string() || e.get_ref<const std::string&>().empty()) {
        return fail("field " + text::quoted(key) + " must hold only non-empty strings (ids), got " +
                    shown(e));
      }
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  // A `user` op's operands: a non-empty array of {"id", "access", optional
  // "offset", optional "bytes"}; ids are returned as written, in `names`.
  std::optional<std::vector<TraceOperand>> operands(const char* key, std::vector<std::string>& names) {
    const json* v = field(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array() || v->empty()) {
      return fail("field " + text::quoted(key) + " must be a non-empty array of operands, got " + shown(*v));
    }
    std::vector<TraceOperand> out;
    for (const json& e : *v) {
      if (!e.is_object()) {
        return fail("field " + text::quoted(key) + " must hold only objects {\"id\", \"access\"}, got " + shown(e));
      }
      FieldReader f(e);
      std::optional<std::string> id = f.id("id");
      std::optional<Access> access = f.access("access");
      TraceOperand o;
      if (f.has("offset")) o.offset = f.u64("offset").value_or(0);
      if (f.has("bytes")) {
        o.bytes = f.u64("bytes").value_or(0);
        if (!f.failed() && o.bytes == 0) return fail("an operand's \"bytes\" must not be 0");
      }
      if (f.failed()) return fail("in " + text::quoted(key) + ": " + f.problem());
      o.access = *access;
      names.push_back(*id);
      out.push_back(o);
    }
    return out;
  }

  std::optional<Access> access(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return std::nullopt;
    for (Access a : {Access::read, Access::write, Access::read_write}) {
      if (v->is_string() && v->get_ref<const std::string&>() == ferry::to_string(a)) return a;
    }
    return fail("field " + text::quoted(key) + " must be \"read\", \"write\" or \"read_write\", got " + shown(*v));
  }

  std::optional<std::string> text(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) return fail("field " + text::quoted(key) + " must be a string, got " + shown(*v));
    return v->get<std::string>();
  }

  std::optional<std::uint64_t> u64(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return std::nullopt;
    if (v->is_number_unsigned()) return v->get<std::uint64_t>();
    if (v->is_number_integer()) {
      const auto i = v->get<std::int64_t>();
      if (i >= 0) return static_cast<std::uint64_t>(i);
      return fail("field " + text::quoted(key) + " must not be negative, got " + shown(*v));
    }
    if (v->is_number_float()) {
      const double d = v->get<double>();
      // nlohmann reads integers beyond 2^64-1 as floating point.
      if (d >= 18446744073709551616.0) {
        return fail("field " + text::quoted(key) + " is too large: " + shown(*v) +
                    " (at most 18446744073709551615)");
      }
      if (d < 0) return fail("field " + text::quoted(key) + " must not be negative, got " + shown(*v));
      return fail("field " + text::quoted(key) + " must be an integer, got " + shown(*v));
    }
    return fail("field " + text::quoted(key) + " must be a non-negative integer, got " + shown(*v));
  }

  std::optional<StreamId> stream(const char* key) {
    const std::optional<std::uint64_t> s = u64(key);
    if (!s) return std::nullopt;
    if (Result<void> r = check_stream(*s, "field " + text::quoted(key)); !r.ok()) return fail(r.error().message);
    return static_cast<StreamId>(*s);
  }

  std::optional<ErrorCode> expect(const char* key) {
    const json* v = field(key);
    if (v == nullptr) return std::nullopt;
    std::optional<ErrorCode> code;
    if (v->is_string()) code = parse_expect(v->get_ref<const std::string&>());
    if (!code) {
      std::string names = "\"oom\"";
      for (const NamedValue<ErrorCode>& c : error_code_names()) names += ", " + text::quoted(c.name);
      return fail("field " + text::quoted(key) + " must be one of " + names + ", got " + shown(*v));
    }
    return code;
  }

 private:
  const json* field(const char* key) {
    if (failed()) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      problem_ = "missing field " + text::quoted(key);
      return nullptr;
    }
    return &*it;
  }

  std::nullopt_t fail(std::string problem) {
    problem_ = std::move(problem);
    return std::nullopt;
  }

  const json& obj_;
  std::string problem_;
};

// What the validator knows about one graph name from the lines read so far.
// A line that carries `expect` may fail, so it moves its graph on only when it
// is an `end`, which ends the capture even when spoiled.
struct GraphState {
  enum class Phase : std::uint8_t { not_made, capturing, made, destroyed };
  Phase phase = Phase::not_made;
  std::size_t line = 0;  // the line that put it in `phase`
  StreamId stream = 0;   // capturing: the stream
};

// What the validator knows about one id from the lines read so far.
struct IdState {
  std::size_t alloc_line = 0;  // 0: no earlier line allocated it
  bool live = false;           // allocated and not freed since
  bool may_have_failed = false;  // its latest alloc carried `expect`
  std::uint32_t device = 0;    // the device its latest alloc ran on
};

class Validator {
 public:
  explicit Validator(std::string_view name) { trace_.name = name; }

  void line(std::string_view text, std::size_t number) {
    const bool first = !seen_line_;
    seen_line_ = true;
    json obj;
    const std::optional<OpKind> kind = parse_op(text, number, obj);
    if (!kind) return;

    TraceOp op;
    op.kind = *kind;
    op.line = number;
    FieldReader f(obj);
    std::optional<std::string> id;
    std::optional<std::vector<std::string>> inputs;
    std::vector<std::string> operand_ids;
    if (op.kind != OpKind::meta && !device_fields(f, op, number)) return;
    switch (op.kind) {
      case OpKind::alloc:
        id = f.id("id");
        op.bytes = f.u64("bytes").value_or(0);
        op.stream = f.stream("stream").value_or(0);
        break;
      case OpKind::free:
        id = f.id("id");
        break;
      case OpKind::check:
        id = f.id("id");
        if (f.has("stream")) {
          op.stream = f.stream("stream").value_or(0);
          op.on_stream = true;
        }
        break;
      case OpKind::fill:
      case OpKind::upload:
        id = f.id("id");
        op.stream = f.stream("stream").value_or(0);
        op.seed = f.u64("seed").value_or(0);
        break;
      case OpKind::compute:
        inputs = f.ids("inputs");
        id = f.id("output");
        op.stream = f.stream("stream").value_or(0);
        break;
      case OpKind::hold:
      case OpKind::release:
        op.stream = f.stream("stream").value_or(0);
        break;
      case OpKind::sync:
        if (f.has("stream")) {
          op.stream = f.stream("stream").value_or(0);
        } else {
          op.all_streams = true;
          op.all_devices = !f.has("device");
        }
        break;
      case OpKind::trim:
        break;
      case OpKind::wait:
        op.stream = f.stream("stream").value_or(0);
        op.waits_for = f.stream("for").value_or(0);
        break;
      case OpKind::user:
        op.stream = f.stream("stream").value_or(0);
        op.operands = f.operands("operands", operand_ids).value_or(std::vector<TraceOperand>{});
        if (f.has("tag")) op.tag = f.text("tag").value_or("");
        break;
      case OpKind::copy:
      case OpKind::copy_peer:
        if (std::optional<std::string> src = f.id("src")) inputs = std::vector<std::string>{*src};
        id = f.id("dst");
        op.stream = f.stream("stream").value_or(0);
        op.bytes = f.u64("bytes").value_or(0);
        if (f.has("src_offset")) op.src_offset = f.u64("src_offset").value_or(0);
        if (f.has("dst_offset")) op.dst_offset = f.u64("dst_offset").value_or(0);
        break;
      case OpKind::capture:
      case OpKind::replay:
        // Graphs are device 0's (Runtime::begin_capture, launch).
        if (op.device != 0) return problem(number, "a " + std::string(to_string(op.kind)) + " op runs on device 0 only");
        if (!graph_fields(f, op, number)) return;
        break;
      case OpKind::meta:
        if (!first) return problem(number, "a meta op may only be the trace's first line");
        return meta(f, number);
    }
    if (f.has("expect")) op.expect = f.expect("expect");
    if (f.failed()) {
      // A bad alloc still names its id, so that later lines do not cascade.
      if (op.kind == OpKind::alloc && id) declare(*id, number, true);
      return problem(number, f.problem());
    }
    if (bind_ids(op, id, inputs, operand_ids)) trace_.ops.push_back(std::move(op));
  }

  // Resolves the op's ids against the lines before it; false with the problem noted.
  bool bind_ids(TraceOp& op, const std::optional<std::string>& id,
                const std::optional<std::vector<std::string>>& inputs, const std::vector<std::string>& operand_ids) {
    const std::size_t number = op.line;
    // A copy_peer's ids name its devices; every other op's ids are on its own device.
    const bool peer = op.kind == OpKind::copy_peer;
    if (inputs) {
      for (const std::string& in : *inputs) {
        const std::optional<IdIndex> index = use(in, number, peer ? std::nullopt : std::optional(op.device));
        if (!index) return false;
        op.inputs.push_back(*index);
      }
    }
    for (std::size_t i = 0; i < operand_ids.size(); ++i) {
      const std::optional<IdIndex> index = use(operand_ids[i], number, op.device);
      if (!index) return false;
      op.operands[i].id = *index;
    }
    if (!id) return true;
    if (peer) {
      const std::optional<IdIndex> dst = use(*id, number, std::nullopt);
      if (!dst) return false;
      op.id = *dst;
      op.device = states_[*dst].device;
      op.for_device = states_[op.inputs.front()].device;
      return true;
    }
    if (op.kind == OpKind::alloc) {
      const IdIndex index = intern(*id);
      IdState& st = states_[index];
      if (st.live && !st.may_have_failed) {
        problem(number, "id " + quoted_id(*id) + " is still live (allocated on line " +
                            std::to_string(st.alloc_line) + "); free it first");
        return false;
      }
      declare(*id, number, op.expect.has_value());
      states_[index].device = op.device;
      op.id = index;
      return true;
    }
    const std::optional<IdIndex> index = use(*id, number, op.device);
    if (!index) return false;
    op.id = *index;
    if (op.kind == OpKind::free) states_[*index].live = false;
    return true;
  }

  // The line as a JSON object and its op, or nullopt with the problem noted.
  std::optional<OpKind> parse_op(std::string_view text, std::size_t number, json& obj) {
    if (text.size() > kMaxTraceLineBytes) {
      problem(number, "the line is " + std::to_string(text.size()) + " bytes, over the limit of " +
                          std::to_string(kMaxTraceLineBytes) + " bytes on one line");
      return std::nullopt;
    }
    // The JSON parser stops at a NUL as at the end of input: whatever follows would pass unread.
    if (const auto nul = text.find('\0'); nul != std::string_view::npos) {
      problem(number, "a NUL byte at column " + std::to_string(nul + 1) + " (not valid JSON)");
      return std::nullopt;
    }
    try {
      obj = json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
      // "[json.exception.parse_error.101] parse error at ..." -> "parse error at ..."
      std::string what = e.what();
      if (const auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
      // The parser saw this line alone, so its "line 1, column C" is column C of line `number`.
      if (const auto p = what.find("at line 1, column "); p != std::string::npos) what.erase(p + 3, 8);
      problem(number, "not valid JSON: " + what);
      return std::nullopt;
    }
    if (!obj.is_object()) {
      problem(number, std::string("not a JSON object (got ") + obj.type_name() + ")");
      return std::nullopt;
    }
    auto op_it = obj.find("op");
    if (op_it == obj.end() || !op_it->is_string()) {
      problem(number, op_it == obj.end() ? std::string("missing field \"op\"")
                                         : "field \"op\" must be a string, got " + shown(*op_it));
      return std::nullopt;
    }
    const std::string& op_name = op_it->get_ref<const std::string&>();
    for (const NamedValue<OpKind>& k : kOps) {
      if (k.name == op_name) return k.value;
    }
    problem(number, "unknown op " + shown(*op_it) + " (ops are " + names_in<OpKind>(kOps, ", ") + ")");
    return std::nullopt;
  }

  Result<Trace> finish() && {
    // A run with nothing in it would pass having checked nothing.
    if (problems_.empty() && trace_.ops.empty()) {
      return make_error(ErrorCode::invalid_argument,
                        trace_.name + ": the trace is empty: it has no ops (blank lines and a meta line are not ops)");
    }
    if (problems_.empty()) return std::move(trace_);
    std::string message;
    const std::size_t listed = std::min(problems_.size(), kMaxListedProblems);
    for (std::size_t i = 0; i < listed; ++i) {
      if (i > 0) message += '\n';
      message += problems_[i];
    }
    if (problems_.size() > listed) {
      message += '\n' + trace_.name + ": " + std::to_string(problems_.size() - listed) +
                 " more problems not listed";
    }
    return make_error(ErrorCode::invalid_argument, std::move(message));
  }

 private:
  void problem(std::size_t number, std::string what) {
    // A parser message may quote a whole token; keep each line readable.
    if (what.size() > 200) what = what.substr(0, 197) + "...";
    problems_.push_back(trace_.name + ":" + std::to_string(number) + ": " + what);
  }

  // A capture's phase, graph, stream and pool, or a replay's graph and stream;
  // false with the problem noted.
  bool graph_fields(FieldReader& f, TraceOp& op, std::size_t number) {
    std::optional<std::string> graph = f.id("graph");
    if (op.kind == OpKind::capture) {
      const std::optional<std::string> phase = f.text("phase");
      if (phase == "begin") op.phase = CapturePhase::begin;
      else if (phase == "end") op.phase = CapturePhase::end;
      else if (phase == "destroy") op.phase = CapturePhase::destroy;
      else if (phase) {
        problem(number, "field \"phase\" must be \"begin\", \"end\" or \"destroy\"");
        return false;
      }
    }
    if (op.kind == OpKind::replay || op.phase != CapturePhase::destroy) op.stream = f.stream("stream").value_or(0);
    std::optional<std::string> pool;
    if (op.kind == OpKind::capture && op.phase == CapturePhase::begin && f.has("pool")) pool = f.id("pool");
    if (f.failed()) {
      problem(number, f.problem());
      return false;
    }
    const auto known = [&](const std::string& name) -> std::optional<IdIndex> {
      for (IdIndex i = 0; i < trace_.graphs.size(); ++i) {
        if (trace_.graphs[i] == name) return i;
      }
      return std::nullopt;
    };
    if (pool) {
      op.pool = known(*pool);
      if (!op.pool) {
        problem(number, "graph " + quoted_id(*pool) + " was not captured by an earlier line");
        return false;
      }
      // The replay would begin the capture with a pool of its own, unseen.
      if (std::string why = unshareable(*op.pool); !why.empty()) {
        problem(number, "field \"pool\": " + why);
        return false;
      }
    }
    std::optional<IdIndex> index = known(*graph);
    if (!index && op.kind == OpKind::capture && op.phase == CapturePhase::begin) {
      index = static_cast<IdIndex>(trace_.graphs.size());
      trace_.graphs.push_back(*graph);
      graph_states_.emplace_back();
    }
    if (!index) {
      problem(number, "graph " + quoted_id(*graph) + " was not captured by an earlier line");
      return false;
    }
    op.graph = *index;
    return op.kind != OpKind::capture || capture_phase(op, f.has("expect"));
  }

  // Why a `pool` may not name graph `g` (empty: it may): only a made graph has a pool to share.
  std::string unshareable(IdIndex g) const {
    const GraphState& st = graph_states_[g];
    const std::string name = "graph " + quoted_id(trace_.graphs[g]);
    switch (st.phase) {
      case GraphState::Phase::made: return {};
      case GraphState::Phase::capturing:
        return name + " is still capturing (begun at line " + std::to_string(st.line) + "); its pool is shared once it ends";
      case GraphState::Phase::destroyed: return name + " was destroyed at line " + std::to_string(st.line);
      case GraphState::Phase::not_made: break;
    }
    return name + " was never made (line " + std::to_string(st.line) + " carried \"expect\")";
  }

  // A capture op's step in its graph's life; false with the problem noted.
  bool capture_phase(const TraceOp& op, bool may_fail) {
    GraphState& st = graph_states_[op.graph];
    const auto now = [&](GraphState::Phase phase) { st = {phase, op.line, op.stream}; };
    switch (op.phase) {
      case CapturePhase::begin:
        // Two captures under one name would share the replay's one record of it.
        if (st.phase == GraphState::Phase::capturing) {
          problem(op.line, "graph " + quoted_id(trace_.graphs[op.graph]) + " is already capturing (begun at line " +
                               std::to_string(st.line) + " on stream " + std::to_string(st.stream) + ")");
          return false;
        }
        if (!may_fail) now(GraphState::Phase::capturing);
        else if (st.line == 0) st.line = op.line;
        return true;
      case CapturePhase::end:
        // An end on another stream would file that stream's capture under this name.
        if (!may_fail && st.phase != GraphState::Phase::capturing) {
          problem(op.line, "graph " + quoted_id(trace_.graphs[op.graph]) + " is not capturing: no begin of it is open");
          return false;
        }
        if (!may_fail && st.stream != op.stream) {
          problem(op.line, "graph " + quoted_id(trace_.graphs[op.graph]) + " is capturing on stream " +
                               std::to_string(st.stream) + " (begun at line " + std::to_string(st.line) +
                               "), not on stream " + std::to_string(op.stream));
          return false;
        }
        if (st.phase == GraphState::Phase::capturing) now(may_fail ? GraphState::Phase::not_made : GraphState::Phase::made);
        return true;
      case CapturePhase::destroy:
        if (!may_fail && st.phase == GraphState::Phase::made) now(GraphState::Phase::destroyed);
        return true;
    }
    return true;
  }

  IdIndex intern(const std::string& id) {
    auto [it, inserted] = index_.try_emplace(id, static_cast<IdIndex>(trace_.ids.size()));
    if (inserted) {
      trace_.ids.push_back(id);
      states_.emplace_back();
    }
    return it->second;
  }

  void declare(const std::string& id, std::size_t number, bool may_fail) {
    IdState& st = states_[intern(id)];
    st.alloc_line = number;
    st.live = true;
    st.may_have_failed = may_fail;
  }

  // `device`: the device the op runs on, which the id's block must be on (nullopt: any).
  std::optional<IdIndex> use(const std::string& id, std::size_t number, std::optional<std::uint32_t> device) {
    auto it = index_.find(id);
    if (it == index_.end() || states_[it->second].alloc_line == 0) {
      problem(number, "id " + quoted_id(id) + " was not allocated by an earlier line");
      return std::nullopt;
    }
    if (device && states_[it->second].device != *device) {
      problem(number, "id " + quoted_id(id) + " was allocated on device " + std::to_string(states_[it->second].device) +
                          " (line " + std::to_string(states_[it->second].alloc_line) + "), used on device " +
                          std::to_string(*device));
      return std::nullopt;
    }
    return it->second;
  }

  // The first line's meta op: capacity, and the devices and their links.
  void meta(FieldReader& f, std::size_t number) {
    if (f.has("capacity") || !f.has("devices")) {  // capacity is required unless devices is given
      const std::optional<std::uint64_t> capacity = f.u64("capacity");
      if (f.failed()) return problem(number, f.problem());
      if (*capacity == 0) return problem(number, "field \"capacity\" must be above 0");
      trace_.capacity = capacity;
    }
    if (f.has("devices")) {
      const std::optional<std::uint64_t> devices = f.u64("devices");
      if (f.failed()) return problem(number, f.problem());
      if (*devices == 0 || *devices > kMaxDevices) {
        return problem(number, "field \"devices\" must be 1 to " + std::to_string(kMaxDevices) + ", got " +
                                   std::to_string(*devices));
      }
      trace_.devices = static_cast<std::uint32_t>(*devices);
    }
    if (f.has("links")) {
      const std::optional<std::string> text = f.text("links");
      if (f.failed()) return problem(number, f.problem());
      Result<std::vector<PeerLinkSpec>> links = parse_peer_links(*text);
      if (!links.ok()) return problem(number, "field \"links\": " + links.error().message);
      for (const PeerLinkSpec& l : *links) {
        if (std::max(l.a, l.b) >= trace_.devices) {
          return problem(number, "field \"links\" names device " + std::to_string(std::max(l.a, l.b)) + ", but the trace has " +
                                     text::count(trace_.devices, "device", "devices"));
        }
      }
      trace_.links = std::move(*links);
    }
  }

  // The op's `device` and a wait's `for_device`: below the trace's device count
  // (a meta op's `devices`, else 1). False with the problem noted.
  bool device_fields(FieldReader& f, TraceOp& op, std::size_t number) {
    const auto read = [&](const char* key) -> std::optional<std::uint32_t> {
      const std::optional<std::uint64_t> d = f.u64(key);
      if (f.failed()) {
        problem(number, f.problem());
        return std::nullopt;
      }
      if (*d >= trace_.devices) {
        problem(number, "field " + text::quoted(key) + " is device " + std::to_string(*d) + ", but the trace has " +
                            text::count(trace_.devices, "device", "devices") +
                            (trace_.devices == 1 ? " (a first-line meta op's \"devices\" says how many)" : ""));
        return std::nullopt;
      }
      return static_cast<std::uint32_t>(*d);
    };
    if (f.has("device")) {
      const std::optional<std::uint32_t> d = read("device");
      if (!d) return false;
      op.device = *d;
    }
    op.for_device = op.device;
    if (op.kind == OpKind::wait && f.has("for_device")) {
      const std::optional<std::uint32_t> d = read("for_device");
      if (!d) return false;
      op.for_device = *d;
    }
    return true;
  }

  Trace trace_;
  bool seen_line_ = false;  // a non-blank line was read: a meta op may no longer come
  std::unordered_map<std::string, IdIndex> index_;
  std::vector<IdState> states_;
  std::vector<GraphState> graph_states_;  // parallel to trace_.graphs
  std::vector<std::string> problems_;
};

bool blank(std::string_view s) noexcept {
  return s.find_first_not_of(" \t\r\f\v") == std::string_view::npos;
}

}  // namespace

std::string_view to_string(OpKind kind) noexcept { return name_in<OpKind>(kOps, kind); }

std::string quoted_id(std::string_view id) { return text::quoted(id, 40); }

std::optional<ErrorCode> parse_expect(std::string_view name) noexcept {
  if (name == "oom") return ErrorCode::out_of_memory;
  for (const NamedValue<ErrorCode>& c : error_code_names()) {
    if (c.name == name) return c.value;
  }
  return std::nullopt;
}

Result<Trace> parse_trace(std::string_view text, std::string_view name) {
  try {
    Validator v(name);
    std::size_t number = 0;
    while (!text.empty()) {
      ++number;
      const std::size_t nl = text.find('\n');
      std::string_view line = text.substr(0, nl);
      text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (blank(line)) continue;
      v.line(line, number);
    }
    return std::move(v).finish();
  } catch (const std::exception& e) {
    // Only allocation failure can get here; never let it cross the API.
    return make_error(ErrorCode::invalid_argument,
                      std::string(name) + ": could not be read: " + e.what());
  }
}

}  // namespace ferry::replay
