// The C ABI under misuse and load (issue 24), from C++ over libferry.so: a launch
// callback that calls ferry, a download after a failed kernel, an absurd
// allocation's cause, trace files that cannot be written, trace start/stop beside
// threads that never stop calling, and captures racing the calls they record.
#include "ferry/ferry.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

class CAbi : public ::testing::Test {
 protected:
  void SetUp() override {
    ferry_runtime_options o;
    ferry_runtime_options_init(&o);
    o.profile = "tiny";
    ASSERT_EQ(ferry_runtime_create(&o, &rt_), FERRY_OK) << ferry_last_error();
  }
  void TearDown() override { ferry_runtime_destroy(rt_); }

  ferry_handle alloc(uint64_t bytes, uint32_t stream = 0) {
    ferry_handle h{};
    EXPECT_EQ(ferry_alloc(rt_, bytes, stream, &h), FERRY_OK) << ferry_last_error();
    return h;
  }

  ferry_runtime rt_ = nullptr;
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ferry-capi-" + name + "-" + std::to_string(::getpid())))
      .string();
}

struct Reentry {
  ferry_runtime rt;
  ferry_handle other;
  std::vector<ferry_status> got;
  std::vector<std::string> messages;
};

ferry_status calls_ferry(const ferry_launch_context*, void* user_data) {
  auto& r = *static_cast<Reentry*>(user_data);
  const auto note = [&](ferry_status s) {
    r.got.push_back(s);
    r.messages.emplace_back(ferry_last_error());
  };
  std::byte buf[16];
  note(ferry_free(r.rt, r.other));
  note(ferry_download(r.rt, 0, r.other, 0, buf, sizeof buf));
  note(ferry_upload(r.rt, 0, r.other, 0, buf, sizeof buf));
  note(ferry_synchronize(r.rt));
  note(ferry_stream_wait(r.rt, 1, 0));
  note(ferry_record_use(r.rt, 0, &r.other, 1));
  note(ferry_trace_start(r.rt, "never-written.jsonl"));
  ferry_handle h{};
  note(ferry_alloc(r.rt, 4096, 0, &h));
  ferry_runtime_destroy(r.rt);  // refused too: nothing to report it through but the last error
  r.messages.emplace_back(ferry_last_error());
  return FERRY_OK;
}

// Item 5, through C: every call from inside a launch callback is refused.
TEST_F(CAbi, ACallbackThatCallsFerryIsRefusedNotDeadlocked) {
  const ferry_handle a = alloc(4096);
  Reentry r{rt_, alloc(4096), {}, {}};
  const ferry_operand op{a, 0, 0, FERRY_READ};
  ASSERT_EQ(ferry_launch(rt_, 0, &op, 1, calls_ferry, &r, 0, 0), FERRY_OK) << ferry_last_error();
  ASSERT_EQ(ferry_synchronize(rt_), FERRY_OK) << ferry_last_error();
  ASSERT_EQ(r.got.size(), 8u);
  for (std::size_t i = 0; i < r.got.size(); ++i) {
    EXPECT_EQ(r.got[i], FERRY_ERROR_INVALID_ARGUMENT) << i << ": " << r.messages[i];
    EXPECT_NE(r.messages[i].find("inside a user kernel"), std::string::npos) << r.messages[i];
  }
  EXPECT_NE(r.messages.back().find("ferry_runtime_destroy"), std::string::npos) << r.messages.back();
  EXPECT_EQ(ferry_free(rt_, r.other), FERRY_OK) << "the refused free freed nothing";
  EXPECT_FALSE(std::filesystem::exists("never-written.jsonl"));
}

ferry_status fails(const ferry_launch_context*, void*) { return FERRY_ERROR_INVALID_ARGUMENT; }

