// Allocates, fills and frees one block on the sim backend through the installed package.
#include <ferry/device_pool.hpp>
#include <ferry/sim_backend.hpp>

#include <cstdio>

int main() {
  auto sim = ferry::make_sim_backend({*ferry::find_profile("tiny"), 1, {}});
  ferry::StreamOrder order(*sim);
  ferry::DevicePool pool(order);
  auto h = pool.allocate(4096, 0);
  if (!h.ok() || !ferry::enqueue_fill(pool, 0, *h, 7).ok() || !pool.free(*h).ok()) return 1;
  if (!sim->synchronize().ok()) return 1;
  std::puts("consumer: ok");
  return 0;
}
