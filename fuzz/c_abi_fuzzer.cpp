// Fuzzes the C ABI (ferry.h) with a runtime made from options decoded from the
// input and then a sequence of calls on it, NULLs, bad streams, forged handles,
// overflowing offsets and sizes included. Beyond "no crash, no sanitizer report"
// it holds ferry.h's conventions for every call:
//   * a failed call returns a status with a message in ferry_last_error() and
//     leaves its outputs untouched; no call fails with an escaped exception
//     ("internal error");
//   * a freed or forged handle is STALE_HANDLE, never another block's address;
//   * the bytes a download returns are the ones the program wrote (uploads and
//     launches, once ordered by the stream or a synchronize), unless the
//     integrity policy is allowed to miss a corruption it was asked to inject;
//   * a cache slot holds its entry's pieces at the offsets acquire returned;
//   * a launch sees its operands' sizes and a view of each on the sim;
//   * a launch function that calls ferry back (any entry point) is refused with
//     INVALID_ARGUMENT naming the rule, never a deadlock;
//   * a thread toggling ferry_trace_start / ferry_trace_stop beside the calls
//     never blocks them nor is blocked for good (the input ends; it is joined).
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "ferry/ferry.h"

#include "fuzz_input.hpp"

namespace {

constexpr std::uint32_t kStreams = 4;
constexpr std::uint64_t kMaxModelBytes = 64 << 10;  // blocks the model mirrors byte by byte
constexpr std::size_t kMaxOps = 120;

using ferry_fuzz::Input;
[[noreturn]] void finding(const std::string& what) { ferry_fuzz::finding("fuzz_capi", what); }

// A regular file for traces, one per process (and per writer).
const std::string& trace_path(int writer = 0) {
  static const std::string paths[2] = {
      (std::filesystem::temp_directory_path() / ("ferry-fuzz-trace-" + std::to_string(::getpid()))).string(),
      (std::filesystem::temp_directory_path() / ("ferry-fuzz-trace-t-" + std::to_string(::getpid()))).string()};
  return paths[writer];
}

bool same(ferry_handle a, ferry_handle b) {
  return a.pool == b.pool && a.slot == b.slot && a.generation == b.generation;
}

std::string handle_text(ferry_handle h) {
  return "{" + std::to_string(h.pool) + "," + std::to_string(h.slot) + "," + std::to_string(h.generation) + "}";
}

// Checks ferry.h's conventions on one call's status; true when it succeeded.
bool checked(ferry_status s, const char* call) {
  const std::string message = ferry_last_error();
  if (s == FERRY_OK) return true;
  if (s < FERRY_OK || s > FERRY_ERROR_TIMEOUT) finding(std::string(call) + ": a status outside the enum");
  if (message.empty()) finding(std::string(call) + ": failed with no message");
  if (message.find("internal error") != std::string::npos) finding(std::string(call) + ": " + message);
  return false;
}

void expect_status(ferry_status s, ferry_status want, const char* call) {
  checked(s, call);
  if (s != want) {
    finding(std::string(call) + ": " + ferry_status_name(s) + ", expected " + ferry_status_name(want) + ": " +
            ferry_last_error());
  }
}

// What the program knows of one block's bytes.
struct Block {
  ferry_handle handle{};
  std::uint64_t bytes = 0;
  std::vector<std::uint8_t> content;  // mirrored when bytes <= kMaxModelBytes
  std::vector<bool> known;
  std::array<bool, kStreams> pending{};  // streams with writes not yet known complete
};

// Records a write of [off, off + len) on stream s; `byte(j)` is the byte at off + j.
// Unordered with another stream's pending write, the block's bytes are unknown
// until a synchronize (either may land last).
template <class Byte>
void record_write(Block& b, std::uint32_t s, std::uint64_t off, std::uint64_t len, bool exact, Byte&& byte) {
  bool racing = false;
  for (std::uint32_t t = 0; t < kStreams; ++t) racing = racing || (t != s && b.pending[t]);
  b.pending[s] = true;
  if (b.content.empty()) return;
  if (racing) {
    std::fill(b.known.begin(), b.known.end(), false);
    return;
  }
  for (std::uint64_t j = 0; j < len; ++j) {
    b.content[off + j] = byte(j);
    b.known[off + j] = exact;
  }
}

// What one launch does: writes pattern bytes into its write operands.
struct LaunchPlan {
  std::vector<ferry_operand> operands;
  std::vector<std::uint64_t> sizes;  // each operand's bytes, as the kernel must see them
  std::uint8_t seed = 0;
  int result = FERRY_OK;  // what the function returns: now and then an error, or no status at all
  bool ran = false;
  ferry_runtime reenter = nullptr;  // set: the function calls ferry back, which must be refused
  std::uint8_t reentry = 0;         // which call
};

// A call made from inside a launch function: INVALID_ARGUMENT naming the rule.
void expect_refused_inside(ferry_status s, const char* call) {
  if (s != FERRY_ERROR_INVALID_ARGUMENT || std::string(ferry_last_error()).find("inside a user kernel") == std::string::npos) {
    finding(std::string(call) + " from inside a launch function: " + ferry_status_name(s) + ": " + ferry_last_error());
  }
}

void call_back_into_ferry(ferry_runtime rt, std::uint8_t which, const ferry_launch_context* ctx) {
  std::uint8_t buf[8] = {};
  ferry_handle h{};
  switch (which % 8) {
    case 0: expect_refused_inside(ferry_synchronize(rt), "ferry_synchronize"); break;
    case 1: expect_refused_inside(ferry_alloc(rt, 64, 0, &h), "ferry_alloc"); break;
    case 2: expect_refused_inside(ferry_free(rt, h), "ferry_free"); break;
    case 3: expect_refused_inside(ferry_download(rt, 0, h, 0, buf, sizeof buf), "ferry_download"); break;
    case 4: expect_refused_inside(ferry_stream_wait(rt, 1, 0), "ferry_stream_wait"); break;
    case 5: expect_refused_inside(ferry_trace_start(rt, "never-written.jsonl"), "ferry_trace_start"); break;
    case 6: expect_refused_inside(ferry_hold(rt, 0, 1), "ferry_hold"); break;
    case 7:
      expect_refused_inside(ferry_launch(rt, 0, nullptr, 0, [](const ferry_launch_context*, void*) { return FERRY_OK; },
                                         nullptr, 0, 0),
                            "ferry_launch");
      break;
  }
  (void)ctx;
}

}  // namespace

