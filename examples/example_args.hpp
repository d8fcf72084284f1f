// What the examples share: their options (--backend sim|cuda, --race-check,
// --sim-native-graphs) and how they fail.
#pragma once

#include <cstdio>
#include <cstring>

#include "ferry/backend.hpp"
#include "ferry/make_backend.hpp"
#include "ferry/result.hpp"

namespace example {

// Parses the arguments into *spec. Returns -1 to go on, else the exit code: 0
// after --help, 2 on a bad argument.
inline int parse_args(int argc, char** argv, const char* what, ferry::BackendSpec* spec) {
  ferry::BackendKind* kind = &spec->kind;
  *kind = ferry::BackendKind::sim;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--race-check") == 0) {
      spec->race_check = true;
      continue;
    }
    if (std::strcmp(argv[i], "--sim-native-graphs") == 0) {
      spec->sim_native_graphs = true;
      continue;
    }
    if (std::strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      auto parsed = ferry::parse_backend_kind(argv[++i]);
      if (!parsed.ok()) {
        std::fprintf(stderr, "%s\n", parsed.error().message.c_str());
        return 2;
      }
      *kind = *parsed;
      continue;
    }
    const bool help = std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0;
    std::fprintf(help ? stdout : stderr,
                 "%s\nusage: %s [--backend sim|cuda] [--race-check] [--sim-native-graphs]   (default: sim; --race-check: "
                 "sim only; --sim-native-graphs: the sim replays graphs as cuda does, one op each)\n",
                 what, argv[0]);
    return help ? 0 : 2;
  }
  return -1;
}

// With --race-check: prints the races the sim found; true when there were none.
inline bool race_free(const ferry::Backend& backend) {
  const auto log = backend.race_log();
  if (!log) return true;
  for (const ferry::Race& r : log->kept) {
    std::fprintf(stderr, "race: %s on stream %u ticket %llu and %s on stream %u ticket %llu, %llu bytes\n",
                 r.earlier.kind.data(), r.earlier.op.stream, static_cast<unsigned long long>(r.earlier.op.ticket),
                 r.later.kind.data(), r.later.op.stream, static_cast<unsigned long long>(r.later.op.ticket),
                 static_cast<unsigned long long>(r.bytes));
  }
  std::printf("race check: %llu races\n", static_cast<unsigned long long>(log->count));
  return log->count == 0;
}

// Prints ferry's error and returns the exit code of a failed run.
inline int fail(const ferry::Error& error) {
  std::fprintf(stderr, "ferry: %s\n", error.message.c_str());
  return 1;
}

}  // namespace example
