// A snapshot's work and output are bounded by its size, its figures by what a
// device can hold, and a history that contradicts itself is refused naming both
// entries, and what the import writes the replay reads (issue 41 items 4-7).
// Each pickle here is written op by op, sharing values through the memo as a
// hostile file would.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/replay.hpp"
#include "ferry/torch_snapshot.hpp"

namespace ferry {
namespace {

// A protocol-4 pickle written opcode by opcode.
class Pickle {
 public:
  using Field = std::variant<std::string, std::uint64_t>;

  Pickle& ops(std::string_view raw) {
    p_ += raw;
    return *this;
  }
  Pickle& str(std::string_view s) {
    p_ += 'X';  // BINUNICODE: u32 length, UTF-8
    u32(static_cast<std::uint32_t>(s.size()));
    p_ += s;
    return *this;
  }
  Pickle& num(std::uint64_t v) {
    p_ += "\x8a\x09";  // LONG1 of 9 bytes: 8 and a zero sign byte
    for (int i = 0; i < 8; ++i) p_ += static_cast<char>((v >> (8 * i)) & 0xFF);
    p_ += '\0';
    return *this;
  }
  Pickle& put(std::uint32_t memo) {
    p_ += 'r';  // LONG_BINPUT
    u32(memo);
    return *this;
  }
  Pickle& get(std::uint32_t memo) {
    p_ += 'j';  // LONG_BINGET
    u32(memo);
    return *this;
  }
  // A dict of str keys to str or int values, left on the stack.
  Pickle& dict(const std::vector<std::pair<std::string, Field>>& fields) {
    ops("}(");
    for (const auto& [key, value] : fields) {
      str(key);
      if (const auto* s = std::get_if<std::string>(&value)) {
        str(*s);
      } else {
        num(std::get<std::uint64_t>(value));
      }
    }
    return ops("u");
  }
  // A history entry with one frame, left on the stack.
  Pickle& entry(const std::string& action, std::uint64_t addr, std::uint64_t size,
                const std::string& frame_name = "step") {
    ops("}(").str("action").str(action).str("addr").num(addr).str("size").num(size).str("stream").num(0);
    str("frames").ops("]");
    dict({{"filename", std::string("train.py")}, {"line", std::uint64_t{7}}, {"name", frame_name}});
    return ops("au");  // APPEND the frame, SETITEMS into the entry
  }
  std::string done() const { return "\x80\x04" + p_ + "."; }

 private:
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) p_ += static_cast<char>((v >> (8 * i)) & 0xFF);
  }
  std::string p_;
};

// A root dict holding `before` (pairs pushed by the caller), then
// device_traces = [history], the history written by `history`.
template <class Before, class History>
std::string snapshot(Before&& before, History&& history) {
  Pickle p;
  p.ops("}(");
  before(p);
  p.str("device_traces").ops("]](");
  history(p);
  p.ops("ea");  // APPENDS into the history, APPEND it to device_traces
  p.ops("u");   // SETITEMS into the root
  return p.done();
}

std::string history_of(const std::vector<std::pair<std::string, std::pair<std::uint64_t, std::uint64_t>>>& entries) {
  return snapshot([](Pickle&) {}, [&](Pickle& p) {
    for (const auto& [action, where] : entries) p.entry(action, where.first, where.second);
  });
}

void expect_refused(const std::string& bytes, const std::string& says) {
  Result<TorchSnapshotImport> imported = import_torch_snapshot(bytes, "hostile.pickle");
  ASSERT_FALSE(imported.ok()) << "imported: " << source_json(imported->source);
  EXPECT_EQ(imported.error().code, ErrorCode::invalid_argument) << imported.error().message;
  EXPECT_EQ(imported.error().message.rfind("hostile.pickle: ", 0), 0u) << imported.error().message;
  EXPECT_NE(imported.error().message.find(says), std::string::npos) << imported.error().message;
}

// One dict of K keys shared by M history entries: reading each entry scans the
// dict again, K * M visits from K + M bytes.
std::string shared_entry_dict(std::uint32_t keys, std::uint32_t entries) {
  return snapshot(
      [&](Pickle& p) {
        p.str("shared").ops("}").put(0).ops("(").str("action").str("snapshot");
        for (std::uint32_t k = 0; k < keys; ++k) p.str("k" + std::to_string(k)).num(k);
        p.ops("u");
      },
      [&](Pickle& p) {
        for (std::uint32_t m = 0; m < entries; ++m) p.get(0);
      });
}