extern "C" ferry_status fuzz_launch(const ferry_launch_context* ctx, void* user_data);  // c_abi_kernel.c

extern "C" int fuzz_launch_body(const ferry_launch_context* ctx, void* user_data) {
  auto* plan = static_cast<LaunchPlan*>(user_data);
  plan->ran = true;
  if (plan->reenter != nullptr) call_back_into_ferry(plan->reenter, plan->reentry, ctx);
  if (ctx == nullptr || ctx->operand_count != plan->operands.size()) finding("launch: wrong operand count");
  for (std::uint32_t i = 0; i < ctx->operand_count; ++i) {
    if (ctx->bytes[i] != plan->sizes[i]) finding("launch: an operand's size differs from the request");
    if (ctx->host_views == nullptr || ctx->host_views[i] == nullptr) finding("launch: no host view on the sim");
    auto* view = static_cast<std::uint8_t*>(ctx->host_views[i]);
    if (plan->operands[i].access & FERRY_WRITE) {
      for (std::uint64_t b = 0; b < ctx->bytes[i]; ++b) view[b] = static_cast<std::uint8_t>(plan->seed + i + b);
    } else {
      volatile std::uint8_t sink = 0;
      for (std::uint64_t b = 0; b < ctx->bytes[i]; ++b) sink = sink ^ view[b];  // read only
    }
  }
  return plan->result;
}

namespace {

class Harness {
 public:
  Harness(ferry_runtime rt, bool exact, bool cache) : rt_(rt), exact_(exact), cache_(cache) {}

  void step(Input& in) {
    const std::uint8_t op = in.byte() % 20;
    const std::uint32_t s = stream(in);
    switch (op) {
      case 0: case 1: alloc(in, s); break;
      case 2: free(in); break;
      case 3: address(in); break;
      case 4: expect_status(ferry_trim(rt_), FERRY_OK, "ferry_trim"); break;
      case 5: case 6: upload(in, s); break;
      case 7: download(in, s); break;
      case 8: launch(in, s); break;
      case 9: record_use(in, s); break;
      case 10: hold(in, s); break;
      case 11: synchronize(); break;
      case 12: streams(in, s); break;
      case 13: stats(in); break;
      case 14: summary(in); break;
      case 15: races(in); break;
      case 16: cache_define(in); break;
      case 17: cache_acquire(in, s); break;
      case 18: cache_release(in); break;
      case 19: trace(in); break;
    }
  }

  void finish() {
    for (const Block& b : live_) checked(ferry_free(rt_, b.handle), "ferry_free");
    checked(ferry_synchronize(rt_), "ferry_synchronize");
  }

