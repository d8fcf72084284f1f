// What the examples share: one option (--backend sim|cuda) and how they fail.
#pragma once

#include <cstdio>
#include <cstring>

#include "ferry/backend.hpp"
#include "ferry/result.hpp"

namespace example {

// Parses the arguments into *kind. Returns -1 to go on, else the exit code: 0
// after --help, 2 on a bad argument.
inline int parse_args(int argc, char** argv, const char* what, ferry::BackendKind* kind) {
  *kind = ferry::BackendKind::sim;
  for (int i = 1; i < argc; ++i) {
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
    std::fprintf(help ? stdout : stderr, "%s\nusage: %s [--backend sim|cuda]   (default: sim)\n", what, argv[0]);
    return help ? 0 : 2;
  }
  return -1;
}

// Prints ferry's error and returns the exit code of a failed run.
inline int fail(const ferry::Error& error) {
  std::fprintf(stderr, "ferry: %s\n", error.message.c_str());
  return 1;
}

}  // namespace example