// Item 6, through C: the download after a failed launch reports the fault.
TEST_F(CAbi, ADownloadAfterAFailedLaunchReportsTheFault) {
  const ferry_handle a = alloc(4096);
  std::vector<unsigned char> bytes(4096, 0x5a);
  ASSERT_EQ(ferry_upload(rt_, 0, a, 0, bytes.data(), bytes.size()), FERRY_OK) << ferry_last_error();
  const ferry_operand op{a, 0, 0, FERRY_WRITE};
  ASSERT_EQ(ferry_launch(rt_, 0, &op, 1, fails, nullptr, 0, 0), FERRY_OK);
  std::vector<unsigned char> back(4096);
  EXPECT_EQ(ferry_download(rt_, 0, a, 0, back.data(), back.size()), FERRY_ERROR_INVALID_ARGUMENT)
      << "the pre-kernel bytes downloaded as a success";
  EXPECT_NE(std::string(ferry_last_error()).find("launch function returned"), std::string::npos)
      << ferry_last_error();
  EXPECT_NE(ferry_synchronize(rt_), FERRY_OK);
}

// Item 7: a request past the capacity is named as such, never fragmentation.
TEST_F(CAbi, AnAllocationLargerThanTheCapacityNamesTheCapacity) {
  ferry_handle h{};
  ASSERT_EQ(ferry_alloc(rt_, UINT64_MAX, 0, &h), FERRY_ERROR_OUT_OF_MEMORY);
  const std::string why = ferry_last_error();
  EXPECT_NE(why.find("larger than the whole capacity"), std::string::npos) << why;
  EXPECT_EQ(why.find("fragmentation"), std::string::npos) << why;
}

// Items 3 and 8: a FIFO, /dev/full and /proc/self/mem are refused by
// ferry_trace_start itself, at once, and the runtime stays usable.
TEST_F(CAbi, TraceStartRefusesAFifoAndUnwritableFiles) {
  const std::string fifo = temp_path("fifo");
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(ferry_trace_start(rt_, fifo.c_str()), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find(fifo), std::string::npos) << ferry_last_error();
  std::filesystem::remove(fifo);
  for (const char* path : {"/dev/full", "/proc/self/mem"}) {
    if (!std::filesystem::exists(path)) continue;
    EXPECT_EQ(ferry_trace_start(rt_, path), FERRY_ERROR_INVALID_ARGUMENT) << path;
  }
  EXPECT_EQ(ferry_trace_stop(rt_), FERRY_ERROR_INVALID_ARGUMENT) << "nothing was started";
  const ferry_handle a = alloc(4096);
  EXPECT_EQ(ferry_free(rt_, a), FERRY_OK);
}

// Item 4: trace start and stop complete while threads loop downloads. Bounded
// by operations, not time: each worker stops after kOps downloads, and every
// start/stop pair must return while the workers are still running (a
// reader-preferring lock let them starve it until the workers were done).
TEST_F(CAbi, TraceStartAndStopAreNotStarvedByCallingThreads) {
  constexpr int kThreads = 4;
  constexpr std::uint64_t kOps = 200000;
  constexpr int kCycles = 3;
  std::vector<ferry_handle> blocks;
  for (int i = 0; i < kThreads; ++i) blocks.push_back(alloc(256));
  std::atomic<int> running{kThreads};
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> failures{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < kThreads; ++i) {
    workers.emplace_back([&, i] {
      unsigned char buf[256];
      for (std::uint64_t n = 0; n < kOps && !stop.load(); ++n) {
        if (ferry_download(rt_, static_cast<uint32_t>(i), blocks[static_cast<std::size_t>(i)], 0, buf, sizeof buf) !=
            FERRY_OK) {
          failures.fetch_add(1);
        }
      }
      running.fetch_sub(1);
    });
  }
  const std::string path = temp_path("starve");
  int cycles_while_running = 0;
  for (int c = 0; c < kCycles; ++c) {
    ASSERT_EQ(ferry_trace_start(rt_, path.c_str()), FERRY_OK) << ferry_last_error();
    ASSERT_EQ(ferry_trace_stop(rt_), FERRY_OK) << ferry_last_error();
    if (running.load() == kThreads) ++cycles_while_running;
  }
  stop.store(true);
  for (auto& w : workers) w.join();
  std::filesystem::remove(path);
  EXPECT_EQ(failures.load(), 0u);
  EXPECT_EQ(cycles_while_running, kCycles) << "start/stop waited for the workers to finish";
}

