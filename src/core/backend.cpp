#include "ferry/backend.hpp"

#include <array>
#include <chrono>
#include <thread>

namespace ferry {
namespace {

// The one name table of the backends: their names appear nowhere else in src/ and cli/.
constexpr std::array<NamedValue<BackendKind>, 2> kBackendKinds{{
    {BackendKind::sim, "sim"},
    {BackendKind::cuda, "cuda"},
}};

}  // namespace

std::span<const NamedValue<BackendKind>> backend_kinds() noexcept { return kBackendKinds; }
std::string_view to_string(BackendKind kind) noexcept { return name_in<BackendKind>(kBackendKinds, kind); }
Result<BackendKind> parse_backend_kind(std::string_view text) {
  return value_in<BackendKind>(kBackendKinds, text, "backend");
}

void Backend::advance(std::uint64_t ns) { std::this_thread::sleep_for(std::chrono::nanoseconds(ns)); }

}  // namespace ferry