TEST(TorchSnapshotBounds, SharedValuesReadAgainAreBoundedByTheFilesSize) {
  const std::string small = shared_entry_dict(200, 200);
  Result<TorchSnapshotImport> fine = import_torch_snapshot(small, "hostile.pickle");
  ASSERT_TRUE(fine.ok()) << fine.error().message;
  EXPECT_EQ(fine->source.events, 200u);

  // Without the budget this is 16 million visits for ~100 KB (seconds, and
  // quadratic beyond); with it, refused after 64 per byte.
  expect_refused(shared_entry_dict(4000, 4000), "visits per byte");
}

// segments = [S] * n, S.blocks = [B] * n: n * n blocks from a few bytes.
std::string square_segments(std::uint32_t n, const std::string& state) {
  return snapshot(
      [&](Pickle& p) {
        p.str("segments").ops("](");
        p.ops("}").put(1).ops("(").str("device").num(0).str("total_size").num(2 << 20).str("stream").num(0);
        p.str("blocks").ops("](");
        p.dict({{"address", std::uint64_t{0x100000}}, {"size", std::uint64_t{4096}}, {"state", state}}).put(2);
        for (std::uint32_t i = 1; i < n; ++i) p.get(2);
        p.ops("eu");  // APPENDS the blocks, SETITEMS into S
        for (std::uint32_t i = 1; i < n; ++i) p.get(1);
        p.ops("e");  // APPENDS the segments
      },
      [](Pickle& p) { p.entry("alloc", 0x1000, 512); });
}

TEST(TorchSnapshotBounds, ASquareOfSharedSegmentsIsRefusedNotWalked) {
  expect_refused(square_segments(2000, "inactive"), "visits per byte");
}

TEST(TorchSnapshotBounds, AnActiveBlockListedTwiceIsRefusedNamingBothListings) {
  // Counted once per listing, 2000 * 2000 listings were 674 MB of reconstructed blocks.
  expect_refused(square_segments(3, "active_allocated"),
                 "segments[0].blocks[1].address: the active block at 1048576 is listed already as "
                 "segments[0].blocks[0]");
}

TEST(TorchSnapshotBounds, FiguresNoDeviceCouldHoldAreRefusedNamingTheEntry) {
  constexpr std::uint64_t q = std::uint64_t{1} << 48;  // a quarter of kMaxDeviceBytes
  expect_refused(history_of({{"alloc", {0, q}}, {"alloc", {q, q}}, {"alloc", {2 * q, q}}, {"alloc", {3 * q, q}},
                             {"alloc", {4 * q, q}}}),
                 "device_traces[0][4]: the live blocks come to 1407374883553280 bytes, beyond any device");
  expect_refused(history_of({{"alloc", {0x1000, std::uint64_t{1} << 62}}}), ".size: 4611686018427387904 is beyond any device");
  // Only frees of segments: PyTorch's reserved bytes before the history would be their sum.
  expect_refused(history_of({{"segment_free", {0, 2 * q}}, {"segment_free", {2 * q, 2 * q}},
                             {"segment_free", {4 * q, 2 * q}}, {"alloc", {0x1000, 512}}}),
                 "device_traces[0][2]: the segments it allocated or freed come to");
  // Two segments of 2^64 - 1 bytes once summed to "0 B".
  const std::string huge = snapshot(
      [](Pickle& p) {
        p.str("segments").ops("](");
        for (int i = 0; i < 2; ++i) {
          p.dict({{"device", std::uint64_t{0}}, {"total_size", ~std::uint64_t{0}}, {"stream", std::uint64_t{0}}});
        }
        p.ops("e");
      },
      [](Pickle& p) { p.entry("alloc", 0x1000, 512); });
  expect_refused(huge, "segments[0].total_size: 18446744073709551615 bytes on top of the segments before it (0)");
  expect_refused(history_of({{"alloc", {~std::uint64_t{0} - 100, 4096}}}), ".addr: the block would end past 2^64");
}

