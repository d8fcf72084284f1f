#include "core/testing_hooks.hpp"

#include <atomic>

namespace ferry::testing_hooks {
namespace {

std::atomic<WaitSite> g_dropped{WaitSite::none};

}  // namespace

void drop_waits(WaitSite site) { g_dropped.store(site, std::memory_order_relaxed); }

bool dropped(WaitSite site) noexcept { return g_dropped.load(std::memory_order_relaxed) == site; }

}  // namespace ferry::testing_hooks
