// `ferry snapshot TRACE`: replays a trace on the sim, samples the pool after
// every op, and writes the pool over time and its layout as one HTML page
// and/or JSON (docs/spec.md §1).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "common_options.hpp"
#include "option_values.hpp"
#include "progress.hpp"
#include "subcommand.hpp"
#include "ferry/device_profile.hpp"
#include "ferry/pool_timeline.hpp"
#include "ferry/replay.hpp"

namespace ferry::cli {
namespace {

struct SnapshotArgs {
  std::string file;
  std::string profile = "h200";
  std::string capacity;  // empty: the device's
  std::string seed = "1";
  std::string at;        // empty: no extra layout; else a trace line
  std::string out;       // empty: TRACE's stem + "-snapshot.html", unless --json is given
  std::string json;      // empty: none; "-": stdout
  bool quiet = false;
};

// A path we may write: not the trace, not a directory, in a directory that
// exists. Checked before anything runs; empty when fine.
std::string unwritable(const std::string& option, const std::string& path, const std::string& trace) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) return option + ": empty path";
  if (std::string why = overwrite_refusal(option, path, trace, "the trace"); !why.empty()) return why;
  if (fs::is_directory(path, ec)) return option + " " + path + ": is a directory";
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec)) {
    return option + " " + path + ": directory " + parent.string() + " does not exist";
  }
  return {};
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return false;
  f << text;
  f.flush();
  return static_cast<bool>(f);
}

int run_snapshot(const SnapshotArgs& args, const Io& io) {
  TimelineOptions options;
  options.replay.backend.kind = BackendKind::sim;
  options.replay.backend.profile = args.profile;
  // The validators already accepted these.
  if (!args.capacity.empty()) options.replay.capacity = parse_byte_size(args.capacity).value_or(0);
  options.replay.backend.seed = parse_u64(args.seed).value_or(1);
  if (!args.at.empty()) {
    const std::uint64_t line = parse_u64(args.at).value_or(0);
    if (line == 0) {
      io.err << "ferry snapshot: --at " << args.at << ": trace lines count from 1\n";
      return kExitUsage;
    }
    options.at_line = static_cast<std::size_t>(line);
  }

  std::string html_path = args.out;
  if (html_path.empty() && args.json.empty()) {
    html_path = std::filesystem::path(args.file).stem().string() + "-snapshot.html";
  }
  if (!html_path.empty()) {
    if (std::string why = unwritable("--out", html_path, args.file); !why.empty()) {
      io.err << "ferry snapshot: " << why << '\n';
      return kExitUsage;
    }
  }
  if (!args.json.empty() && args.json != "-") {
    if (std::string why = unwritable("--json", args.json, args.file); !why.empty()) {
      io.err << "ferry snapshot: " << why << '\n';
      return kExitUsage;
    }
    if (args.json == html_path) {
      io.err << "ferry snapshot: --json and --out name the same file\n";
      return kExitUsage;
    }
  }

  if (const std::string warning = capacity_clamp_warning(options.replay.capacity, BackendKind::sim, args.profile);
      !warning.empty()) {
    io.err << "ferry snapshot: " << warning << '\n';
  }
  Progress progress(io.err, is_terminal(io.err), "snapshot", Progress::Lines::none);
  if (!args.quiet) {
    options.progress = [&progress](std::string_view phase, std::size_t done, std::size_t total) {
      progress.update(phase, done, total);
    };
  }
  Result<PoolTimeline> timeline = observe_replay(args.file, options);
  progress.finish();
  if (!timeline.ok()) {
    const Error& e = timeline.error();
    if (e.code == ErrorCode::invalid_argument) {
      io.err << e.message << '\n';  // "FILE:LINE: what is wrong" lines, or the bad option
      return kExitUsage;
    }
    io.err << "ferry snapshot: " << e.message << '\n';
    return e.code == ErrorCode::unsupported ? kExitUsage : kExitFailed;
  }
  const PoolTimeline& t = *timeline;

  const bool json_on_stdout = args.json == "-";
  if (!html_path.empty()) {
    const std::string page = timeline_html(t);
    if (!write_file(html_path, page)) {
      // The replay ran: a failed write is a failed run (exit 1), not bad usage.
      io.err << "ferry snapshot: --out: cannot write " << html_path << '\n';
      return kExitFailed;
    }
    if (!json_on_stdout) {
      io.out << "wrote " << html_path << " (" << text::human_bytes(page.size(), 1, ByteUnit::TiB)
             << "): " << t.samples.size() << " samples, " << t.layouts.size() << " layouts\n";
    }
  }
  if (!args.json.empty()) {
    const std::string json = timeline_json(t);
    if (json_on_stdout) {
      io.out << json << '\n';
    } else if (!write_file(args.json, json + '\n')) {
      io.err << "ferry snapshot: --json: cannot write " << args.json << '\n';
      return kExitFailed;
    } else {
      io.out << "wrote " << args.json << " (" << text::human_bytes(json.size() + 1, 1, ByteUnit::TiB) << ")\n";
    }
  }
  if (!json_on_stdout) {
    for (const PoolLayout& l : t.layouts) {
      io.out << "layout " << l.title << ": " << l.snapshot.blocks.size() << " blocks, live "
             << text::human_bytes(l.snapshot.stats.allocated_bytes, 1, ByteUnit::TiB) << ", reserved "
             << text::human_bytes(l.snapshot.stats.reserved_bytes, 1, ByteUnit::TiB) << '\n';
    }
    if (!t.note.empty()) io.out << "note: " << t.note << '\n';
    io.out << report_summary(t.report);
  } else if (!t.note.empty()) {
    io.err << "ferry snapshot: note: " << t.note << '\n';
  }
  return t.report.passed() ? kExitOk : kExitFailed;
}

}  // namespace

