#include "ferry/integrity.hpp"

#include <array>

#include "ferry/names.hpp"

namespace ferry {
namespace {

constexpr std::array<NamedValue<IntegrityPolicy>, 3> kIntegrityPolicies{{
    {IntegrityPolicy::off, "off"},
    {IntegrityPolicy::probe, "probe"},
    {IntegrityPolicy::verify, "verify"},
}};

}  // namespace

std::string_view to_string(IntegrityPolicy policy) noexcept {
  return name_in<IntegrityPolicy>(kIntegrityPolicies, policy);
}
Result<IntegrityPolicy> parse_integrity_policy(std::string_view text) {
  return value_in<IntegrityPolicy>(kIntegrityPolicies, text, "integrity policy");
}

}  // namespace ferry
