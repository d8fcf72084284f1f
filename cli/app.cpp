#include "app.hpp"

#include <algorithm>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "subcommand.hpp"

#ifndef FERRY_VERSION
#define FERRY_VERSION "unknown"
#endif

namespace ferry::cli {
namespace {

// Edits (insert, delete, replace, swap two neighbours) from a to b.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// For the first argument that is neither an option of the command it was given
// to nor (before a command) a command: "'--race-chek' is not an option of ferry
// replay: did you mean '--race-check'?", naming the known name within two edits
// of it; "" when none is that close.
std::string did_you_mean(CLI::App& app, int argc, const char* const* argv) {
  const std::vector<CLI::App*> parsed = app.get_subcommands();
  const CLI::App* scope = parsed.empty() ? &app : parsed.front();
  std::vector<std::string> known;
  for (const CLI::Option* o : scope->get_options()) {
    for (const std::string& name : o->get_lnames()) known.push_back("--" + name);
  }
  if (parsed.empty()) {
    for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) known.push_back(s->get_name());
  }
  for (int i = 1; i < argc; ++i) {
    std::string_view word = argv[i];
    if (word.starts_with("--")) word = word.substr(0, word.find('='));
    else if (!parsed.empty()) continue;  // a value, or the command's own name
    if (std::find(known.begin(), known.end(), word) != known.end()) continue;
    const std::string* best = nullptr;
    std::size_t best_distance = 3;
    for (const std::string& name : known) {
      const std::size_t d = edit_distance(word, name);
      if (d < best_distance) best = &name, best_distance = d;
    }
    if (best != nullptr) {
      const std::string what = word.starts_with("--") ? "an option of " : "a command of ";
      const std::string command = parsed.empty() ? "ferry" : "ferry " + parsed.front()->get_name();
      return "'" + std::string(word) + "' is not " + what + command + ": did you mean '" + *best + "'?";
    }
  }
  return "";
}

// The deepest command given, when it needs a subcommand and got none: "ferry bench
// needs a subcommand: pool or fragmentation"; "" otherwise.
std::string missing_subcommand(CLI::App& app) {
  CLI::App* scope = &app;
  std::string path = "ferry";
  while (!scope->get_subcommands().empty()) {
    scope = scope->get_subcommands().front();
    path += " " + scope->get_name();
  }
  const std::vector<CLI::App*> choices = scope->get_subcommands([](const CLI::App*) { return true; });
  if (choices.empty() || scope == &app) return "";
  std::string names;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    names += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i]->get_name();
  }
  return path + " needs a subcommand: " + names + " (run '" + path + " --help')";
}

}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) noexcept {
  try {
    CLI::App app{"ferry - a GPU memory runtime: device pool, host arena, transfer engine, offload cache",
                 "ferry"};
    app.set_version_flag("--version", std::string("ferry ") + FERRY_VERSION);
    app.require_subcommand(1);
    app.footer("Exit status: 0 ok, 1 a check failed or an unexpected error, 2 bad usage or input.\n"
               "Run 'ferry COMMAND --help' for a command's options.");

    std::vector<Subcommand> subcommands;
    for (AddSubcommand add : all_subcommands()) subcommands.push_back(add(app));

    if (argc <= 1) {
      err << app.help();
      return kExitUsage;
    }
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      // --help and --version are "errors" with exit code 0.
      if (e.get_exit_code() == 0) return app.exit(e, out, err) == 0 ? kExitOk : kExitUsage;
      // Our own word first: CLI11's ("The following arguments were not expected: 2
      // --device") names the symptom, not the fix.
      if (const std::string hint = did_you_mean(app, argc, argv); !hint.empty()) {
        err << "ferry: " << hint << '\n';
        return kExitUsage;
      }
      if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
        if (const std::string need = missing_subcommand(app); !need.empty()) {
          err << need << '\n';
          return kExitUsage;
        }
      }
      app.exit(e, out, err);
      return kExitUsage;
    }
    const Io io{out, err};
    for (const Subcommand& s : subcommands) {
      if (s.app->parsed()) return s.run(io);
    }
    err << app.help();
    return kExitUsage;
  } catch (const std::exception& e) {
    // Our bug, not the caller's input: report it as an unexpected error.
    err << "ferry: internal error: " << e.what() << '\n';
    return kExitFailed;
  } catch (...) {
    err << "ferry: internal error\n";
    return kExitFailed;
  }
}

}  // namespace ferry::cli
