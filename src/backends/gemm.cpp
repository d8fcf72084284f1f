#include "ferry/gemm.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace ferry {

static_assert(std::endian::native == std::endian::little,
              "the bf16 definitions assume a little-endian host");

namespace {

// Products at least this large (m * n * k) are split over a few threads.
constexpr std::uint64_t kParallelGemmMin = std::uint64_t{1} << 24;
constexpr unsigned kMaxGemmThreads = 8;

std::uint16_t load_bf16(const std::byte* p) noexcept {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return bits;
}

// Blocking: a block of rows of C is built a block of columns at a time, so one
// pass over op(B) serves kRowBlock rows and the accumulators stay in L1.
constexpr std::size_t kRowBlock = 8;
constexpr std::size_t kColBlock = 256;

// acc[ri][j] = sum over p ascending of arows[ri][p] * bp[p][j], for ri < rows and
// j < width (bp's rows `stride` floats apart). Each element's sum runs in
// ascending p whatever the blocking, which is what keeps it the definition.
// Not instrumented by the sanitizers: their checks stop the loop vectorizing
// (10x slower in the dev preset, which runs real GEMMs); every index here is
// bounded by the buffers gemm_bf16 sizes, and everything around it is checked.
__attribute__((no_sanitize("address", "undefined")))
void accumulate_block(const float* __restrict arows, std::size_t rows, std::size_t k,
                      const float* __restrict bp, std::size_t stride, std::size_t width,
                      float* __restrict acc) noexcept {
  for (std::size_t ri = 0; ri < rows; ++ri) std::fill_n(acc + ri * kColBlock, width, 0.0f);
  for (std::size_t p = 0; p < k; ++p) {
    const float* __restrict brow = bp + p * stride;
    for (std::size_t ri = 0; ri < rows; ++ri) {
      const float x = arows[ri * k + p];
      float* __restrict out = acc + ri * kColBlock;
      for (std::size_t j = 0; j < width; ++j) out[j] += x * brow[j];
    }
  }
}

std::string size_text(std::uint64_t bytes) { return std::to_string(bytes) + " B"; }

}  // namespace

std::string GemmShape::text() const {
  return std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) + " (" +
         (trans_a ? "A^T" : "A") + ", " + (trans_b ? "B^T" : "B") + ")";
}

float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(std::uint32_t{bits} << 16);
}

std::uint16_t float_to_bf16(float value) noexcept {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  // Rounding could carry a NaN's payload into the exponent and make it infinite;
  // keep the sign and the top of the payload, and set the quiet bit.
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x0040);
  // Ties to even: add just under half an ulp, plus one when the kept lsb is odd.
  // A carry into the exponent is the correct rounding, up to infinity.
  const std::uint32_t rounded = bits + 0x7fff + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>(rounded >> 16);
}

Result<void> check_gemm(const GemmShape& shape, std::uint64_t a_bytes, std::uint64_t b_bytes,
                        std::uint64_t c_bytes) {
  const auto bad = [&](std::string why) {
    return Result<void>(make_error(ErrorCode::invalid_argument, "gemm " + shape.text() + ": " + std::move(why)));
  };
  if (shape.m == 0 || shape.n == 0 || shape.k == 0) return bad("m, n and k must all be > 0");
  if (shape.k >= (std::uint32_t{1} << 31)) return bad("k must be < 2^31");
  // m * n * 2 is the only size that can overflow (k < 2^31 bounds the others).
  if (std::uint64_t{shape.m} * shape.n > (std::numeric_limits<std::uint64_t>::max() >> 1)) {
    return bad("m * n is too large");
  }
  const auto size = [&](const char* which, std::uint64_t expected, std::uint64_t given) {
    return expected == given ? Result<void>()
                             : bad(std::string(which) + " holds " + size_text(given) + ", the shape needs " +
                                   size_text(expected));
  };
  FERRY_TRY(size("a", shape.a_bytes(), a_bytes));
  FERRY_TRY(size("b", shape.b_bytes(), b_bytes));
  return size("c", shape.c_bytes(), c_bytes);
}

