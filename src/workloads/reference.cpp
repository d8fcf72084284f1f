#include "workloads/reference.hpp"

#include <charconv>
#include <cmath>
#include <utility>

#include "ferry/content.hpp"

namespace ferry::workloads {

HostValue Reference::owned(std::vector<std::byte> bytes) const {
  HostValue v;
  v.size = bytes.size();
  v.hash = content_hash(bytes);
  auto kept = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
  v.bytes = *kept;
  v.owned = std::move(kept);
  return v;
}

HostValue Reference::view(std::span<const std::byte> bytes, std::uint64_t hash) const {
  HostValue v;
  v.hash = hash;
  v.size = bytes.size();
  if (materialize_) v.bytes = bytes;
  return v;
}

HostValue Reference::view(std::span<const std::byte> bytes) const { return view(bytes, content_hash(bytes)); }

HostValue Reference::weight(const WeightBank& bank, std::size_t tensor, std::uint64_t offset,
                            std::uint64_t bytes) const {
  const std::uint64_t size = bank.tensors()[tensor].bytes;
  if (bytes == 0) bytes = size - offset;
  const bool whole = offset == 0 && bytes == size;
  if (!bank.lazy()) {
    return whole ? view(bank.bytes(tensor), bank.hash(tensor)) : view(bank.bytes(tensor).subspan(offset, bytes));
  }
  if (!materialize_) return HostValue{whole ? bank.hash(tensor) : bank.hash(tensor, offset, bytes), bytes, {}, nullptr};
  std::vector<std::byte> out(bytes);
  bank.read(tensor, offset, out);
  return owned(std::move(out));
}


HostValue Reference::fill(std::uint64_t seed, std::uint64_t bytes) {
  if (materialize_) {
    std::vector<std::byte> out(bytes);
    fill_with(kPattern, seed, 0, out);
    return owned(std::move(out));
  }
  return HostValue{pattern_hash(kPattern, seed, 0, bytes), bytes, {}, nullptr};
}

HostValue Reference::kernel(const std::vector<HostValue>& inputs, std::uint64_t bytes) {
  return fill(mix(inputs), bytes);
}

HostValue Reference::matmul(const HostValue& a, const HostValue& b, const GemmShape& shape) {
  if (!gemm_) return kernel({a, b}, shape.c_bytes());
  std::vector<std::byte> c(shape.c_bytes());
  // The digest cannot match after a failure; error() says why.
  if (Result<void> r = gemm_bf16(shape, a.bytes, b.bytes, c); !r.ok()) {
    if (error_.empty()) error_ = r.error().message;
    return HostValue{};
  }
  return owned(std::move(c));
}

std::uint64_t Reference::mix(const std::vector<std::uint64_t>& hashes) {
  std::uint64_t acc = kMixStart;
  for (std::size_t k = 0; k < hashes.size(); ++k) acc = mix_step(acc, k, hashes[k]);
  return acc;
}

std::uint64_t Reference::mix(const std::vector<HostValue>& inputs) {
  std::uint64_t acc = kMixStart;
  for (std::size_t k = 0; k < inputs.size(); ++k) acc = mix_step(acc, k, inputs[k].hash);
  return acc;
}

Result<void> check_gemm_weights(const WeightBank& bank, const std::vector<std::size_t>& tensors) {
  for (std::size_t t : tensors) {
    const TensorInfo& info = bank.tensors()[t];
    if (info.dtype != DType::bf16) continue;
    const std::span<const std::byte> bytes = bank.bytes(t);
    for (std::uint64_t i = 0; i + 1 < bytes.size(); i += 2) {
      const auto bits = static_cast<std::uint16_t>(std::to_integer<unsigned>(bytes[i]) |
                                                   std::to_integer<unsigned>(bytes[i + 1]) << 8);
      const float v = bf16_to_float(bits);
      if (!(v >= -2 && v <= 2 && v == std::trunc(v))) {
        char value[32];  // the shortest form that reads back: "3", "0.5"
        const auto printed = std::to_chars(value, value + sizeof value, v);
        return make_error(ErrorCode::invalid_argument,
                          "--matmul gemm checks the output bit for bit, which needs weights a GEMM sums "
                          "exactly (bf16 integers in [-2, 2], as synthetic banks hold), but " + bank.source() +
                              " tensor \"" + info.name + "\" element " + std::to_string(i / 2) + " is " +
                              std::string(value, printed.ptr) + "; run it with --matmul mix");
      }
    }
  }
  return {};
}

}  // namespace ferry::workloads
