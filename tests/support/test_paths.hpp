// Where tests find the committed files they read. A path compiled in breaks when the
// binary runs from somewhere else (tools/gpu-bundle carries test binaries to another
// machine): the environment's FERRY_TRACES_DIR wins over the source tree's.
#pragma once

#include <cstdlib>
#include <string>

namespace ferry::testing {

// tests/traces: $FERRY_TRACES_DIR, else the source tree's (FERRY_TRACES_DIR, from CMake).
inline std::string traces_dir() {
  if (const char* env = std::getenv("FERRY_TRACES_DIR"); env != nullptr && *env != 0) return env;
  return FERRY_TRACES_DIR;
}

}  // namespace ferry::testing