  bool faulted() const { return faulted_; }

 private:
  // Mostly 0..3, now and then past the last stream.
  static std::uint32_t stream(Input& in) {
    const std::uint8_t b = in.byte();
    return b < 240 ? b % kStreams : b < 250 ? 64 + b : UINT32_MAX - (b & 3);
  }
  static bool valid(std::uint32_t s) { return s < 64; }

  Block* pick(Input& in) { return live_.empty() ? nullptr : &live_[in.byte() % live_.size()]; }

  ferry_handle some_handle(Input& in) {
    const std::uint8_t k = in.byte() % 8;
    if (k < 5 && !live_.empty()) return live_[in.byte() % live_.size()].handle;
    if (k < 7 && !stale_.empty()) return stale_[in.byte() % stale_.size()];
    const ferry_handle forged{static_cast<std::uint32_t>(in.u64(1)), static_cast<std::uint32_t>(in.u64(1)),
                              static_cast<std::uint32_t>(in.u64(1))};
    // A cache slot is the cache's block: the program never names it but through acquire.
    const bool slot = std::any_of(slots_.begin(), slots_.end(), [&](ferry_handle h) { return same(h, forged); });
    return slot ? ferry_handle{} : forged;
  }
  bool is_live(ferry_handle h) const {
    return std::any_of(live_.begin(), live_.end(), [&](const Block& b) { return same(b.handle, h); });
  }
  Block* find(ferry_handle h) {
    for (Block& b : live_) {
      if (same(b.handle, h)) return &b;
    }
    return nullptr;
  }

  void alloc(Input& in, std::uint32_t s) {
    const std::uint8_t k = in.byte() % 8;
    const std::uint64_t bytes = k == 0 ? in.u64(1) : k < 6 ? 1 + in.u64(2) : k == 6 ? in.u64(3) : in.u64(8);
    ferry_handle h{7, 7, 7};
    const bool null_out = in.byte() % 16 == 0;
    const ferry_status st = ferry_alloc(rt_, bytes, s, null_out ? nullptr : &h);
    if (!checked(st, "ferry_alloc")) {
      if (!same(h, ferry_handle{7, 7, 7})) finding("ferry_alloc: a failed call wrote its output");
      if (null_out || bytes == 0 || !valid(s)) {
        if (st != FERRY_ERROR_INVALID_ARGUMENT) finding("ferry_alloc: a bad argument is not INVALID_ARGUMENT");
      }
      return;
    }
    if (null_out || bytes == 0 || !valid(s)) finding("ferry_alloc accepted a bad argument");
    for (ferry_handle old : stale_) {
      if (same(old, h)) finding("ferry_alloc handed out " + handle_text(h) + " again, a handle freed before (I1)");
    }
    Block b;
    b.handle = h;
    b.bytes = bytes;
    if (bytes <= kMaxModelBytes) {
      b.content.assign(bytes, 0);
      b.known.assign(bytes, false);
    }
    if (live_.size() >= 32) {
      expect_status(ferry_free(rt_, h), FERRY_OK, "ferry_free");
      stale_.push_back(h);
      return;
    }
    live_.push_back(std::move(b));
  }

  void free(Input& in) {
    const ferry_handle h = some_handle(in);
    const bool live = is_live(h);
    const ferry_status st = ferry_free(rt_, h);
    if (!live) {
      expect_status(st, FERRY_ERROR_STALE_HANDLE, "ferry_free of a freed or forged handle");
      return;
    }
    expect_status(st, FERRY_OK, "ferry_free");
    live_.erase(std::find_if(live_.begin(), live_.end(), [&](const Block& b) { return same(b.handle, h); }));
    if (stale_.size() < 64) stale_.push_back(h);
  }

  void address(Input& in) {
    const ferry_handle h = some_handle(in);
    std::uint64_t addr = 11, bytes = 13;
    const bool null_out = in.byte() % 4 == 0;
    const ferry_status st = ferry_device_address(rt_, h, null_out ? nullptr : &addr, &bytes);
    Block* b = find(h);
    if (b == nullptr) {
      expect_status(st, FERRY_ERROR_STALE_HANDLE, "ferry_device_address of a freed or forged handle");
      if (addr != 11 || bytes != 13) finding("ferry_device_address: a failed call wrote its outputs");
      return;
    }
    expect_status(st, FERRY_OK, "ferry_device_address");
    if (bytes != b->bytes) finding("ferry_device_address: another size than allocated");
  }

