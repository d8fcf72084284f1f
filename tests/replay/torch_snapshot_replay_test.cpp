// PyTorch snapshots from tools/gen-torch-snapshots.py: every figure the import
// reports equals what the generator knew; the replay passes and sees the same
// live bytes; malformed and hostile files are refused, nothing executed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "ferry/pool_timeline.hpp"
#include "ferry/replay.hpp"
#include "ferry/torch_snapshot.hpp"
#include "replay/timeline_page.hpp"

namespace ferry {
namespace {

const std::string kDir = FERRY_SNAPSHOTS_DIR;

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// One history entry of a hand-made snapshot.
struct Entry {
  std::string action;
  std::uint64_t addr = 0, size = 0, stream = 0;
  std::string filename = "train.py", name = "step";
  std::uint64_t line = 1;
};

// The snapshot pickle (protocol 4, entries in one MARK ... APPENDS batch) of
// one device's history; no segments.
std::string snapshot_pickle(const std::vector<Entry>& entries) {
  std::string p = "\x80\x04}";
  const auto str = [&p](std::string_view s) {
    p += 'X';
    for (int i = 0; i < 4; ++i) p += static_cast<char>((s.size() >> (8 * i)) & 0xFF);
    p += s;
  };
  const auto num = [&p](std::uint64_t v) {
    p += "\x8a\x09";  // LONG1 of 9 bytes: 8 and a zero sign byte
    for (int i = 0; i < 8; ++i) p += static_cast<char>((v >> (8 * i)) & 0xFF);
    p += '\0';
  };
  str("device_traces");
  p += "]](";
  for (const Entry& e : entries) {
    p += "}(";
    str("action"), str(e.action), str("addr"), num(e.addr), str("size"), num(e.size), str("stream"), num(e.stream);
    str("frames");
    p += "]}(";
    str("filename"), str(e.filename), str("line"), num(e.line), str("name"), str(e.name);
    p += "ua";  // SETITEMS into the frame, APPEND it to the frames list
    p += 'u';   // SETITEMS into the entry
  }
  p += "eas.";  // APPENDS the entries, APPEND the history to device_traces, SETITEM, STOP
  return p;
}

class Corpus : public ::testing::TestWithParam<std::string> {};

TEST_P(Corpus, ImportsToTheGeneratorsFigures) {
  const std::string bytes = read(kDir + "/" + GetParam() + ".pickle");
  const auto expect = nlohmann::json::parse(read(kDir + "/" + GetParam() + ".expect.json"));
  ASSERT_TRUE(is_torch_snapshot(bytes));
  Result<TorchSnapshotImport> imported = import_torch_snapshot(bytes, GetParam());
  ASSERT_TRUE(imported.ok()) << imported.error().message;
  const auto got = nlohmann::json::parse(source_json(imported->source));
  for (const auto& [key, value] : expect.items()) EXPECT_EQ(got.at(key), value) << key;
}

TEST_P(Corpus, ReplaysOnTheSimWithTheSameLiveBytes) {
  ReplayOptions options;
  Result<ReplayReport> report = replay_trace_file(kDir + "/" + GetParam() + ".pickle", options);
  ASSERT_TRUE(report.ok()) << report.error().message;
  ASSERT_TRUE(report->source.has_value());
  EXPECT_TRUE(report->passed()) << report_summary(*report);
  EXPECT_EQ(report->peak_live_bytes, report->source->peak_requested_bytes);
  const auto j = nlohmann::ordered_json::parse(report_json(*report));
  const std::vector<std::string> keys = {"format", "device", "events", "allocs", "frees", "streams",
                                         "reconstructed_blocks", "peak_requested_bytes", "peak_reserved_bytes",
                                         "segment_allocs", "ooms"};
  std::vector<std::string> have;
  for (const auto& [key, value] : j.at("source").items()) have.push_back(key);
  EXPECT_EQ(have, keys);
}

INSTANTIATE_TEST_SUITE_P(Snapshots, Corpus,
                         ::testing::Values("training", "decode-kv-cache", "moe-record-stream", "layer-streaming",
                                           "layer-streaming-cut", "two-devices"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

TEST(TorchSnapshot, TheDeviceIsChosenOrGiven) {
  const std::string bytes = read(kDir + "/two-devices.pickle");
  Result<TorchSnapshotImport> zero = import_torch_snapshot(bytes, "two", 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->source.device, 0);
  EXPECT_EQ(zero->source.devices, 2);
  Result<TorchSnapshotImport> two = import_torch_snapshot(bytes, "two", 2);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.error().message.find("devices 0..1"), std::string::npos) << two.error().message;
}

TEST(TorchSnapshot, TheTraceNamesTheProgramsFrames) {
  Result<TorchSnapshotImport> imported = import_torch_snapshot(read(kDir + "/decode-kv-cache.pickle"), "d");
  ASSERT_TRUE(imported.ok());
  EXPECT_NE(imported->trace.find("\"tag\":\"generate.py:71:torch.cat\""), std::string::npos);
}

TEST(TorchSnapshot, MalformedFilesNameTheEntryAndField) {
  const auto cases = nlohmann::json::parse(read(kDir + "/malformed.json"));
  ASSERT_GE(cases.size(), 6u);
  for (const auto& [name, words] : cases.items()) {
    Result<TorchSnapshotImport> imported = import_torch_snapshot(read(kDir + "/" + name + ".pickle"), name);
    ASSERT_FALSE(imported.ok()) << name;
    EXPECT_EQ(imported.error().code, ErrorCode::invalid_argument) << name;
    EXPECT_NE(imported.error().message.find(words.get<std::string>()), std::string::npos)
        << name << ": " << imported.error().message;
  }
}

TEST(TorchSnapshot, TruncatedAndEmptyFilesAreRefused) {
  const std::string bytes = read(kDir + "/training.pickle");
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, bytes.size() / 3, bytes.size() - 1}) {
    Result<TorchSnapshotImport> imported = import_torch_snapshot(std::string_view(bytes).substr(0, n), "cut");
    ASSERT_FALSE(imported.ok()) << n;
    EXPECT_EQ(imported.error().code, ErrorCode::invalid_argument);
  }
}

TEST(TorchSnapshot, HostilePicklesExecuteNothing) {
  // Each would run `touch ferry-hostile-ran` under Python's pickle.load.
  std::filesystem::remove("ferry-hostile-ran");
  for (const char* name : {"hostile-reduce-top", "hostile-reduce-frame"}) {
    Result<TorchSnapshotImport> imported = import_torch_snapshot(read(kDir + "/" + std::string(name) + ".pickle"), name);
    ASSERT_FALSE(imported.ok()) << name;
    EXPECT_NE(imported.error().message.find("opcode STACK_GLOBAL (0x93)"), std::string::npos)
        << imported.error().message;
    EXPECT_NE(imported.error().message.find("byte "), std::string::npos);
    ReplayOptions options;
    Result<ReplayReport> replayed = replay_trace_file(kDir + "/" + std::string(name) + ".pickle", options);
    ASSERT_FALSE(replayed.ok());
    EXPECT_EQ(replayed.error().code, ErrorCode::invalid_argument);
  }
  EXPECT_FALSE(std::filesystem::exists("ferry-hostile-ran"));
}

TEST(TorchSnapshot, NonAsciiFramesKeepTheirUtf8ThroughTheTraceAndReport) {
  const std::string name = "v\u00e4rme_\u6ce8\u610f";  // UTF-8, as BINUNICODE holds it
  Entry alloc{"alloc", 0x1000, 4096, 0};
  alloc.filename = "\u043c\u043e\u0434\u0435\u043b\u044c.py";
  alloc.name = name;
  Entry bad{"alloc", 0x3000, 512, 0};
  bad.name = "x\xff\xc3y";  // no well-formed sequence: each such byte becomes '?'
  const std::vector<Entry> history = {alloc, bad, {"free_requested", 0x1000, 4096, 0}, {"free_completed", 0x1000, 4096, 0}};
  Result<TorchSnapshotImport> imported = import_torch_snapshot(snapshot_pickle(history), "utf8");
  ASSERT_TRUE(imported.ok()) << imported.error().message;
  const std::string tag = alloc.filename + ":1:" + name;
  EXPECT_NE(imported->trace.find("\"tag\":\"" + tag + "\""), std::string::npos) << imported->trace;
  EXPECT_NE(imported->trace.find("\"tag\":\"train.py:1:x??y\""), std::string::npos) << imported->trace;
  ReplayOptions options;
  Result<ReplayReport> report = replay_trace_text(imported->trace, "utf8", options);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_TRUE(report->passed()) << report_summary(*report);
}

// A history with no block in it imports to no ops: its replay is refused as empty
// (it would check nothing), while one alloc is enough to replay.
TEST(TorchSnapshot, AHistoryWithoutBlocksIsAnEmptyTraceAndOneAllocReplays) {
  const std::string segments = snapshot_pickle({{"segment_alloc", 0, 2 << 20, 0}, {"segment_free", 0, 2 << 20, 0}});
  Result<TorchSnapshotImport> imported = import_torch_snapshot(segments, "segments.pickle");
  ASSERT_TRUE(imported.ok()) << imported.error().message;
  EXPECT_EQ(imported->source.segment_allocs, 1u);
  Result<ReplayReport> empty = replay_trace_text(segments, "segments.pickle", ReplayOptions{});
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.error().code, ErrorCode::invalid_argument);
  EXPECT_EQ(empty.error().message.rfind("segments.pickle: the trace is empty", 0), 0u) << empty.error().message;

