// own_kernel: stream a model's layers through a small device budget with your own
// kernel. Each layer's weights get a block, a verified upload on stream 1, and your
// kernel on stream 0 (acc += weights); the block is freed at once: the free is
// stream-ordered, so the loop never synchronizes.
#include <cstdio>
#include <vector>

#include "../example_args.hpp"
#include "accumulate.hpp"
#include "accumulate_op.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_op.hpp"

int main(int argc, char** argv) {
  ferry::BackendSpec spec;
  if (int exit = example::parse_args(argc, argv, "own_kernel: your own kernel on streamed layers", &spec); exit >= 0) {
    return exit;
  }
  constexpr int kLayers = 16;
  constexpr std::uint64_t kLayerBytes = 1 << 20;

  ferry::RuntimeOptions options;
  options.backend = spec;
  const ferry::BackendKind kind = spec.kind;
  options.backend.profile = "tiny";   // a 64 MiB model device (sim)
  options.pool.capacity = 8 << 20;    // a budget far below the 16 MiB of weights
  auto runtime = ferry::Runtime::create(options);
  if (!runtime.ok()) return example::fail(runtime.error());
  ferry::Runtime& rt = **runtime;

  const ferry::UserKernel accumulate = accumulate_op;  // accumulate_op.hpp

  std::vector<std::byte> zeros(kLayerBytes), expected(kLayerBytes);
  auto acc = rt.allocate(kLayerBytes, 0);
  if (!acc.ok()) return example::fail(acc.error());
  if (auto r = rt.engine().upload(0, ferry::TransferPlan().add(zeros, acc->handle())); !r.ok()) {
    return example::fail(r.error());
  }

  std::vector<std::byte> weights(kLayerBytes);
  for (int layer = 0; layer < kLayers; ++layer) {
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<std::byte>(i * 7 + layer);
    host_accumulate(expected, weights);

    auto w = rt.allocate(kLayerBytes, 1);
    if (!w.ok()) return example::fail(w.error());
    auto up = rt.engine().upload(1, ferry::TransferPlan().add(weights, w->handle()));
    if (!up.ok()) return example::fail(up.error());
    if (auto r = rt.order().order_after(0, up->done); !r.ok()) {
      return example::fail(r.error());
    }
    const ferry::Operand operands[] = {{acc->handle(), ferry::Access::read_write}, {w->handle(), ferry::Access::read}};
    if (auto t = ferry::enqueue_user(rt.pool(), 0, operands, accumulate, {}, "accumulate"); !t.ok()) {
      return example::fail(t.error());
    }
  }  // each layer's Allocation frees its block here, stream-ordered behind the kernel

  std::vector<std::byte> got(kLayerBytes);
  if (auto r = rt.engine().download(0, acc->handle(), 0, got); !r.ok()) {
    return example::fail(r.error());
  }
  const ferry::PoolStats s = rt.pool().stats();
  std::printf("own_kernel on %s: %d layers of %llu KiB through a pool of peak %llu KiB reserved: %s\n",
              std::string(ferry::to_string(kind)).c_str(), kLayers,
              static_cast<unsigned long long>(kLayerBytes >> 10),
              static_cast<unsigned long long>(s.peak_reserved_bytes >> 10),
              got == expected ? "result matches the host reference" : "RESULT DIFFERS");
  return got == expected && example::race_free(rt.backend()) ? 0 : 1;
}