  // An offset and a length against a block of `bytes`: mostly inside it, now and
  // then past its end or overflowing.
  static std::pair<std::uint64_t, std::uint64_t> range(Input& in, std::uint64_t bytes, std::uint64_t max_len) {
    const std::uint8_t k = in.byte() % 8;
    if (k == 0) return {UINT64_MAX - in.u64(1), 1 + in.u64(1) % max_len};
    if (k == 1) return {in.u64(3), in.u64(1)};
    const std::uint64_t off = bytes == 0 ? 0 : in.u64(2) % bytes;
    const std::uint64_t len = 1 + in.u64(2) % std::min(max_len, std::max<std::uint64_t>(bytes - off, 1));
    return {off, len};
  }
  static bool inside(std::uint64_t off, std::uint64_t len, std::uint64_t bytes) {
    return len > 0 && off <= bytes && len <= bytes - off;
  }

  void upload(Input& in, std::uint32_t s) {
    const ferry_handle h = some_handle(in);
    Block* b = find(h);
    const auto [off, len] = range(in, b ? b->bytes : 4096, kSource);
    const std::uint8_t seed = in.byte();
    std::vector<std::uint8_t> src(len);
    for (std::uint64_t i = 0; i < len; ++i) src[i] = static_cast<std::uint8_t>(seed * 31 + i);
    const ferry_status st = ferry_upload(rt_, s, h, off, src.data(), len);
    if (b == nullptr) {
      if (st == FERRY_OK) finding("ferry_upload into a freed or forged handle " + handle_text(h) + " succeeded");
      checked(st, "ferry_upload");
      return;
    }
    if (!checked(st, "ferry_upload")) {
      if (!valid(s) || !inside(off, len, b->bytes)) {
        if (st != FERRY_ERROR_INVALID_ARGUMENT) finding("ferry_upload: a bad range or stream is not INVALID_ARGUMENT");
      }
      if (st == FERRY_ERROR_TRANSFER_CORRUPT || st == FERRY_ERROR_TIMEOUT || st == FERRY_ERROR_BACKEND) {
        forget(*b, off, len);
      }
      return;
    }
    if (!valid(s) || !inside(off, len, b->bytes)) finding("ferry_upload accepted a bad range or stream");
    record_write(*b, s, off, len, exact_, [&](std::uint64_t j) { return src[j]; });
  }

  static void forget(Block& b, std::uint64_t off, std::uint64_t len) {
    if (b.content.empty() || off >= b.bytes) return;
    std::fill(b.known.begin() + static_cast<std::ptrdiff_t>(off),
              b.known.begin() + static_cast<std::ptrdiff_t>(std::min(b.bytes, off + len)), false);
  }

  void download(Input& in, std::uint32_t s) {
    const ferry_handle h = some_handle(in);
    Block* b = find(h);
    const auto [off, len] = range(in, b ? b->bytes : 4096, kSource);
    std::vector<std::uint8_t> dst(len, 0xa5);
    const ferry_status st = ferry_download(rt_, s, h, off, dst.data(), len);
    if (b == nullptr) {
      if (st == FERRY_OK) finding("ferry_download from a freed or forged handle " + handle_text(h) + " succeeded");
      checked(st, "ferry_download");
      return;
    }
    if (!checked(st, "ferry_download")) {
      if (!valid(s) || !inside(off, len, b->bytes)) {
        if (st != FERRY_ERROR_INVALID_ARGUMENT) finding("ferry_download: a bad range or stream is not INVALID_ARGUMENT");
      }
      if (std::any_of(dst.begin(), dst.end(), [](std::uint8_t v) { return v != 0xa5; })) {
        finding("ferry_download: a failed call wrote its output");
      }
      return;
    }
    if (!valid(s) || !inside(off, len, b->bytes)) finding("ferry_download accepted a bad range or stream");
    // The stream orders its own work: once it has run, what this stream wrote is known.
    b->pending[s] = false;
    const bool ordered = std::none_of(b->pending.begin(), b->pending.end(), [](bool w) { return w; });
    if (b->content.empty() || !ordered || faulted_) return;
    for (std::uint64_t i = 0; i < len; ++i) {
      if (b->known[off + i] && b->content[off + i] != dst[i]) {
        finding("ferry_download: byte " + std::to_string(off + i) + " of " + handle_text(h) + " is " +
                std::to_string(dst[i]) + ", the program wrote " + std::to_string(b->content[off + i]));
      }
    }
  }

