#include "ferry/integrity.hpp"

#include <string>

namespace ferry {

std::string_view to_string(IntegrityPolicy policy) noexcept {
  switch (policy) {
    case IntegrityPolicy::off: return "off";
    case IntegrityPolicy::probe: return "probe";
    case IntegrityPolicy::verify: return "verify";
  }
  return "unknown";
}

Result<IntegrityPolicy> parse_integrity_policy(std::string_view text) {
  if (text == "off") return IntegrityPolicy::off;
  if (text == "probe") return IntegrityPolicy::probe;
  if (text == "verify") return IntegrityPolicy::verify;
  return make_error(ErrorCode::invalid_argument,
                    "integrity policy '" + std::string(text) + "' is unknown; expected off, probe or verify");
}

}  // namespace ferry
