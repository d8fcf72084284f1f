#include "ferry/stream.hpp"

#include <string>

namespace ferry {

Result<void> check_stream(std::uint64_t stream, std::string_view what) {
  if (stream < kMaxStreams) return {};
  return make_error(ErrorCode::invalid_argument, std::string(what) + ": stream " + std::to_string(stream) +
                                                     " is out of range (streams are 0.." +
                                                     std::to_string(kMaxStreams - 1) + ")");
}

}  // namespace ferry