  void launch(Input& in, std::uint32_t s) {
    auto plan = std::make_unique<LaunchPlan>();
    const std::uint32_t n = in.byte() % 4;
    std::vector<Block*> targets;
    bool well_formed = valid(s);
    for (std::uint32_t i = 0; i < n; ++i) {
      const ferry_handle h = some_handle(in);
      Block* b = find(h);
      const std::uint8_t a = in.byte();
      const std::uint32_t access = a < 250 ? 1 + a % 3 : a;
      const std::uint8_t k = in.byte() % 4;
      std::uint64_t off = 0, len = 0;  // len 0: the rest of the block
      if (k == 1 && b) {
        off = in.u64(2) % b->bytes;
        len = 1 + in.u64(2) % (b->bytes - off);
      } else if (k == 2) {
        off = in.u64(8);
        len = in.u64(8);
      }
      const std::uint64_t size = b ? (len == 0 ? (off <= b->bytes ? b->bytes - off : 0) : len) : 0;
      well_formed = well_formed && b != nullptr && access >= 1 && access <= 3 && off < b->bytes &&
                    (len == 0 || inside(off, len, b->bytes));
      plan->operands.push_back(ferry_operand{h, off, len, access});
      plan->sizes.push_back(size);
      targets.push_back(b);
    }
    plan->seed = in.byte();
    if (const std::uint8_t k = in.byte(); k < 24) {
      plan->reenter = rt_;
      plan->reentry = k;
    }
    const std::uint8_t r = in.byte();
    plan->result = r < 240 ? FERRY_OK : r < 248 ? static_cast<int>(r % 8) : static_cast<int>(r) - 300;
    const double flops = static_cast<double>(in.u64(2));
    const ferry_status st = ferry_launch(rt_, s, plan->operands.empty() ? nullptr : plan->operands.data(), n,
                                         in.byte() % 32 == 0 ? nullptr : fuzz_launch, plan.get(), flops, in.u64(2));
    if (!checked(st, "ferry_launch")) {
      if (plan->ran) finding("ferry_launch: a refused launch ran");
      return;
    }
    if (!well_formed) {
      // Overlapping write operands and the like are the kernel's business; a
      // stale handle or an access outside the enum never is.
      for (std::size_t i = 0; i < targets.size(); ++i) {
        if (targets[i] == nullptr) finding("ferry_launch accepted a freed or forged handle");
        const std::uint32_t a = plan->operands[i].access;
        if (a < 1 || a > 3) finding("ferry_launch accepted access " + std::to_string(a));
      }
      if (!valid(s)) finding("ferry_launch accepted a bad stream");
    }
    if (plan->result != FERRY_OK) faulted_ = true;  // a sticky stream fault: later waits report it
    for (std::size_t i = 0; i < targets.size(); ++i) {
      Block* b = targets[i];
      if (b == nullptr || !(plan->operands[i].access & FERRY_WRITE)) continue;
      const std::uint8_t seed = plan->seed;
      record_write(*b, s, plan->operands[i].offset, plan->sizes[i], true,
                   [&](std::uint64_t j) { return static_cast<std::uint8_t>(seed + i + j); });
    }
    plans_.push_back(std::move(plan));  // must outlive the op (ferry.h)
  }

  void record_use(Input& in, std::uint32_t s) {
    std::vector<ferry_handle> hs;
    const std::uint32_t n = in.byte() % 4;
    bool all_live = true;
    for (std::uint32_t i = 0; i < n; ++i) {
      hs.push_back(some_handle(in));
      all_live = all_live && is_live(hs.back());
    }
    const ferry_status st = ferry_record_use(rt_, s, hs.empty() ? nullptr : hs.data(), n);
    if (checked(st, "ferry_record_use") && !all_live) finding("ferry_record_use accepted a freed or forged handle");
  }

  void hold(Input& in, std::uint32_t s) {
    const ferry_status st = ferry_hold(rt_, s, in.byte() & 1);
    if (valid(s) != (st == FERRY_OK)) {
      checked(st, "ferry_hold");
      if (!faulted_) finding(std::string("ferry_hold: ") + ferry_status_name(st) + " on stream " + std::to_string(s));
    }
  }

  void synchronize() {
    const ferry_status st = ferry_synchronize(rt_);
    if (!checked(st, "ferry_synchronize") && !faulted_) finding(std::string("ferry_synchronize: ") + ferry_last_error());
    if (st != FERRY_OK) return;
    for (Block& b : live_) b.pending = {};
    for (const auto& p : plans_) {
      if (!p->ran && p->result == FERRY_OK) finding("ferry_synchronize returned before a launch ran");
    }
  }

