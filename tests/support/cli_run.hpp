// Runs `ferry ARGS...` in-process (run_cli) and keeps its exit code and output.
#pragma once

#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "app.hpp"

namespace ferry::cli::testing {

struct CliRun {
  int code = -1;
  std::string out, err;
};

inline CliRun run_ferry(const std::vector<std::string>& args) {
  std::vector<std::string> storage{"ferry"};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<const char*> argv;
  for (const std::string& a : storage) argv.push_back(a.c_str());
  std::ostringstream out, err;
  CliRun r;
  r.code = run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

inline CliRun run_ferry(std::initializer_list<std::string> args) {
  return run_ferry(std::vector<std::string>(args));
}

}  // namespace ferry::cli::testing
