// Malformed traces: one case per rule of docs/spec.md §3. Each is
// refused before anything runs, with invalid_argument naming FILE:LINE.
#include <gtest/gtest.h>

#include <ostream>
#include <string>

#include "ferry/replay.hpp"

namespace ferry {
namespace {

struct Malformed {
  const char* rule;
  std::string text;
  std::size_t line;
  const char* says;  // a part of the message
};

// gtest names a failing case by its rule, not by its bytes.
void PrintTo(const Malformed& m, std::ostream* os) { *os << m.rule; }

const std::string kAlloc = R"({"op":"alloc","id":"a","bytes":4096,"stream":0})";

std::string after_alloc(const std::string& line) { return kAlloc + "\n" + line + "\n"; }

class MalformedTrace : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedTrace, IsRefusedNamingTheLine) {
  const Malformed& m = GetParam();
  Result<ReplayReport> r = replay_trace_text(m.text, "bad.jsonl", ReplayOptions{});
  ASSERT_FALSE(r.ok()) << m.rule << " was accepted";
  EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
  const std::string& msg = r.error().message;
  EXPECT_EQ(msg.rfind("bad.jsonl:" + std::to_string(m.line) + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(m.says), std::string::npos) << msg;
}

const Malformed kMalformed[] = {
    {"not_json", "{\"op\":\"trim\"}\n{oops\n", 2, "not valid JSON"},
    // The column within the line named (the parser sees each line alone, as its line 1).
    {"json_error_column_of_its_line", "\n\n\n" R"({"op":"alloc","id":"a" "bytes":1})", 4,
     "not valid JSON: parse error at column 30:"},
    {"truncated_json", after_alloc(R"({"op":"free","id":"a")"), 2, "not valid JSON"},
    {"invalid_utf8", "{\"op\":\"trim\",\"x\":\"\xff\"}", 1, "not valid JSON"},
    {"not_an_object_array", "[1,2,3]", 1, "not a JSON object"},
    {"not_an_object_number", "\n42", 2, "not a JSON object"},
    {"not_an_object_string", "\"alloc\"", 1, "not a JSON object"},
    {"missing_op", R"({"id":"a"})", 1, "missing field \"op\""},
    {"op_not_a_string", R"({"op":7})", 1, "\"op\" must be a string"},
    {"unknown_op", R"({"op":"allocate","id":"a","bytes":1,"stream":0})", 1, "unknown op"},
    {"missing_id", R"({"op":"alloc","bytes":4096,"stream":0})", 1, "missing field \"id\""},
    {"missing_bytes", R"({"op":"alloc","id":"a","stream":0})", 1, "missing field \"bytes\""},
    {"missing_stream", R"({"op":"alloc","id":"a","bytes":1})", 1, "missing field \"stream\""},
    {"missing_seed", after_alloc(R"({"op":"fill","id":"a","stream":0})"), 2, "missing field \"seed\""},
    {"missing_inputs", after_alloc(R"({"op":"compute","output":"a","stream":0})"), 2,
     "missing field \"inputs\""},
    {"missing_hold_stream", R"({"op":"hold"})", 1, "missing field \"stream\""},
    {"bytes_is_a_string", R"({"op":"alloc","id":"a","bytes":"4096","stream":0})", 1,
     "must be a non-negative integer"},
    {"bytes_is_fractional", R"({"op":"alloc","id":"a","bytes":1.5,"stream":0})", 1, "must be an integer"},
    {"bytes_is_negative", R"({"op":"alloc","id":"a","bytes":-4096,"stream":0})", 1, "must not be negative"},
    {"bytes_is_huge", R"({"op":"alloc","id":"a","bytes":99999999999999999999999,"stream":0})", 1,
     "too large"},
    {"bytes_is_null", R"({"op":"alloc","id":"a","bytes":null,"stream":0})", 1,
     "must be a non-negative integer"},
    {"id_is_a_number", R"({"op":"alloc","id":5,"bytes":1,"stream":0})", 1, "must be a non-empty string"},
    {"id_is_empty", R"({"op":"alloc","id":"","bytes":1,"stream":0})", 1, "must be a non-empty string"},
    {"seed_is_negative", after_alloc(R"({"op":"fill","id":"a","stream":0,"seed":-1})"), 2,
     "must not be negative"},
    {"inputs_not_an_array", after_alloc(R"({"op":"compute","inputs":"a","output":"a","stream":0})"), 2,
     "non-empty array"},
    {"inputs_empty", after_alloc(R"({"op":"compute","inputs":[],"output":"a","stream":0})"), 2,
     "non-empty array"},
    {"inputs_hold_a_number", after_alloc(R"({"op":"compute","inputs":["a",1],"output":"a","stream":0})"), 2,
     "only non-empty strings"},
    {"stream_out_of_range", R"({"op":"alloc","id":"a","bytes":1,"stream":64})", 1, "out of range (streams are 0..63)"},
    {"stream_negative", R"({"op":"hold","stream":-1})", 1, "must not be negative"},
    {"stream_is_a_string", R"({"op":"sync","stream":"0"})", 1, "must be a non-negative integer"},
    {"stream_huge", R"({"op":"release","stream":4294967296})", 1, "out of range (streams are 0..63)"},
    {"expect_unknown", R"({"op":"alloc","id":"a","bytes":1,"stream":0,"expect":"fail"})", 1,
     "\"expect\" must be one of"},
    {"unknown_id_fill", R"({"op":"fill","id":"ghost","stream":0,"seed":1})", 1,
     "\"ghost\" was not allocated by an earlier line"},
    {"unknown_id_free", after_alloc(R"({"op":"free","id":"b"})"), 2, "not allocated by an earlier line"},
    {"unknown_id_check", after_alloc(R"({"op":"check","id":"A"})"), 2, "not allocated by an earlier line"},
    {"unknown_compute_input", after_alloc(R"({"op":"compute","inputs":["a","x"],"output":"a","stream":0})"),
     2, "\"x\" was not allocated"},
    {"unknown_compute_output", after_alloc(R"({"op":"compute","inputs":["a"],"output":"y","stream":0})"), 2,
     "\"y\" was not allocated"},
    {"allocated_only_later", R"({"op":"check","id":"a"})" "\n" + kAlloc, 1, "not allocated by an earlier line"},
    {"still_live", kAlloc + "\n" + kAlloc, 2, "still live (allocated on line 1)"},
    {"blank_lines_keep_numbering", "\n\n" + kAlloc + "\n   \n\t\n{\"op\":\"bogus\"}", 6, "unknown op"},
    {"crlf", kAlloc + "\r\n{\"op\":\"bogus\"}\r\n", 2, "unknown op"},
    {"user_missing_operands", after_alloc(R"({"op":"user","stream":0})"), 2, "missing field \"operands\""},
    {"user_operands_empty", after_alloc(R"({"op":"user","stream":0,"operands":[]})"), 2,
     "non-empty array of operands"},
    {"user_operand_not_an_object", after_alloc(R"({"op":"user","stream":0,"operands":["a"]})"), 2,
     "must hold only objects"},
    {"user_operand_bad_access", after_alloc(R"({"op":"user","stream":0,"operands":[{"id":"a","access":"rw"}]})"),
     2, "must be \"read\", \"write\" or \"read_write\""},
    {"user_operand_missing_access", after_alloc(R"({"op":"user","stream":0,"operands":[{"id":"a"}]})"), 2,
     "missing field \"access\""},
    {"user_operand_zero_bytes",
     after_alloc(R"({"op":"user","stream":0,"operands":[{"id":"a","access":"read","bytes":0}]})"), 2,
     "must not be 0"},
    {"user_operand_unknown_id",
     after_alloc(R"({"op":"user","stream":0,"operands":[{"id":"a","access":"read"},{"id":"z","access":"write"}]})"),
     2, "\"z\" was not allocated"},
    {"user_tag_not_a_string",
     after_alloc(R"({"op":"user","stream":0,"operands":[{"id":"a","access":"read"}],"tag":3})"), 2,
     "\"tag\" must be a string"},
};

INSTANTIATE_TEST_SUITE_P(Rules, MalformedTrace, ::testing::ValuesIn(kMalformed),
                         [](const auto& p) { return std::string(p.param.rule); });

TEST(MalformedTraceReport, ListsTheFirstProblemsAndCountsTheRest) {
  std::string text;
  for (int i = 0; i < 15; ++i) text += "{\"op\":\"nope\"}\n";
  Result<ReplayReport> r = replay_trace_text(text, "many.jsonl", ReplayOptions{});
  ASSERT_FALSE(r.ok());
  const std::string& msg = r.error().message;
  EXPECT_NE(msg.find("many.jsonl:1: "), std::string::npos);
  EXPECT_NE(msg.find("many.jsonl:10: "), std::string::npos);
  EXPECT_EQ(msg.find("many.jsonl:11: "), std::string::npos);
  EXPECT_NE(msg.find("5 more problems"), std::string::npos) << msg;
}

// Nothing to run is nothing checked: refused, naming the file but no line, never a PASS.
TEST(MalformedTraceReport, ATraceWithNoOpsIsRefused) {
  for (const std::string text : {"", "\n", " \t\r\n\n", R"({"op":"meta","capacity":4194304})" "\n",
                                 R"({"op":"meta","devices":2})"}) {
    Result<ReplayReport> r = replay_trace_text(text, "empty.jsonl", ReplayOptions{});
    ASSERT_FALSE(r.ok()) << "accepted: " << text;
    EXPECT_EQ(r.error().code, ErrorCode::invalid_argument);
    EXPECT_EQ(r.error().message, "empty.jsonl: the trace is empty: it has no ops (blank lines and a meta line are not ops)");
  }
  // Malformed lines are named as such, not as an empty trace.
  Result<ReplayReport> bad = replay_trace_text("{\"op\":\"nope\"}\n", "empty.jsonl", ReplayOptions{});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message.rfind("empty.jsonl:1: unknown op", 0), 0u) << bad.error().message;
  EXPECT_EQ(bad.error().message.find("the trace is empty"), std::string::npos) << bad.error().message;
}

TEST(MalformedTraceReport, ValidLinesAroundTheBadOneDoNotRun) {
  // A well-formed prefix that would fail at run time (0 bytes) is not run: the
  // answer is the malformed line, not a report.
  Result<ReplayReport> r = replay_trace_text(
      R"({"op":"alloc","id":"a","bytes":0,"stream":0})" "\n{\"op\":\"frobnicate\"}", "t.jsonl",
      ReplayOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("t.jsonl:2: "), std::string::npos);
}

TEST(WellFormedTrace, ExtraFieldsAndReallocationAfterFreeOrExpectedFailureAreFine) {
  ReplayOptions o;
  o.capacity = 64ull << 20;
  Result<ReplayReport> r = replay_trace_text(
      R"({"op":"alloc","id":"a","bytes":4096,"stream":0,"note":"recorded at t=3"}
{"op":"free","id":"a"}
{"op":"alloc","id":"a","bytes":8192,"stream":1}
{"op":"alloc","id":"b","bytes":1099511627776,"stream":0,"expect":"oom"}
{"op":"alloc","id":"b","bytes":4096,"stream":0}
{"op":"sync","stream":63}
{"op":"trim"})",
      "ok.jsonl", o);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->passed()) << report_summary(*r);
}

}  // namespace
}  // namespace ferry
