// foreign_stream: your program owns a stream (on a GPU, a cudaStream_t such as
// PyTorch's current stream), ferry adopts it, and record_use keeps a block alive
// for work on it that ferry never saw — PyTorch's record_stream, checked: a stale
// handle is refused instead of trusted.
#include <cstdio>
#include <vector>

#include "../example_args.hpp"
#include "ferry/runtime.hpp"
#include "ferry/user_op.hpp"

#if FERRY_EXAMPLE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

// The program's own stream. On the sim, which runs no program code, any distinct
// non-null pointer names it.
struct ProgramStream {
  ferry::NativeStream native = nullptr;
#if FERRY_EXAMPLE_CUDA
  bool owned = false;
  ~ProgramStream() {
    if (owned) (void)cudaStreamDestroy(static_cast<cudaStream_t>(native));
  }
#endif
};

// The program reads `bytes` at device address `addr` into `dst` on its own stream,
// without telling the pool: on a GPU a cudaMemcpyAsync; on the sim, which has no
// program stream to launch on, the same copy enqueued on the backend directly.
ferry::Result<void> program_reads(ferry::Runtime& rt, ferry::StreamId stream, ferry::NativeStream native,
                                  std::uint64_t addr, std::span<std::byte> dst) {
#if FERRY_EXAMPLE_CUDA
  if (rt.backend().info().backend == ferry::BackendKind::cuda) {
    if (cudaMemcpyAsync(dst.data(), reinterpret_cast<const void*>(addr), dst.size(), cudaMemcpyDeviceToHost,
                        static_cast<cudaStream_t>(native)) != cudaSuccess) {
      return ferry::make_error(ferry::ErrorCode::backend_error, "cudaMemcpyAsync failed");
    }
    return {};
  }
#endif
  (void)native;
  auto t = rt.backend().enqueue(stream, ferry::CopyToHostOp{dst.data(), {addr, dst.size()}});
  if (!t.ok()) return std::move(t).error();
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  ferry::BackendSpec spec;
  if (int exit = example::parse_args(argc, argv, "foreign_stream: your stream, record_use", &spec); exit >= 0) {
    return exit;
  }
  ferry::RuntimeOptions options;
  options.backend = spec;
  const ferry::BackendKind kind = spec.kind;
  options.backend.profile = "tiny";
  auto runtime = ferry::Runtime::create(options);
  if (!runtime.ok()) return example::fail(runtime.error());
  ferry::Runtime& rt = **runtime;

  ProgramStream program;
  int sim_stream_identity = 0;
  program.native = &sim_stream_identity;
#if FERRY_EXAMPLE_CUDA
  cudaStream_t made = nullptr;
  if (kind == ferry::BackendKind::cuda && cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking) == cudaSuccess) {
    program.native = made;
    program.owned = true;
  }
#endif
  auto side = rt.backend().adopt_stream(program.native);
  if (!side.ok()) return example::fail(side.error());

  // A block made and filled on ferry's stream 0 ...
  constexpr std::uint64_t kBytes = 256 << 10;
  std::vector<std::byte> weights(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) weights[i] = static_cast<std::byte>(i * 13);
  auto block = rt.pool().allocate(kBytes, 0);
  if (!block.ok()) return example::fail(block.error());
  auto up = rt.engine().upload(0, ferry::TransferPlan().add(weights, *block));
  if (!up.ok()) return example::fail(up.error());

  // ... read by the program on its own stream, which ferry is told about ...
  std::vector<std::byte> seen(kBytes);
  const ferry::DeviceSpan span = *rt.pool().resolve(*block);
  if (auto r = program_reads(rt, *side, program.native, span.addr, seen); !r.ok()) return example::fail(r.error());
  const ferry::DeviceHandle used[] = {*block};
  if (auto r = ferry::record_use(rt.pool(), *side, used); !r.ok()) return example::fail(r.error());

  // ... and freed at once: another stream may get its memory at once, but only behind an
  // event wait for the program's read (the race check below sees any overlap).
  if (auto r = rt.pool().free(*block); !r.ok()) return example::fail(r.error());
  auto next = rt.pool().allocate(kBytes, 2);
  if (!next.ok()) return example::fail(next.error());
  if (auto r = ferry::enqueue_fill(rt.pool(), 2, *next, 99); !r.ok()) return example::fail(r.error());

  // A freed handle is refused, where record_stream would trust it.
  const auto stale = ferry::record_use(rt.pool(), *side, used);
  if (auto r = rt.backend().release_stream(*side, std::chrono::seconds(10)); !r.ok()) return example::fail(r.error());
  if (auto r = rt.synchronize(); !r.ok()) return example::fail(r.error());
  const bool right = seen == weights && !stale.ok() && stale.error().code == ferry::ErrorCode::stale_handle;
  std::printf("foreign_stream on %s: adopted as stream %u; the program read %s; a freed handle was %s\n",
              std::string(ferry::to_string(kind)).c_str(), *side, seen == weights ? "the right bytes" : "WRONG BYTES",
              stale.ok() ? "ACCEPTED" : "refused (stale_handle)");
  return right && example::race_free(rt.backend()) ? 0 : 1;
}
