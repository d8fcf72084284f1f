// Fuzzes the safetensors header parser (WeightBank::parse_safetensors) with the
// whole input as a file's bytes. Beyond "no crash, no sanitizer report", every
// header it accepts must describe what the bank then trusts: each tensor inside
// the data section, its byte count the product of its shape and dtype size, no
// two non-empty tensors overlapping, no empty name.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <string>

#include "ferry/weight_bank.hpp"

#include "fuzz_input.hpp"

namespace {

[[noreturn]] void finding(const char* what) { ferry_fuzz::finding("fuzz_safetensors", what); }

std::uint64_t header_end(std::span<const std::byte> file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(file[i]);
  return 8 + n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  std::map<std::string, std::string> metadata;
  auto parsed = ferry::WeightBank::parse_safetensors(file, "fuzz.safetensors", &metadata);
  if (!parsed.ok()) {
    if (parsed.error().code != ferry::ErrorCode::invalid_argument) finding("a refusal that is not invalid_argument");
    if (parsed.error().message.empty()) finding("a refusal without a message");
    return 0;
  }
  if (size < 8) finding("accepted a file shorter than its length field");
  const std::uint64_t data_start = header_end(file);
  if (data_start > size) finding("accepted a header that runs past the end of the file");
  const std::uint64_t data_size = size - data_start;
  std::uint64_t reach = 0;  // tensors come sorted by offset
  std::uint64_t last_offset = 0;
  for (const ferry::TensorInfo& t : *parsed) {
    if (t.name.empty()) finding("accepted a tensor with an empty name");
    std::uint64_t bytes = ferry::dtype_size(t.dtype);
    if (bytes == 0) finding("accepted a tensor of no known dtype");
    for (std::uint64_t d : t.shape) {
      if (__builtin_mul_overflow(bytes, d, &bytes)) finding("accepted a shape whose byte count overflows");
    }
    if (bytes != t.bytes) finding("a tensor's bytes differ from prod(shape) * dtype size");
    if (t.offset > data_size || t.bytes > data_size - t.offset) finding("a tensor lies past the data section");
    if (t.offset < last_offset) finding("tensors are not sorted by offset");
    last_offset = t.offset;
    if (t.bytes == 0) continue;
    if (t.offset < reach) finding("two tensors overlap");
    reach = std::max(reach, t.offset + t.bytes);
  }
  return 0;
}