  void streams(Input& in, std::uint32_t s) {
    void* native = reinterpret_cast<void*>(std::uintptr_t{0x5});
    const ferry_status st = ferry_native_stream(rt_, s, in.byte() % 8 == 0 ? nullptr : &native);
    checked(st, "ferry_native_stream");
    std::uint32_t adopted = 999;
    void* token = in.byte() % 2 ? native : reinterpret_cast<void*>(static_cast<std::uintptr_t>(in.u64(2)));
    if (checked(ferry_adopt_stream(rt_, token, &adopted), "ferry_adopt_stream")) {
      if (!valid(adopted)) finding("ferry_adopt_stream handed out stream " + std::to_string(adopted));
      checked(ferry_release_stream(rt_, in.byte() % 2 ? adopted : s, in.u64(2)), "ferry_release_stream");
    } else if (adopted != 999) {
      finding("ferry_adopt_stream: a failed call wrote its output");
    }
  }

  void stats(Input& in) {
    const bool null_out = in.byte() % 8 == 0;
    ferry_pool_stats p{};
    p.struct_size = sizeof p;
    expect_status(ferry_get_pool_stats(rt_, null_out ? nullptr : &p),
                  null_out ? FERRY_ERROR_INVALID_ARGUMENT : FERRY_OK, "ferry_get_pool_stats");
    if (!null_out && p.allocated_bytes > p.reserved_bytes) finding("pool stats: allocated above reserved");
    ferry_integrity_stats i{};
    i.struct_size = sizeof i;
    expect_status(ferry_get_integrity_stats(rt_, null_out ? nullptr : &i),
                  null_out ? FERRY_ERROR_INVALID_ARGUMENT : FERRY_OK, "ferry_get_integrity_stats");
    ferry_cache_stats c{};
    c.struct_size = sizeof c;
    const ferry_status st = ferry_get_cache_stats(rt_, null_out ? nullptr : &c);
    expect_status(st, cache_ && !null_out ? FERRY_OK : FERRY_ERROR_INVALID_ARGUMENT, "ferry_get_cache_stats");
  }

  void summary(Input& in) {
    const std::size_t capacity = in.byte() % 2 ? in.byte() : in.u64(2);
    std::vector<char> buf(capacity + 1, '#');
    std::size_t length = 0;
    const bool null_buf = capacity == 0 && in.byte() % 2;
    expect_status(ferry_memory_summary(rt_, null_buf ? nullptr : buf.data(), capacity, &length), FERRY_OK,
                  "ferry_memory_summary");
    if (buf[capacity] != '#') finding("ferry_memory_summary wrote past its capacity");
    if (capacity > 0 && std::strlen(buf.data()) != std::min(capacity - 1, length)) {
      finding("ferry_memory_summary: the text is not cut at capacity - 1 and NUL-terminated");
    }
  }

  void races(Input& in) {
    std::vector<ferry_race> out(in.byte() % 4);
    std::uint32_t kept = 77;
    std::uint64_t total = 0;
    const ferry_status st = ferry_get_races(rt_, out.empty() ? nullptr : out.data(),
                                            static_cast<std::uint32_t>(out.size()), &kept, &total);
    if (checked(st, "ferry_get_races")) {
      if (kept > out.size() || kept > total) finding("ferry_get_races: more kept than asked or found");
      for (std::uint32_t i = 0; i < kept; ++i) {
        if (out[i].earlier.kind == nullptr || out[i].later.tag == nullptr) finding("ferry_get_races: a NULL string");
      }
    } else if (st != FERRY_ERROR_UNSUPPORTED || kept != 77) {
      finding("ferry_get_races: not UNSUPPORTED without race_check, or wrote its output");
    }
  }

  void cache_define(Input& in) {
    const std::uint64_t key = in.byte() % 4;
    const std::uint32_t n = in.byte() % 4;
    auto& pieces = pieces_.emplace_back();
    std::vector<const void*> ptrs;
    std::vector<std::uint64_t> sizes;
    for (std::uint32_t i = 0; i < n; ++i) {
      const std::uint64_t bytes = in.u64(1) * (1 + in.byte() % 64);
      auto& piece = pieces.emplace_back(bytes);
      for (std::uint64_t j = 0; j < bytes; ++j) piece[j] = static_cast<std::uint8_t>(key * 7 + i * 3 + j);
      ptrs.push_back(bytes == 0 || in.byte() % 16 ? static_cast<const void*>(piece.data()) : nullptr);
      sizes.push_back(bytes);
    }
    const ferry_status st =
        ferry_cache_define(rt_, key, ptrs.empty() ? nullptr : ptrs.data(), sizes.empty() ? nullptr : sizes.data(), n);
    if (checked(st, "ferry_cache_define")) {
      if (!cache_) finding("ferry_cache_define without a cache succeeded");
      entries_[key] = &pieces;
    }
  }

