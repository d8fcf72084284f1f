#include "ferry/result.hpp"

#include <cstdio>
#include <cstdlib>

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
