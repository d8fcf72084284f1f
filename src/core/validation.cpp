#include "ferry/validation.hpp"

#include <cstdio>
#include <cstdlib>

#include "core/invariant.hpp"

namespace ferry {

bool heavy_validation_default() noexcept { return FERRY_HEAVY_VALIDATE != 0; }

namespace detail {

void invariant_broken(const char* structure, const std::string& why) {
  std::fprintf(stderr, "ferry: %s invariant broken: %s\n", structure, why.c_str());
  std::abort();
}

}  // namespace detail
}  // namespace ferry
