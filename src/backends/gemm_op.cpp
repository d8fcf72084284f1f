// The GEMM as a user operation (gemm.hpp): the host definition on sim, cuBLAS on
// cuda. Its rules (shape, alignment, overlap) are written here once, for every
// backend, and checked before anything is enqueued.
#include <limits>
#include <string>
#include <utility>

#include "core/text.hpp"
#include "cuda/cublas_gemm.hpp"
#include "ferry/cuda_backend.hpp"
#include "ferry/gemm.hpp"

namespace ferry {
namespace {

bool ranges_overlap(const DeviceRange& x, const DeviceRange& y) {
  return x.bytes > 0 && y.bytes > 0 && x.addr < y.addr + y.bytes && y.addr < x.addr + x.bytes;
}

std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// The kernel's operands are the three make_gemm_op declared; anything else is a
// UserOp someone rebuilt, and is refused rather than read out of bounds.
Result<void> check_args(const KernelLaunch& launch, const GemmShape& shape) {
  if (launch.args.size() == 3 && launch.args[0].bytes == shape.a_bytes() && launch.args[1].bytes == shape.b_bytes() &&
      launch.args[2].bytes == shape.c_bytes()) {
    return {};
  }
  return make_error(ErrorCode::invalid_argument,
                    "gemm " + shape.text() + ": the kernel's operands are not the a, b and c it was made for");
}

}  // namespace

Result<UserOp> make_gemm_op(Backend& backend, StreamId stream, DeviceRange a, DeviceRange b, DeviceRange c,
                            const GemmShape& shape, UserCost cost) {
  // Messages: "stream 3: gemm 8 x 8 x 8 (A, B): ..." (check_gemm's name the shape).
  const std::string where = "stream " + std::to_string(stream) + ": ";
  const auto bad = [&](std::string why) {
    return make_error(ErrorCode::invalid_argument, where + "gemm " + shape.text() + ": " + std::move(why));
  };
  if (Result<void> r = check_gemm(shape, a.bytes, b.bytes, c.bytes); !r.ok()) {
    return make_error(ErrorCode::invalid_argument, where + std::move(r).error().message);
  }
  // A bf16 load at an odd address is a device fault on a GPU.
  if ((a.addr | b.addr | c.addr) % 2 != 0) return bad("a, b and c must be 2-byte aligned");
  // The product reads a and b while it writes c (on a real device, in tiles), so
  // an overlap would make the result depend on the order.
  for (const auto& [in, name] : {std::pair{&a, "a"}, std::pair{&b, "b"}}) {
    if (ranges_overlap(c, *in)) {
      return bad("c " + text::range(c.addr, c.bytes) + " overlaps " + name + " " + text::range(in->addr, in->bytes) +
                 "; the output must not overlap an input");
    }
  }
  UserOp op;
  op.operands = {{a, Access::read}, {b, Access::read}, {c, Access::write}};
  // 0 stands for the shape's figure (a negative or NaN one is check_op's to refuse).
  op.flops = cost.flops == 0 ? shape.flops() : cost.flops;
  op.mem_bytes = cost.mem_bytes == 0 ? saturating_add(saturating_add(a.bytes, b.bytes), c.bytes) : cost.mem_bytes;
  op.tag = "gemm " + shape.text();
  switch (backend.info().backend) {
    case BackendKind::sim:
      // The host definition on the operands' views (user_kernel.hpp); sizes were
      // checked above, so only host memory can fail.
      op.kernel = [shape](const KernelLaunch& launch) -> Result<void> {
        FERRY_TRY(check_args(launch, shape));
        return gemm_bf16(shape, launch.args[0].in, launch.args[1].in, launch.args[2].out);
      };
      return op;
    case BackendKind::cuda: {
      // cublasGemmEx takes int dimensions (check_gemm already bounds k).
      constexpr std::uint32_t kMaxDim = std::numeric_limits<int>::max();
      if (shape.m > kMaxDim || shape.n > kMaxDim) {
        return make_error(ErrorCode::unsupported,
                          where + "gemm " + shape.text() + ": m and n must be below 2^31 on cuda");
      }
      // The handle is made now, with no lock held: the kernel runs under the
      // backend's lock, where making one would stall every stream.
      Result<NativeStream> native = backend.native_stream(stream);
      if (!native.ok()) return std::move(native).error();
      Result<cuda_detail::CublasGemm> cublas = cuda_detail::prepare_cublas(backend, *native);
      if (!cublas.ok()) {
        Error e = std::move(cublas).error();
        e.message = where + op.tag + ": " + e.message;
        return e;
      }
      op.kernel = [shape, gemm = *cublas](const KernelLaunch& launch) -> Result<void> {
        FERRY_TRY(check_args(launch, shape));
        return gemm.run(launch.stream, {shape.m, shape.n, shape.k, shape.trans_a, shape.trans_b, launch.args[0].addr,
                                        launch.args[1].addr, launch.args[2].addr});
      };
      return op;
    }
  }
  return make_error(ErrorCode::unsupported,
                    where + "gemm: no GEMM for backend " + std::string(to_string(backend.info().backend)));
}

Result<Ticket> enqueue_gemm(DevicePool& pool, StreamId stream, MatrixSlice a, MatrixSlice b, MatrixSlice c,
                            const GemmShape& shape, UserCost cost) {
  // The ranges the blocks give now, to check the shape against before anything is
  // enqueued; enqueue_user leases the same ones (a live block does not move).
  const auto range = [&](const MatrixSlice& s, const char* name) -> Result<DeviceRange> {
    Result<DeviceSpan> span = pool.resolve(s.handle);
    if (!span.ok()) {
      Error e = std::move(span).error();
      e.message = "gemm " + shape.text() + ": " + name + ": " + e.message;
      return e;
    }
    return operand_range(*span, s.offset, s.bytes, "gemm " + shape.text() + ": " + name);
  };
  Result<DeviceRange> ra = range(a, "a");
  if (!ra.ok()) return std::move(ra).error();
  Result<DeviceRange> rb = range(b, "b");
  if (!rb.ok()) return std::move(rb).error();
  Result<DeviceRange> rc = range(c, "c");
  if (!rc.ok()) return std::move(rc).error();
  Result<UserOp> op = make_gemm_op(pool.order().backend(), stream, *ra, *rb, *rc, shape, cost);
  if (!op.ok()) return std::move(op).error();
  const Operand operands[] = {{a.handle, Access::read, a.offset, ra->bytes},
                              {b.handle, Access::read, b.offset, rb->bytes},
                              {c.handle, Access::write, c.offset, rc->bytes}};
  return enqueue_user(pool, stream, operands, std::move(op->kernel), {op->flops, op->mem_bytes}, std::move(op->tag));
}

std::string gemm_library(const Backend& backend) {
  if (backend.info().backend != BackendKind::cuda) return "host GEMM (gemm_bf16)";
  Result<CublasLocation> where = locate_cublas();
  if (!where.ok()) return "none: " + where.error().message;
  return "cuBLAS " + where->path + " (found by " + where->found_by + ")";
}

}  // namespace ferry
