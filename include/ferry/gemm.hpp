// ferry — the bf16 matrix product every backend and every reference model share.
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

#include "ferry/result.hpp"

namespace ferry {

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

}  // namespace ferry
