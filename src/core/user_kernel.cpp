#include "ferry/user_kernel.hpp"

#include <exception>
#include <string>

#include "core/text.hpp"

namespace ferry {

std::string_view to_string(Access access) noexcept {
  switch (access) {
    case Access::read:
      return "read";
    case Access::write:
      return "write";
    case Access::read_write:
      return "read_write";
  }
  return "unknown";
}

Result<void> call_user_kernel(const UserKernel& kernel, const KernelLaunch& launch) noexcept {
  const auto name = [&] {
    return "user op" + (launch.tag.empty() ? std::string() : " '" + std::string(launch.tag) + "'") + " at " +
           text::point(launch.point) + ": ";
  };
  // The boundary of the program's code: nothing it throws crosses into ferry.
  try {
    Result<void> r = kernel(launch);
    if (r.ok()) return r;
    Error e = std::move(r).error();
    e.message = name() + e.message;
    return e;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::backend_error, name() + "the kernel threw: " + e.what());
  } catch (...) {
    return make_error(ErrorCode::backend_error, name() + "the kernel threw a non-standard exception");
  }
}

}  // namespace ferry
