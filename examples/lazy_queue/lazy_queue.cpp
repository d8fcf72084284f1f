// lazy_queue: report 003's four steps with your own held queue. A transient is
// bound to your kernel, which is queued and held on the host; the handle is
// dropped; an allocation on another stream only fits by reclaiming; then the
// queue is dispatched. ferry reclaims around the held kernel's operand, so the
// kernel reads the right bytes and nothing aborts.
#include <cstdio>
#include <cstring>
#include <vector>

#include "../example_args.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_op.hpp"

#if FERRY_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

// The program's kernel: out := in (as many bytes as out has). The sim runs it on the bytes; a GPU gets an
// async copy on the stream.
ferry::Result<void> copy_kernel(const ferry::KernelLaunch& l) {
  const ferry::KernelArg& in = l.args[0];
  const ferry::KernelArg& out = l.args[1];
  if (l.stream == nullptr) {
    std::memcpy(out.out.data(), in.in.data(), out.bytes);
    return {};
  }
#if FERRY_EXAMPLE_CUDA
  if (cudaMemcpyAsync(reinterpret_cast<void*>(out.addr), reinterpret_cast<const void*>(in.addr), out.bytes,
                      cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(l.stream)) == cudaSuccess) {
    return {};
  }
#endif
  return ferry::make_error(ferry::ErrorCode::backend_error, "the copy kernel did not launch");
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BackendSpec spec;
  if (int exit = example::parse_args(argc, argv, "lazy_queue: report 003 with your own held kernel", &spec);
      exit >= 0) {
    return exit;
  }
  constexpr std::uint64_t MiB = 1 << 20;
  ferry::RuntimeOptions options;
  options.backend = spec;
  const ferry::BackendKind kind = spec.kind;
  options.backend.profile = "tiny";
  options.pool.capacity = 8 * MiB;
  auto runtime = ferry::Runtime::create(options);
  if (!runtime.ok()) return example::fail(runtime.error());
  ferry::Runtime& rt = **runtime;
  ferry::DevicePool& pool = rt.pool();

  auto resident = rt.allocate(6 * MiB, 0);
  auto transient = pool.allocate(1 * MiB, 0);
  auto out = rt.allocate(64 << 10, 0);
  if (!resident.ok()) return example::fail(resident.error());
  if (!transient.ok()) return example::fail(transient.error());
  if (!out.ok()) return example::fail(out.error());
  std::vector<std::byte> input(1 * MiB);
  for (std::size_t i = 0; i < input.size(); ++i) input[i] = static_cast<std::byte>(i ^ (i >> 8));
  if (auto r = rt.engine().upload(0, ferry::TransferPlan().add(input, *transient)); !r.ok()) {
    return example::fail(r.error());
  }

  rt.backend().set_hold(0, true);  // 1. your kernel, bound to the transient, queued and held
  const ferry::Operand operands[] = {{*transient, ferry::Access::read, 0, out->bytes()},
                                     {out->handle(), ferry::Access::write}};
  auto kernel = ferry::enqueue_user(pool, 0, operands, copy_kernel, {}, "copy");
  if (!kernel.ok()) return example::fail(kernel.error());
  if (auto r = pool.free(*transient); !r.ok()) return example::fail(r.error());  // 2. handle dropped
  auto big = rt.allocate(1536 << 10, 1);  // 3. only fits by reclaiming
  if (!big.ok()) return example::fail(big.error());
  if (auto r = ferry::enqueue_fill(pool, 1, big->handle(), 7); !r.ok()) return example::fail(r.error());
  rt.backend().set_hold(0, false);  // 4. dispatch

  std::vector<std::byte> got(out->bytes());
  if (auto r = rt.engine().download(0, out->handle(), 0, got); !r.ok()) return example::fail(r.error());
  input.resize(got.size());  // the kernel copied the transient's first bytes
  const ferry::PoolStats s = pool.stats();
  std::printf("lazy_queue on %s: %llu reclaim(s), %llu recovered fit(s); the held kernel read %s\n",
              std::string(ferry::to_string(kind)).c_str(), static_cast<unsigned long long>(s.reclaims),
              static_cast<unsigned long long>(s.ooms_survived), got == input ? "the right bytes" : "WRONG BYTES");
  return got == input && s.ooms_survived > 0 && example::race_free(rt.backend()) ? 0 : 1;
}
