// The snapshot page in a real browser: headless Chromium loads the pages of
// traces of 1k, 100k and 10^6 ops, runs their script and takes a screenshot.
// Each page is loaded at FILE.html#op=N (the path a click on the chart takes):
// the DOM it dumps must say the script finished (data-drawn) and show the
// keyframe for op N. Pages, dumped DOMs and screenshots stay in the build
// directory (snapshot-pages/) as artefacts. Skipped where Chromium is not
// installed (tools/bootstrap installs Debian's chromium; FERRY_CHROMIUM names
// another binary); 10^6 ops only with FERRY_LONG_TESTS=1 (ctest label `long`),
// where the replay takes minutes in a sanitizer build.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include "ferry/pool_timeline.hpp"
#include "page_traces.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;

std::string chromium() {
  const char* named = std::getenv("FERRY_CHROMIUM");
  const std::string path = named != nullptr && *named != '\0' ? named : "/usr/bin/chromium";
  return fs::exists(path) ? path : std::string();
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs headless Chromium on `url`; `what` is "--dump-dom" or "--screenshot=FILE".
// Its stdout goes to `out`. The flags keep it off the network and out of the
// user's profile (a fresh user-data-dir per call). Chromium refuses to run as
// root with its sandbox (CI containers): --no-sandbox there only.
int run_chromium(const std::string& binary, const std::string& what, const std::string& url, const fs::path& out,
                 const fs::path& profile) {
  const std::string sandbox = ::geteuid() == 0 ? "--no-sandbox " : "";
  const std::string cmd = "timeout 120 '" + binary + "' --headless " + sandbox +
                          "--disable-gpu --disable-quic --no-first-run "
                          "--disable-background-networking --disable-component-update --disable-sync "
                          "--hide-scrollbars --window-size=1100,1500 --virtual-time-budget=10000 --user-data-dir='" +
                          profile.string() + "' " + what + " '" + url + "' > '" + out.string() + "' 2>/dev/null";
  return std::system(cmd.c_str());
}

void check_page(std::size_t ops) {
  const std::string binary = chromium();
  if (binary.empty()) GTEST_SKIP() << "no Chromium (/usr/bin/chromium, or FERRY_CHROMIUM)";
  const fs::path dir = fs::path(FERRY_ARTIFACTS_DIR) / "snapshot-pages";
  fs::create_directories(dir);
  const std::string name = "page-" + std::to_string(ops) + "-ops";

  TimelineOptions o;
  o.replay.backend.profile = "tiny";
  o.replay.capacity = std::uint64_t{16} << 20;
  Result<PoolTimeline> t = observe_replay_text(testing::page_trace(ops), name + ".jsonl", o);
  ASSERT_TRUE(t.ok()) << t.error().message;
  const std::string html = timeline_html(*t);
  EXPECT_LT(html.size(), std::size_t{6} << 20) << "the page is bounded at " << ops << " ops";
  const fs::path page = dir / (name + ".html");
  { std::ofstream(page, std::ios::binary) << html; }

  const std::size_t picked = ops * 3 / 5 + 1;  // between two keyframes
  const std::string url = "file://" + fs::absolute(page).string() + "#op=" + std::to_string(picked);
  const fs::path dom = dir / (name + ".dom.html"), png = dir / (name + ".png");
  fs::remove(png);
  ASSERT_EQ(run_chromium(binary, "--dump-dom", url, dom, dir / (name + ".profile")), 0);
  const std::string shown = read(dom);
  EXPECT_NE(shown.find("data-drawn=\"yes\""), std::string::npos) << "the page's script did not finish: " << dom;
  EXPECT_NE(shown.find("picked on the chart: op " + std::to_string(picked)), std::string::npos)
      << "no layout for the picked op: " << dom;
  ASSERT_EQ(run_chromium(binary, "--screenshot=" + png.string(), url, dir / (name + ".log"), dir / (name + ".profile")),
            0);
  const std::string shot = read(png);
  ASSERT_GT(shot.size(), 20000u) << "an empty screenshot: " << png;
  EXPECT_EQ(shot.compare(0, 8, "\x89PNG\r\n\x1a\n"), 0);
  fs::remove_all(dir / (name + ".profile"));
}

TEST(SnapshotPageInChromium, At1kOps) { check_page(1000); }
TEST(SnapshotPageInChromium, At100kOps) { check_page(100000); }
TEST(SnapshotPageInChromium, At1MOps) {
  const char* v = std::getenv("FERRY_LONG_TESTS");
  if (v == nullptr || std::string(v) != "1") GTEST_SKIP() << "set FERRY_LONG_TESTS=1 (the 10^6-op replay takes minutes here)";
  check_page(1000000);
}

}  // namespace
}  // namespace ferry