  void cache_acquire(Input& in, std::uint32_t s) {
    const std::uint64_t key = in.byte() % 5;
    ferry_handle slot{9, 9, 9};
    std::array<std::uint64_t, 4> offsets{};
    int hit = -1;
    const ferry_status st = ferry_cache_acquire(rt_, key, s, &slot, offsets.data(), &hit);
    if (!checked(st, "ferry_cache_acquire")) {
      if (!same(slot, ferry_handle{9, 9, 9}) || hit != -1) finding("ferry_cache_acquire: a failed call wrote its output");
      return;
    }
    if (!cache_ || entries_.count(key) == 0) finding("ferry_cache_acquire of no defined entry succeeded");
    if (hit != 0 && hit != 1) finding("ferry_cache_acquire: hit is neither 0 nor 1");
    ++acquired_[key];
    if (std::none_of(slots_.begin(), slots_.end(), [&](ferry_handle h) { return same(h, slot); })) {
      slots_.push_back(slot);
    }
    std::uint64_t slot_bytes = 0;
    expect_status(ferry_device_address(rt_, slot, nullptr, &slot_bytes), FERRY_OK, "ferry_device_address of a slot");
    const auto& pieces = *entries_[key];
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      if (pieces[i].empty()) continue;
      if (!inside(offsets[i], pieces[i].size(), slot_bytes)) finding("a cache piece lies outside its slot");
      if (!exact_ || faulted_) continue;
      std::vector<std::uint8_t> got(pieces[i].size());
      if (checked(ferry_download(rt_, s, slot, offsets[i], got.data(), got.size()), "ferry_download of a slot") &&
          got != pieces[i]) {
        finding("cache entry " + std::to_string(key) + " piece " + std::to_string(i) + " differs in its slot");
      }
    }
  }

  void cache_release(Input& in) {
    const std::uint64_t key = in.byte() % 5;
    const ferry_status st = ferry_cache_release(rt_, key);
    if (checked(st, "ferry_cache_release")) {
      if (acquired_[key] == 0) finding("ferry_cache_release of an entry not acquired succeeded");
      --acquired_[key];
    }
  }

  void trace(Input& in) {
    if (in.byte() % 2) {
      const std::uint8_t k = in.byte() % 8;
      // A regular file mostly; now and then NULL or a device, which start refuses at once.
      checked(ferry_trace_start(rt_, k == 0 ? nullptr : k == 1 ? "/dev/null" : trace_path().c_str()),
              "ferry_trace_start");
    } else {
      checked(ferry_trace_stop(rt_), "ferry_trace_stop");
    }
  }

  static constexpr std::uint64_t kSource = 8192;  // the longest upload or download
  ferry_runtime rt_;
  bool exact_;  // uploads arrive intact, or are refused (no undetectable fault injected)
  bool cache_;
  bool faulted_ = false;
  std::vector<Block> live_;
  std::vector<ferry_handle> stale_;
  std::vector<ferry_handle> slots_;
  std::deque<std::unique_ptr<LaunchPlan>> plans_;
  std::deque<std::vector<std::vector<std::uint8_t>>> pieces_;  // must outlive the runtime (ferry.h)
  std::map<std::uint64_t, const std::vector<std::vector<std::uint8_t>>*> entries_;
  std::map<std::uint64_t, std::uint64_t> acquired_;
};

// Toggles the runtime's trace `toggles` times, beside the harness's calls.
class TraceToggler {
 public:
  TraceToggler(ferry_runtime rt, std::uint32_t toggles)
      : thread_([rt, toggles] {
          for (std::uint32_t i = 0; i < toggles; ++i) {
            checked(i % 2 == 0 ? ferry_trace_start(rt, trace_path(1).c_str()) : ferry_trace_stop(rt),
                    "ferry_trace_start/stop (toggler)");
          }
        }) {}
  ~TraceToggler() { thread_.join(); }
  TraceToggler(const TraceToggler&) = delete;
  TraceToggler& operator=(const TraceToggler&) = delete;

 private:
  std::thread thread_;
};

