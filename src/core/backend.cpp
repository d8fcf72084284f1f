#include "ferry/backend.hpp"

#include <chrono>
#include <thread>

namespace ferry {

void Backend::advance(std::uint64_t ns) { std::this_thread::sleep_for(std::chrono::nanoseconds(ns)); }

}  // namespace ferry