Result<void> gemm_bf16(const GemmShape& shape, std::span<const std::byte> a, std::span<const std::byte> b,
                       std::span<std::byte> c) {
  FERRY_TRY(check_gemm(shape, a.size(), b.size(), c.size()));
  const std::size_t m = shape.m, n = shape.n, k = shape.k;

  // Rows are independent and each is computed the same way on any thread, so
  // the split never changes a bit of the result.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool large = shape.flops() >= 2.0 * static_cast<double>(kParallelGemmMin);  // m * n * k
  const std::size_t workers = large ? std::min<std::size_t>({cores, kMaxGemmThreads, m}) : 1;

  // Every buffer is taken here, on the calling thread, so that running out of
  // memory is an error value and no worker can throw.
  const std::size_t per_worker = kRowBlock * k + kRowBlock * kColBlock;  // a block of A's rows, accumulators
  std::vector<float> bp, scratch;
  try {
    bp.resize(k * n);
    scratch.resize(workers * per_worker);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, "gemm " + shape.text() + ": no host memory for its " +
                                                    std::to_string((k * n + workers * per_worker) * 4) +
                                                    " B of scratch");
  }

  // op(B) as a k x n float matrix, so that the inner loop below runs over j with
  // unit stride (and vectorizes) while every C[i][j] still sums in ascending p.
  for (std::size_t p = 0; p < k; ++p) {
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t at = shape.trans_b ? j * k + p : p * n + j;
      bp[p * n + j] = bf16_to_float(load_bf16(b.data() + 2 * at));
    }
  }

  const auto rows = [&](std::size_t first, std::size_t last, float* arows, float* acc) noexcept {
    for (std::size_t i0 = first; i0 < last; i0 += kRowBlock) {
      const std::size_t r = std::min(kRowBlock, last - i0);
      for (std::size_t ri = 0; ri < r; ++ri) {
        for (std::size_t p = 0; p < k; ++p) {
          const std::size_t at = shape.trans_a ? p * m + i0 + ri : (i0 + ri) * k + p;
          arows[ri * k + p] = bf16_to_float(load_bf16(a.data() + 2 * at));
        }
      }
      for (std::size_t j0 = 0; j0 < n; j0 += kColBlock) {
        const std::size_t w = std::min(kColBlock, n - j0);
        accumulate_block(arows, r, k, bp.data() + j0, n, w, acc);
        for (std::size_t ri = 0; ri < r; ++ri) {
          for (std::size_t j = 0; j < w; ++j) {
            const std::uint16_t bits = float_to_bf16(acc[ri * kColBlock + j]);
            std::memcpy(c.data() + 2 * ((i0 + ri) * n + j0 + j), &bits, 2);
          }
        }
      }
    }
  };
  const auto rows_on = [&](std::size_t worker, std::size_t first, std::size_t last) noexcept {
    float* own = scratch.data() + worker * per_worker;
    rows(first, last, own, own + kRowBlock * k);
  };

  if (workers <= 1) {
    rows_on(0, 0, m);
    return {};
  }
  const std::size_t per = (m + workers - 1) / workers;
  std::vector<std::thread> threads;
  std::size_t started_through = per;  // rows [0, per) stay on this thread
  try {
    threads.reserve(workers - 1);
    for (std::size_t first = per, w = 1; first < m; first += per, ++w) {
      threads.emplace_back(rows_on, w, first, std::min(m, first + per));
      started_through = std::min(m, first + per);
    }
  } catch (...) {
    // No thread to be had: compute the rest here, as the serial path would.
  }
  rows_on(0, started_through, m);
  rows_on(0, 0, std::min(m, per));
  for (std::thread& t : threads) t.join();
  return {};
}

double gemm_bf16_max_error(std::span<const std::byte> x, std::span<const std::byte> y) noexcept {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // An odd size is no bf16 matrix at all: as far from any as a size mismatch.
  if (x.size() != y.size() || x.size() % 2 != 0) return kInf;
  double worst = 0;
  for (std::size_t e = 0; e < x.size(); e += 2) {
    const double xv = bf16_to_float(load_bf16(x.data() + e));
    const double yv = bf16_to_float(load_bf16(y.data() + e));
    if (std::isnan(xv) || std::isnan(yv)) return kInf;
    if (xv == yv) continue;  // equal infinities included
    const double err = std::abs(xv - yv) / std::max(1.0, std::abs(yv));
    if (!(err <= worst)) worst = std::isnan(err) ? kInf : err;
  }
  return worst;
}

}  // namespace ferry
