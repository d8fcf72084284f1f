#include "ferry/result.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>

#include "core/error_codes.hpp"
#include "ferry/names.hpp"

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

}  // namespace

std::span<const NamedValue<ErrorCode>> error_code_names() noexcept { return kErrorCodes; }

std::string_view to_string(ErrorCode code) noexcept { return name_in<ErrorCode>(kErrorCodes, code); }

}  // namespace ferry

namespace ferry::detail {

void result_misuse(const char* call, const Error* error) noexcept {
  if (error != nullptr) {
    const std::string_view code = to_string(error->code);
    std::fprintf(stderr, "ferry: Result::%s on an error: %.*s: %s\n", call, static_cast<int>(code.size()),
                 code.data(), error->message.c_str());
  } else {
    std::fprintf(stderr, "ferry: Result::%s on a result that holds no error\n", call);
  }
  std::fflush(stderr);
  std::abort();
}

}  // namespace ferry::detail
