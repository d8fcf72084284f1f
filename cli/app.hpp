// ferry CLI — the top level: parses the command line, runs one subcommand.
#pragma once

#include <iosfwd>

namespace ferry::cli {

// Runs `ferry` with argv (argv[0] is the program name) and returns the exit
// code: 0 ok, 1 failed check or unexpected error, 2 bad usage or input.
// Writes results to `out` and diagnostics to `err`. Never throws.
int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) noexcept;

}  // namespace ferry::cli
