// Allocates, fills and frees one block on the sim backend through the installed
// package, and snapshots the pool through the observe component.
#include <ferry/device_pool.hpp>
#include <ferry/make_backend.hpp>
#include <ferry/pool_snapshot.hpp>

#include <cstdio>

int main() {
  ferry::BackendSpec spec;
  spec.profile = "tiny";
  auto sim = ferry::make_backend(spec);
  if (!sim.ok()) return 1;
  ferry::StreamOrder order(**sim);
  ferry::DevicePool pool(order);
  auto h = pool.allocate(4096, 0);
  if (!h.ok() || !ferry::enqueue_fill(pool, 0, *h, 7).ok()) return 1;
  if (ferry::take_snapshot(pool).blocks.size() != 1) return 1;
  if (!pool.free(*h).ok() || !(*sim)->synchronize().ok()) return 1;
  std::puts("consumer: ok");
  return 0;
}
