// The subcommands of `ferry`, in help order: one line each.
#include "subcommand.hpp"

#include <array>

namespace ferry::cli {

std::span<const AddSubcommand> all_subcommands() {
  static constexpr std::array kAll = {
      &add_doctor,
      &add_run,
      &add_replay,
      &add_bench,
      &add_snapshot,
      &add_import,
  };
  return kAll;
}

}  // namespace ferry::cli