// Every call with a NULL runtime is INVALID_ARGUMENT (destroy: a no-op).
void null_runtime() {
  ferry_handle h{};
  std::uint64_t u = 0;
  ferry_runtime null = nullptr;  // a variable: clang refuses a literal NULL where ferry.h says FERRY_NONNULL
  expect_status(ferry_alloc(null, 256, 0, &h), FERRY_ERROR_INVALID_ARGUMENT, "ferry_alloc(NULL)");
  expect_status(ferry_free(null, h), FERRY_ERROR_INVALID_ARGUMENT, "ferry_free(NULL)");
  expect_status(ferry_device_address(null, h, &u, &u), FERRY_ERROR_INVALID_ARGUMENT, "ferry_device_address(NULL)");
  expect_status(ferry_synchronize(null), FERRY_ERROR_INVALID_ARGUMENT, "ferry_synchronize(NULL)");
  expect_status(ferry_trace_stop(null), FERRY_ERROR_INVALID_ARGUMENT, "ferry_trace_stop(NULL)");
  ferry_runtime_destroy(nullptr);
}

const char* pick_text(Input& in, const std::vector<const char*>& choices, std::string& scratch) {
  const std::size_t k = in.byte() % (choices.size() + 1);
  if (k < choices.size()) return choices[k];
  scratch = in.text(24);
  return scratch.c_str();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Input in(data, size);
  if (ferry_status_name(static_cast<ferry_status>(static_cast<int>(in.u64(1)) - 8)) == nullptr) {
    finding("ferry_status_name returned NULL");
  }
  if (in.byte() == 0) null_runtime();

  ferry_runtime_options options;
  ferry_runtime_options_init(&options);
  std::string profile, integrity, inject;
  options.profile = pick_text(in, {"tiny", "tiny", "tiny", "h200", nullptr}, profile);
  const std::uint8_t cap = in.byte() % 4;
  options.capacity = cap == 0 ? (std::uint64_t{4} << 20) : cap == 1 ? (std::uint64_t{1} << 20) : cap == 2 ? in.u64(3) : 0;
  if (options.profile == nullptr || std::string(options.profile) != "tiny") {
    options.capacity = std::max<std::uint64_t>(options.capacity, 1) % (std::uint64_t{16} << 20);  // bounds host memory
    if (options.capacity == 0) options.capacity = std::uint64_t{4} << 20;
  }
  options.seed = in.byte();
  options.integrity = pick_text(in, {nullptr, "verify", "probe", "off"}, integrity);
  options.inject = pick_text(
      in, {nullptr, nullptr, "", "none", "pinned-noop", "pinned-noop:0.5", "batch-broken", "batch-missing", "fail-map:3",
           "delay:5000"},
      inject);
  options.cache_slots = in.byte() % 4 == 0 ? 1 + in.byte() % 3 : 0;
  options.cache_slot_bytes = options.cache_slots ? in.u64(2) : 0;
  options.race_check = in.byte() % 2;

  if (in.byte() % 32 == 0) ferry_runtime_options_init(&options);  // and create with NULL: the same defaults
  const bool defaults = options.profile == nullptr && options.capacity == 0 && options.cache_slots == 0;
  ferry_runtime rt = reinterpret_cast<ferry_runtime>(std::uintptr_t{0x10});
  const ferry_status st = ferry_runtime_create(defaults ? nullptr : &options, &rt);
  if (!checked(st, "ferry_runtime_create")) {
    if (rt != reinterpret_cast<ferry_runtime>(std::uintptr_t{0x10})) finding("ferry_runtime_create: a failed call wrote its output");
    return 0;
  }
  if (defaults) {  // the whole h200: the calls below would ask the sim for more host memory than a fuzzer has
    ferry_runtime_destroy(rt);
    return 0;
  }
  const std::string policy = options.integrity ? options.integrity : "verify";
  const std::string faults = options.inject ? options.inject : "";
  // verify catches every injected corruption; the other policies may miss the two that corrupt.
  const bool exact = policy == "verify" ||
                     (faults.find("pinned") == std::string::npos && faults.find("batch-broken") == std::string::npos);
  {
    Harness harness(rt, exact, options.cache_slots > 0);
    {
      const std::uint8_t t = in.byte();
      std::optional<TraceToggler> toggler;
      if (t < 64) toggler.emplace(rt, 1 + t % 16);
      for (std::size_t i = 0; i < kMaxOps && !in.empty(); ++i) harness.step(in);
    }  // the toggler is joined before the last calls
    harness.finish();
    ferry_runtime_destroy(rt);  // before the harness's launch plans and cache pieces go
  }
  return 0;
}
