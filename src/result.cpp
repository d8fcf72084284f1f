#include "ferry/result.hpp"

namespace ferry {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::stale_handle: return "stale_handle";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::transfer_corrupt: return "transfer_corrupt";
    case ErrorCode::backend_error: return "backend_error";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::timeout: return "timeout";
  }
  return "unknown";
}

}  // namespace ferry
