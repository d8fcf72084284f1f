// ferry — the bf16 matrix product: its host definition, which every reference
// model shares, and the GEMM as a user operation of the workloads (user_op.hpp):
// cuBLAS on cuda, this host definition on sim. The core knows no GEMM; this
// header is the backends layer's, the one place that knows every backend.
//
//   C = op(A) . op(B)   all three bf16 (2-byte little-endian), row-major
//   op(A) is m x k: A is stored m x k, or k x m when trans_a
//   op(B) is k x n: B is stored k x n, or n x k when trans_b (a Linear weight,
//                   [out_features, in_features], is B with trans_b)
//   C[i][j] = bf16_round(sum over p of op(A)[i][p] * op(B)[p][j]), the products
//             and the sum in FP32 (p ascending on the host), rounded once to the
//             nearest bf16, ties to even
//
// cuBLAS sums in its own order, so the two agree to the bit only where FP32 sums
// exactly: small_bf16 operands (content.hpp) always do for k < 2^22. Elsewhere
// they agree to FP32 rounding, which is what gemm_bf16_max_error measures. A zero
// result is +0 on the host; cuBLAS may give -0 where every product is -0 (k
// products of small_bf16 values all -0: about 0.16^k per element).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "ferry/api.hpp"
#include "ferry/backend.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/user_op.hpp"

namespace ferry FERRY_API {

struct GemmShape {
  std::uint32_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;

  std::uint64_t a_bytes() const noexcept { return std::uint64_t{m} * k * 2; }
  std::uint64_t b_bytes() const noexcept { return std::uint64_t{k} * n * 2; }
  std::uint64_t c_bytes() const noexcept { return std::uint64_t{m} * n * 2; }
  double flops() const noexcept { return 2.0 * m * n * k; }
  std::string text() const;  // "m x n x k (A^T, B)"
};

float bf16_to_float(std::uint16_t bits) noexcept;
std::uint16_t float_to_bf16(float value) noexcept;  // nearest, ties to even; NaN stays NaN

// Errors: invalid_argument when the shape is empty, k >= 2^31, or a size is not
// the shape's (naming which). Overlap of c with a or b is the caller's to check.
Result<void> check_gemm(const GemmShape& shape, std::uint64_t a_bytes, std::uint64_t b_bytes,
                        std::uint64_t c_bytes);

// The host definition. Large products run on a few threads (blocks until they
// finish); the result never depends on that. Errors: as check_gemm;
// out_of_memory when its scratch (k x n floats, a few KiB per thread) cannot be had.
Result<void> gemm_bf16(const GemmShape& shape, std::span<const std::byte> a, std::span<const std::byte> b,
                       std::span<std::byte> c);

// The largest |x - y| / max(1, |y|) over the elements of two bf16 matrices of the
// same size (NaN or a size mismatch gives +infinity; so does an odd byte count,
// which is no bf16 matrix; equal infinities count as equal).
double gemm_bf16_max_error(std::span<const std::byte> x, std::span<const std::byte> y) noexcept;

// --- The GEMM as a user operation.
//
// Its operands are a and b (read) and c (write), in that order; c = op(a) . op(b)
// lands in c when the op completes. Its modeled cost on sim (cost_model.hpp) is
// `cost`, where a 0 figure stands for the shape's: flops() and the bytes of a, b
// and c. Neither call blocks on the device; on cuda the first GEMM of a stream
// makes the stream's cuBLAS handle (loading the library in the process's first),
// which takes a while, before anything is enqueued: the kernel itself only
// enqueues cublasGemmEx (user_kernel.hpp: it runs under the backend's lock).

// The UserOp of c = op(a) . op(b) over device ranges, for `stream` of `backend`
// (of the pool's backend, adaptors included). For code that enqueues Ops itself,
// as the backend tests do; a program holds pool blocks and calls enqueue_gemm.
// Errors: invalid_argument (check_gemm's; a, b or c at an odd address, since a
// bf16 load there faults on a GPU; c overlapping a or b; a bad stream),
// unsupported (cuda: cuBLAS cannot be loaded, the loader's reason; m or n of
// 2^31 or more; a backend this build has no GEMM for), backend_error.
Result<UserOp> make_gemm_op(Backend& backend, StreamId stream, DeviceRange a, DeviceRange b, DeviceRange c,
                            const GemmShape& shape, UserCost cost = {});

// Bytes [offset, offset + bytes) of a pool block holding one matrix (kRestOfBlock:
// to the block's end). A DeviceHandle converts to its whole block.
struct MatrixSlice {
  DeviceHandle handle{};
  std::uint64_t offset = 0;
  std::uint64_t bytes = kRestOfBlock;
  MatrixSlice() = default;
  MatrixSlice(DeviceHandle h, std::uint64_t off = 0, std::uint64_t n = kRestOfBlock)  // NOLINT: a handle is a slice
      : handle(h), offset(off), bytes(n) {}
};

// Enqueues c = op(a) . op(b) on `stream` (enqueue_user: ordered after each block
// became its allocation's, each block leased until the op completes). Returns
// its ticket. Errors, all before anything is enqueued: stale_handle,
// invalid_argument (a slice outside its block; then as make_gemm_op),
// unsupported and backend_error as make_gemm_op. Thread safety: the pool's.
Result<Ticket> enqueue_gemm(DevicePool& pool, StreamId stream, MatrixSlice a, MatrixSlice b, MatrixSlice c,
                            const GemmShape& shape, UserCost cost = {});

// Which GEMM `backend` runs, for a person: "host GEMM (gemm_bf16)" on sim; on cuda
// the cuBLAS library loaded and how it was found, or why none could be. Loads
// cuBLAS on cuda (once per process). Never fails.
std::string gemm_library(const Backend& backend);

}  // namespace ferry