ferry_status reads_its_state(const ferry_launch_context*, void* user_data) {
  return *static_cast<const int*>(user_data) == 1 ? FERRY_OK : FERRY_ERROR_BACKEND;
}

// The threaded capture-versus-copy fuzzer through C (issue 41): one thread makes
// the calls a capture records over host memory on a stream another thread keeps
// beginning and ending captures on. The C contract leaves the host memory's
// lifetime to the program, so every buffer stays alive here; under test is that
// ferry answers each call with a documented status, that every graph replays,
// and that the sanitizers (ASan in dev, TSan in tools/ci-tsan) stay quiet.
TEST_F(CAbi, CapturesRacingCopiesFromAnotherThreadStayWellDefined) {
  constexpr std::uint64_t kLen = 4000;
  constexpr int kCalls = 3000;
  constexpr int kMaxCaptures = 4000;
  ferry_runtime_options o;
  ferry_runtime_options_init(&o);
  o.profile = "tiny";
  o.integrity = "off";  // an upload is recorded only then
  ferry_runtime rt = nullptr;
  ASSERT_EQ(ferry_runtime_create(&o, &rt), FERRY_OK) << ferry_last_error();
  ferry_handle a{};
  ASSERT_EQ(ferry_alloc(rt, kLen, 0, &a), FERRY_OK) << ferry_last_error();
  std::vector<std::unique_ptr<unsigned char[]>> buffers;
  static const int kState = 1;
  std::atomic<bool> done{false};
  std::atomic<int> undocumented{0};
  std::thread caller([&] {
    std::mt19937 mix(41);
    for (int i = 0; i < kCalls; ++i) {
      buffers.push_back(std::make_unique<unsigned char[]>(kLen));
      void* buf = buffers.back().get();
      ferry_status s = FERRY_OK;
      switch (mix() % 3) {
        case 0: s = ferry_copy_to_host(rt, 1, a, buf, kLen); break;
        case 1: s = ferry_upload(rt, 1, a, 0, buf, kLen); break;
        default: {
          const ferry_operand op{a, 0, 0, FERRY_READ};
          s = ferry_launch(rt, 1, &op, 1, reads_its_state, const_cast<int*>(&kState), 0, 0);
        }
      }
      if (s != FERRY_OK && s != FERRY_ERROR_INVALID_ARGUMENT) undocumented.fetch_add(1);
    }
    done.store(true);
  });
  std::vector<ferry_graph> graphs;
  for (int n = 0; n < kMaxCaptures && !done.load(); ++n) {
    ASSERT_EQ(ferry_begin_capture(rt, 1, nullptr), FERRY_OK) << ferry_last_error();
    ferry_graph g = nullptr;
    const ferry_status s = ferry_end_capture(rt, 1, &g);
    ASSERT_TRUE(s == FERRY_OK || s == FERRY_ERROR_INVALID_ARGUMENT) << ferry_last_error();  // spoiled: no graph
    if (s == FERRY_OK) graphs.push_back(g);
  }
  caller.join();
  EXPECT_EQ(undocumented.load(), 0);
  EXPECT_EQ(ferry_synchronize(rt), FERRY_OK) << ferry_last_error();
  for (ferry_graph g : graphs) EXPECT_EQ(ferry_graph_launch(rt, g, 1), FERRY_OK) << ferry_last_error();
  EXPECT_EQ(ferry_synchronize(rt), FERRY_OK) << ferry_last_error();
  for (ferry_graph g : graphs) EXPECT_EQ(ferry_graph_destroy(g), FERRY_OK);
  ferry_runtime_destroy(rt);
}

}  // namespace
