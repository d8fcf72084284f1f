#include "app.hpp"

#include <ostream>
#include <vector>

#include "subcommand.hpp"

#ifndef FERRY_VERSION
#define FERRY_VERSION "unknown"
#endif

namespace ferry::cli {

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
      return app.exit(e, out, err) == 0 ? kExitOk : kExitUsage;
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
