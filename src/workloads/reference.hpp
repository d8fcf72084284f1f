// Internal to the workloads: the host reference, the same arithmetic the device
// runs (content.hpp, gemm.hpp) computed on the host without the pool, and the
// check that a weights file suits bit-exact GEMMs.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/content.hpp"
#include "ferry/gemm.hpp"
#include "ferry/result.hpp"
#include "ferry/weight_bank.hpp"

namespace ferry::workloads {

// Every value a workload writes (fills, kernels) is in this pattern, so any of
// them can be a GEMM operand (see workload.hpp).
inline constexpr Pattern kPattern = Pattern::small_bf16;

// A value of the host reference: its content hash and size, and when matmuls are
// GEMMs (or the Reference is asked to) its bytes too, which a host GEMM reads:
// viewed where they exist already, else owned (shared, so values copy cheaply).
struct HostValue {
  std::uint64_t hash = 0;
  std::uint64_t size = 0;
  std::span<const std::byte> bytes;
  std::shared_ptr<const std::vector<std::byte>> owned;
};

// The reference model's arithmetic: the same definitions the device uses
// (content.hpp, gemm.hpp), computed on the host without the pool.
class Reference {
 public:
  // Values carry their bytes when matmuls are GEMMs or `materialize` asks.
  explicit Reference(bool gemm, bool materialize = false) : gemm_(gemm), materialize_(gemm || materialize) {}

  // Bytes that exist already (a bank tensor or part of one, a download), viewed:
  // they must outlive the value.
  HostValue view(std::span<const std::byte> bytes, std::uint64_t hash) const;
  HostValue view(std::span<const std::byte> bytes) const;
  // Bytes [offset, offset + bytes) of a bank tensor (0, 0: all of it): viewed in
  // a resident bank, generated for a lazy one when the value needs its bytes.
  HostValue weight(const WeightBank& bank, std::size_t tensor, std::uint64_t offset = 0,
                   std::uint64_t bytes = 0) const;
  // fill_with(kPattern, seed) of `bytes`.
  HostValue fill(std::uint64_t seed, std::uint64_t bytes);
  // A kernel's output of `bytes` over these inputs.
  HostValue kernel(const std::vector<HostValue>& inputs, std::uint64_t bytes);
  // A matmul's output: the host GEMM, or a kernel over {a, b}.
  HostValue matmul(const HostValue& a, const HostValue& b, const GemmShape& shape);

  static std::uint64_t mix(const std::vector<std::uint64_t>& hashes);
  static std::uint64_t mix(const std::vector<HostValue>& inputs);

  // The first host GEMM that failed (a schedule bug, or no host memory); empty if none.
  const std::string& error() const noexcept { return error_; }

 private:
  HostValue owned(std::vector<std::byte> bytes) const;

  bool gemm_, materialize_;
  std::string error_;
};

// Under gemm, checks that every element of the bf16 tensors a matmul reads is an
// integer in [-2, 2] (so FP32 sums them exactly; synthetic banks always pass).
// Errors: invalid_argument naming the tensor, the element and its value.
Result<void> check_gemm_weights(const WeightBank& bank, const std::vector<std::size_t>& tensors);

}  // namespace ferry::workloads
