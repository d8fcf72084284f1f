#include "ferry/backend.hpp"

#include <array>
#include <chrono>
#include <string>
#include <string_view>
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

namespace {
Error no_native_graphs(const Backend& b, std::string_view call) {
  return make_error(ErrorCode::unsupported, std::string(call) + ": the " + std::string(to_string(b.info().backend)) +
                                                " backend makes no native graphs (DeviceInfo::native_graphs)");
}
}  // namespace

Result<void> Backend::begin_graph(StreamId) { return no_native_graphs(*this, "begin_graph"); }
Result<NativeGraph> Backend::end_graph(StreamId) { return no_native_graphs(*this, "end_graph"); }

}  // namespace ferry
