// Fuzzes the trace parser and the replay (replay_trace_text) with the input as a
// trace, on the sim's tiny profile with a 4 MiB pool and the race checker on.
// Beyond "no crash, no sanitizer report": a trace the parser refuses is
// invalid_argument naming a line; one it accepts replays with no corrupt check,
// no illegal device access and no race, since without injected faults and
// without --strict the replay orders every cross-stream use itself (replay.hpp).
// Its report renders as JSON and as a summary whatever the ids hold.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ferry/replay.hpp"

#include "fuzz_input.hpp"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail) {
  ferry_fuzz::finding("fuzz_replay", std::string(what) + "\n" + detail);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ferry::ReplayOptions options;
  options.backend.profile = "tiny";
  options.backend.race_check = true;
  options.capacity = std::uint64_t{4} << 20;  // bounds the bytes one input can make the sim hold
  auto replayed = ferry::replay_trace_text(text, "fuzz.jsonl", options);
  if (!replayed.ok()) {
    const ferry::Error& e = replayed.error();
    if (e.code != ferry::ErrorCode::invalid_argument) finding("a trace refused with a code other than invalid_argument", e.message);
    if (e.message.find("fuzz.jsonl") == std::string::npos) finding("a refusal that does not name the trace", e.message);
    return 0;
  }
  const ferry::ReplayReport& report = *replayed;
  const std::string json = ferry::report_json(report);
  const std::string summary = ferry::report_summary(report);
  if (report.corrupt != 0) finding("a replay without faults read corrupt bytes", json);
  if (report.illegal_accesses != 0) finding("a replay touched unmapped device memory", json);
  if (report.races != 0) finding("a replay that orders its own streams raced", json);
  if (summary.empty()) finding("an empty summary", json);
  return 0;
}
