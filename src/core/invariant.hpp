// check_invariants(): run a structure's validate() and stop on a broken
// invariant, keeping its reason in every build type. A broken invariant is a bug
// of ours, never the caller's input (which gets an Error), hence the abort.
#pragma once

#include <string>

namespace ferry::detail {

[[noreturn]] void invariant_broken(const char* structure, const std::string& why);

// When `enabled`, calls validate(&why) (a bool(std::string*) callable) and aborts
// with `structure` and the reason if it returns false.
template <class Validate>
void check_invariants(bool enabled, const char* structure, Validate&& validate) {
  if (!enabled) return;
  std::string why;
  if (!validate(&why)) invariant_broken(structure, why);
}

}  // namespace ferry::detail
