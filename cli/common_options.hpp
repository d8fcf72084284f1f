// ferry CLI — the options several subcommands share, defined once so that their
// names, defaults, help text and validation stay the same everywhere, and the
// small helpers those definitions and the subcommands' output need.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/text.hpp"
#include "ferry/backend.hpp"
#include "ferry/fault_spec.hpp"

namespace ferry::cli {

// A CLI11 validator from one of our Result-returning parsers: a value is
// accepted when `parse` succeeds, else CLI11 reports the parser's message.
// `name` is what the help shows after the option's type ("" for nothing).
template <class Parse>
CLI::Validator checked(Parse parse, std::string name) {
  return CLI::Validator(
      [parse](std::string& value) -> std::string {
        auto r = parse(value);
        return r.ok() ? std::string() : r.error().message;
      },
      std::move(name));
}

// "a|b|c": the choices of an option, as its help text lists them.
std::string bar_separated(const std::vector<std::string>& names);

// The sim's device profiles, "h200|...".
std::string profile_list();

using text::ByteUnit;

// Empty when `backend` can run with `faults`; else why not (make_backend's one rule,
// check_spec), for "--inject X: ...".
std::string fault_refusal(BackendKind backend, const SimFaults& faults);

// Each adds one option to `app`, bound to the given variable, and returns it.
// Values are checked while parsing (a bad one is a usage error, exit 2).

// --backend, one of backend_kinds() (default shown).
CLI::Option* add_backend_option(CLI::App& app, BackendKind& backend);

// --profile NAME: one of profile_names() (default shown).
CLI::Option* add_profile_option(CLI::App& app, std::string& profile);

// How --help names the units parse_byte_size reads.
inline constexpr const char* kByteUnitsHelp =
    "bytes, or with a unit: KB|MB|GB|TB (powers of 1000) or KiB|MiB|GiB|TiB\n"
    "(powers of 1024), any case, e.g. 1.5GiB";

// --capacity BYTES: a byte count as parse_byte_size reads it; empty when not given.
// `default_text` says what the capacity is when the option is not given.
CLI::Option* add_capacity_option(CLI::App& app, std::string& capacity, const std::string& default_text);

// Empty, or the warning to print when `requested` bytes of --capacity exceed
// the sim device `profile` and the pool clamps them to it. Nothing for cuda:
// its capacity is known only once the device is open (the report shows it).
std::string capacity_clamp_warning(std::uint64_t requested, BackendKind backend, const std::string& profile);

// Empty when writing `output` (the path of option `option`) cannot destroy the
// input at `input` (`what` names it: "the trace"); else the refusal,
// "--report X would overwrite the trace".
std::string overwrite_refusal(const std::string& option, const std::string& output, const std::string& input,
                              const std::string& what);

// --seed UINT: as parse_u64 reads it (default shown); `description` says what it seeds.
CLI::Option* add_seed_option(CLI::App& app, std::string& seed, const std::string& description);

// --inject SPEC, repeatable or comma-separated: each spec checked by parse_fault_spec.
CLI::Option* add_inject_option(CLI::App& app, std::vector<std::string>& specs);

// TRACE (named `name` in the help): the path of a trace file or snapshot; required.
CLI::Option* add_trace_argument(CLI::App& app, const std::string& name, std::string& path,
                                const std::string& description =
                                    "Trace: JSON Lines, one op per line (docs/spec.md §3), or a PyTorch "
                                    "memory snapshot pickle");

// --report FILE ('-': stdout) and the --json flag of a subcommand that prints a
// JSON report or a summary.
void add_report_options(CLI::App& app, std::string& report, bool& json);

}  // namespace ferry::cli
