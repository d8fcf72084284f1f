// The name tables of the core's enums: each name is written here once, and
// to_string and every parser read the same table (names.hpp).
#include <array>

#include "ferry/backend.hpp"
#include "ferry/integrity.hpp"
#include "ferry/names.hpp"
#include "ferry/offload_cache.hpp"
#include "ferry/result.hpp"

namespace ferry {
namespace {

constexpr std::array<NamedValue<ErrorCode>, 7> kErrorCodes{{
    {ErrorCode::out_of_memory, "out_of_memory"},
    {ErrorCode::stale_handle, "stale_handle"},
    {ErrorCode::invalid_argument, "invalid_argument"},
    {ErrorCode::transfer_corrupt, "transfer_corrupt"},
    {ErrorCode::backend_error, "backend_error"},
    {ErrorCode::unsupported, "unsupported"},
    {ErrorCode::timeout, "timeout"},
}};

constexpr std::array<NamedValue<BackendKind>, 2> kBackendKinds{{
    {BackendKind::sim, "sim"},
    {BackendKind::cuda, "cuda"},
}};

constexpr std::array<NamedValue<IntegrityPolicy>, 3> kIntegrityPolicies{{
    {IntegrityPolicy::off, "off"},
    {IntegrityPolicy::probe, "probe"},
    {IntegrityPolicy::verify, "verify"},
}};

constexpr std::array<NamedValue<EvictionPolicy>, 3> kEvictionPolicies{{
    {EvictionPolicy::lru, "lru"},
    {EvictionPolicy::lfu, "lfu"},
    {EvictionPolicy::optimal, "optimal"},
}};

constexpr std::array<NamedValue<Pattern>, 2> kPatterns{{
    {Pattern::bytes, "bytes"},
    {Pattern::small_bf16, "small_bf16"},
}};

}  // namespace

std::string_view to_string(ErrorCode code) noexcept { return name_in<ErrorCode>(kErrorCodes, code); }

std::span<const NamedValue<BackendKind>> backend_kinds() noexcept { return kBackendKinds; }
std::string_view to_string(BackendKind kind) noexcept { return name_in<BackendKind>(kBackendKinds, kind); }
Result<BackendKind> parse_backend_kind(std::string_view text) {
  return value_in<BackendKind>(kBackendKinds, text, "backend");
}

std::string_view to_string(IntegrityPolicy policy) noexcept {
  return name_in<IntegrityPolicy>(kIntegrityPolicies, policy);
}
Result<IntegrityPolicy> parse_integrity_policy(std::string_view text) {
  return value_in<IntegrityPolicy>(kIntegrityPolicies, text, "integrity policy");
}

std::string_view to_string(EvictionPolicy policy) noexcept {
  return name_in<EvictionPolicy>(kEvictionPolicies, policy);
}
Result<EvictionPolicy> parse_eviction_policy(std::string_view text) {
  return value_in<EvictionPolicy>(kEvictionPolicies, text, "eviction policy");
}

std::string_view to_string(Pattern pattern) noexcept { return name_in<Pattern>(kPatterns, pattern); }
bool known_pattern(Pattern pattern) noexcept { return name_in<Pattern>(kPatterns, pattern) != "unknown"; }

}  // namespace ferry
