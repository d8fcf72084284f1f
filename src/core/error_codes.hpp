// ferry — every ErrorCode with its report name, in one table (result.hpp's
// to_string reads it; a parser of names, the replay's `expect`, lists it).
#pragma once

#include <span>

#include "ferry/names.hpp"
#include "ferry/result.hpp"

namespace ferry {

std::span<const NamedValue<ErrorCode>> error_code_names() noexcept;

}  // namespace ferry
