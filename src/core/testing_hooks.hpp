// Test-only: drops the cross-stream waits one component inserts, so that a test
// shows the race checker catching what each of them protects
// (tests/replay/race_mutation_test.cpp). Nothing outside the tests sets it; a site
// pays one relaxed atomic load.
#pragma once

#include <cstdint>

namespace ferry::testing_hooks {

enum class WaitSite : std::uint8_t {
  none,           // every wait is inserted
  engine_verify,  // the verify stream's wait for the copy it hashes (upload_rounds.cpp)
  cache_fetch,    // acquire()'s wait for the entry's upload (offload_cache.cpp)
  replay_runner,  // the replay's waits between a producer and a consumer (runner.cpp)
  pool_reuse,     // the pool's waits behind a reused block's old work: allocate's and make_ready's (src/pool)
  arena_lease,    // a freed arena block waits for the transfers that read it (host_arena.cpp)
};

void drop_waits(WaitSite site);  // WaitSite::none restores them all
bool dropped(WaitSite site) noexcept;

}  // namespace ferry::testing_hooks