TEST(TorchSnapshotBounds, AHistoryThatContradictsItselfIsRefusedNamingBothEntries) {
  expect_refused(history_of({{"alloc", {0x1000, 4096}}, {"free_completed", {0x1000, 4096}},
                             {"free_completed", {0x1000, 4096}}}),
                 "device_traces[0][2].addr: a free of address 4096, freed already at device_traces[0][1]");
  expect_refused(history_of({{"alloc", {0x1000, 4096}}, {"alloc", {0x1800, 4096}}}),
                 "device_traces[0][1].addr: the block [6144, 10240) overlaps the live block [4096, 8192) of "
                 "device_traces[0][0]");
  expect_refused(history_of({{"alloc", {0x1000, 4096}}, {"alloc", {0x800, 4096}}}),
                 "device_traces[0][1].addr: the block [2048, 6144) overlaps the live block [4096, 8192)");
  // A block alive before the history (its alloc dropped) may not overlap a live one either.
  expect_refused(history_of({{"alloc", {0x1000, 4096}}, {"free_requested", {0x1100, 256}}}),
                 "device_traces[0][1].addr: the block [4352, 4608) overlaps the live block [4096, 8192)");

  // The same address allocated again after its free, and neighbours that touch, are consistent.
  Result<TorchSnapshotImport> fine =
      import_torch_snapshot(history_of({{"alloc", {0x1000, 4096}}, {"free_completed", {0x1000, 4096}},
                                        {"alloc", {0x1000, 4096}}, {"alloc", {0x2000, 4096}},
                                        {"alloc", {0x800, 0x800}}}),
                            "fine.pickle");
  ASSERT_TRUE(fine.ok()) << fine.error().message;
  EXPECT_EQ(fine->source.allocs, 4u);
  EXPECT_EQ(fine->source.peak_requested_bytes, 2 * 4096u + 0x800u);
}

TEST(TorchSnapshotBounds, ALongFrameNameIsCutSoTheReplayReadsWhatTheImportWrote) {
  const std::string name(600 << 10, 'n');  // once a 1.2 MiB trace line the replayer refused as "SNAP:1"
  const std::string bytes = snapshot([](Pickle&) {}, [&](Pickle& p) { p.entry("alloc", 0x1000, 4096, name); });
  Result<TorchSnapshotImport> imported = import_torch_snapshot(bytes, "long.pickle");
  ASSERT_TRUE(imported.ok()) << imported.error().message;
  EXPECT_LT(imported->trace.size(), 1400u) << "the tag is cut to 512 bytes, twice on the line";
  EXPECT_NE(imported->trace.find("train.py:7:nnn"), std::string::npos);
  EXPECT_NE(imported->trace.find("n...\""), std::string::npos) << imported->trace.substr(0, 200);

  Result<ReplayReport> report = replay_trace_text(bytes, "long.pickle", ReplayOptions{});
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_TRUE(report->passed());

  // A multi-byte character at the cut is dropped whole, never split: "train.py:7:"
  // and 497 bytes put a three-byte character across byte 509, where "..." begins.
  const std::string wide = std::string(497, 'w') + "\xe2\x82\xac\xe2\x82\xac";
  Result<TorchSnapshotImport> utf8 = import_torch_snapshot(
      snapshot([](Pickle&) {}, [&](Pickle& p) { p.entry("alloc", 0x1000, 4096, wide); }), "utf8.pickle");
  ASSERT_TRUE(utf8.ok()) << utf8.error().message;
  EXPECT_NE(utf8->trace.find(":7:" + std::string(497, 'w') + "...\""), std::string::npos) << utf8->trace;
  EXPECT_EQ(utf8->trace.find('\xe2'), std::string::npos) << utf8->trace;
}

TEST(TorchSnapshotBounds, ATraceFarLargerThanItsFileIsRefused) {
  // An alloc and its free shared through the memo: each repetition is 10 bytes of
  // file and ~1.6 KB of trace (two 512-byte tags on the alloc line, one on the free).
  const std::string frame(600, 'f');
  const auto repeated = [&](std::uint32_t pairs) {
    return snapshot(
        [&](Pickle& p) {
          p.str("a").entry("alloc", 0x1000, 4096, frame).put(0);
          p.str("f").entry("free_completed", 0x1000, 4096, frame).put(1);
        },
        [&](Pickle& p) {
          for (std::uint32_t i = 0; i < pairs; ++i) p.get(0).get(1);
        });
  };
  Result<TorchSnapshotImport> fine = import_torch_snapshot(repeated(100), "hostile.pickle");
  ASSERT_TRUE(fine.ok()) << fine.error().message;
  EXPECT_EQ(fine->source.allocs, 100u);
  expect_refused(repeated(20000), "bytes per byte of the file");
}

}  // namespace
}  // namespace ferry