  Result<ReplayReport> one = replay_trace_text(snapshot_pickle({{"alloc", 0x1000, 4096, 0}}), "one.pickle", ReplayOptions{});
  ASSERT_TRUE(one.ok()) << one.error().message;
  EXPECT_TRUE(one->passed()) << report_summary(*one);
  EXPECT_EQ(one->ops, 1u);
}

// The snapshot page's data: PyTorch's reserved line (from the history's segment
// events) beside ferry's, and the largest live blocks at the peak named by frames.
TEST(TorchSnapshot, ThePageDrawsPyTorchsReservedAndNamesTheLargestBlocks) {
  TimelineOptions options;
  Result<PoolTimeline> t = observe_replay(kDir + "/training.pickle", options);
  ASSERT_TRUE(t.ok()) << t.error().message;
  ASSERT_TRUE(t->report.source.has_value());
  const auto expect = nlohmann::json::parse(read(kDir + "/training.expect.json"));
  const auto page = nlohmann::json::parse(replay::timeline_page_json(*t));
  const auto& chart = page.at("chart");
  ASSERT_TRUE(chart.contains("torch_reserved_bytes"));
  const auto& hi = chart.at("torch_reserved_bytes_max");
  ASSERT_EQ(hi.size(), chart.at("reserved_bytes").size());
  std::uint64_t top = 0;
  for (const auto& v : hi) top = std::max(top, v.get<std::uint64_t>());
  EXPECT_EQ(top, expect.at("peak_reserved_bytes").get<std::uint64_t>());
  // Before the first line the history has mapped the first parameter's segment (4 MiB) already.
  EXPECT_EQ(chart.at("torch_reserved_bytes").front().get<std::uint64_t>(), 4u << 20);
  // The history ends with the program's memory still reserved (no empty_cache).
  EXPECT_GT(chart.at("torch_reserved_bytes").back().get<std::uint64_t>(), 0u);

  // training(): at the peak, the optimizer state (2 x 4 MiB) is the largest.
  const auto& largest = page.at("largest_at_peak");
  ASSERT_FALSE(largest.empty());
  EXPECT_LE(largest.size(), replay::kLargestBlocks);
  for (std::size_t i = 1; i < largest.size(); ++i) {
    EXPECT_GE(largest[i - 1].at("bytes").get<std::uint64_t>(), largest[i].at("bytes").get<std::uint64_t>());
  }
  EXPECT_EQ(largest[0].at("bytes").get<std::uint64_t>(), 8u << 20);
  EXPECT_NE(largest[0].at("owner").get<std::string>().find("optim.py:88:_init_group"), std::string::npos)
      << largest[0].dump();

  // A plain trace's page has no PyTorch line.
  Result<TorchSnapshotImport> imported = import_torch_snapshot(read(kDir + "/training.pickle"), "training");
  ASSERT_TRUE(imported.ok());
  Result<PoolTimeline> plain = observe_replay_text(imported->trace, "training.jsonl", options);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(nlohmann::json::parse(replay::timeline_page_json(*plain)).at("chart").contains("torch_reserved_bytes"));
}

}  // namespace
}  // namespace ferry
