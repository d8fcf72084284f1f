#include "ferry/user_kernel.hpp"

#include <array>
#include <exception>
#include <string>

#include "core/text.hpp"
#include "ferry/names.hpp"

namespace ferry {

namespace {

constexpr std::array<NamedValue<Access>, 3> kAccessNames{{
    {Access::read, "read"},
    {Access::write, "write"},
    {Access::read_write, "read_write"},
}};

}  // namespace

std::string_view to_string(Access access) noexcept { return name_in<Access>(kAccessNames, access); }

namespace {

// Calls nest: a kernel's callable may (wrongly) reach a backend that runs another.
thread_local int t_user_kernel_depth = 0;

struct InsideUserKernel {
  InsideUserKernel() noexcept { ++t_user_kernel_depth; }
  ~InsideUserKernel() { --t_user_kernel_depth; }
  InsideUserKernel(const InsideUserKernel&) = delete;
  InsideUserKernel& operator=(const InsideUserKernel&) = delete;
};

}  // namespace

bool inside_user_kernel() noexcept { return t_user_kernel_depth > 0; }

Result<void> refuse_inside_user_kernel(std::string_view call) {
  if (!inside_user_kernel()) return {};
  return make_error(ErrorCode::invalid_argument,
                    std::string(call) + ": called from inside a user kernel; a kernel's callable must not call "
                                        "ferry (it runs under the backend's lock: the call would deadlock)");
}

Result<void> call_user_kernel(const UserKernel& kernel, const KernelLaunch& launch) noexcept {
  const auto name = [&] {
    return "user op" + (launch.tag.empty() ? std::string() : " '" + std::string(launch.tag) + "'") + " at " +
           text::point(launch.point) + ": ";
  };
  // The boundary of the program's code: nothing it throws crosses into ferry.
  try {
    const InsideUserKernel inside;
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
