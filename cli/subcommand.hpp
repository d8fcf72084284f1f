// ferry CLI — how a subcommand plugs into `ferry`.
//
// Each subcommand lives in its own source file and exposes one function,
// `Subcommand add_NAME(CLI::App& parent)`, that adds its CLI11 app to the parent
// and returns what runs it after a successful parse. Its options bind to state
// that the returned `run` owns. To add one: write cli/NAME_command.cpp, declare
// add_NAME below, and list it in cli/subcommands.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <iosfwd>
#include <span>

namespace ferry::cli {

// Exit codes of every subcommand (docs/spec.md §4).
inline constexpr int kExitOk = 0;      // done, every check passed
inline constexpr int kExitFailed = 1;  // a check failed, or an unexpected error
inline constexpr int kExitUsage = 2;   // bad usage or malformed input; nothing ran

// Where a subcommand writes: `out` for results (a summary or --json), `err` for
// diagnostics. Tests pass string streams.
struct Io {
  std::ostream& out;
  std::ostream& err;
};

struct Subcommand {
  CLI::App* app = nullptr;               // owned by the parent app
  std::function<int(const Io&)> run;     // returns the exit code; must not throw
};

using AddSubcommand = Subcommand (*)(CLI::App& parent);

Subcommand add_bench(CLI::App& parent);
Subcommand add_doctor(CLI::App& parent);
Subcommand add_import(CLI::App& parent);
Subcommand add_replay(CLI::App& parent);
Subcommand add_run(CLI::App& parent);
Subcommand add_snapshot(CLI::App& parent);

// Every subcommand, in the order `ferry --help` lists them.
std::span<const AddSubcommand> all_subcommands();

}  // namespace ferry::cli