Subcommand add_snapshot(CLI::App& parent) {
  auto args = std::make_shared<SnapshotArgs>();
  CLI::App* app = parent.add_subcommand(
      "snapshot", "Replay a trace on the sim and draw the pool over time and its layout (HTML, JSON)");
  add_trace_argument(*app, "TRACE", args->file);
  add_profile_option(*app, args->profile);
  add_capacity_option(*app, args->capacity, "the trace's meta capacity, else the device's");
  add_seed_option(*app, args->seed, "Seed of the sim's schedule");
  app->add_option("--at", args->at,
                  "Also take a layout after the first op on or after this trace line")
      ->check(checked([](const std::string& v) { return parse_u64(v); }, "LINE"));
  app->add_option("--out", args->out,
                  "Write the HTML page to FILE (default: TRACE's name + \"-snapshot.html\" in\n"
                  "the current directory, unless --json is given)")
      ->type_name("FILE");
  app->add_option("--json", args->json, "Write the samples and layouts as JSON to FILE ('-': stdout)")
      ->type_name("FILE");
  app->add_flag("--quiet", args->quiet, "No progress bar on a terminal's stderr");
  app->footer(
      "The page is one file with no external resources: open it in a browser. It draws live,\n"
      "reserved, pending-free and cached bytes after every op (by op or by virtual time; past\n"
      "2000 ops each column shows the min and max of its ops; OOMs, reclaims and layout moments\n"
      "marked), the first OOM's diagnostic, and the layout of each reserved range (mapped and\n"
      "cached granules, blocks colored by stream and named by trace id, pending frees hatched)\n"
      "at the peak of reserved bytes, the first OOM, the end of the trace (before the replay\n"
      "frees what is left), --at LINE, and wherever the chart is clicked (keyframes kept in the\n"
      "page; FILE.html#op=N opens at op N). The page stays a few MiB at 10^6 ops.\n"
      "The peak's layout is taken as the replay rises to it; a trace whose peak rises too often for\n"
      "that (over 64 blocks per op redrawn) is replayed a second time, the sim being deterministic.\n"
      "Exit status: 0 the replay passed; 1 a check was corrupt or an error was unexpected (the\n"
      "page is still written), or writing an output failed after the replay ran; 2 malformed\n"
      "or unreadable trace (FILE:LINE: what is wrong) or one with no ops, bad option, or an\n"
      "output path that cannot be written (checked before anything runs).");
  return {app, [args](const Io& io) { return run_snapshot(*args, io); }};
}

}  // namespace ferry::cli
