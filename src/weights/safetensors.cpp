// safetensors: dtypes, header validation, and the writer tests use to make their
// own corpus.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "core/text.hpp"
#include "ferry/names.hpp"
#include "ferry/weight_bank.hpp"

namespace ferry {
namespace {

constexpr std::array<NamedValue<DType>, 15> kDTypes{{
    {DType::boolean, "BOOL"}, {DType::u8, "U8"},   {DType::i8, "I8"},   {DType::f8_e4m3, "F8_E4M3"},
    {DType::f8_e5m2, "F8_E5M2"}, {DType::i16, "I16"}, {DType::u16, "U16"}, {DType::f16, "F16"},
    {DType::bf16, "BF16"},    {DType::i32, "I32"}, {DType::u32, "U32"}, {DType::f32, "F32"},
    {DType::i64, "I64"},      {DType::u64, "U64"}, {DType::f64, "F64"},
}};

// safetensors' own reader refuses headers above 100 MB; so do we (a lying
// length must not make us parse gigabytes).
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;
// nlohmann's parser recurses per nesting level; a hostile "[[[[..." would
// overflow the stack long before 100 MB. A real header nests 3 levels.
constexpr int kMaxNesting = 64;

// Names come from untrusted files: messages show them printable and bounded.
std::string quoted_name(std::string_view name) { return text::quoted(name, 123); }

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

// Deepest [ / { nesting outside strings; stops early once past `limit`.
int nesting_depth(const char* p, std::size_t n, int limit, std::size_t* where) {
  int depth = 0, worst = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < n; ++i) {
    const char c = p[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > worst) {
        worst = depth;
        if (worst > limit) {
          *where = i;
          return worst;
        }
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return worst;
}

}  // namespace

std::string_view to_string(DType dtype) noexcept { return name_in<DType>(kDTypes, dtype); }

std::uint64_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::boolean:
    case DType::u8:
    case DType::i8:
    case DType::f8_e4m3:
    case DType::f8_e5m2:
      return 1;
    case DType::i16:
    case DType::u16:
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::i32:
    case DType::u32:
    case DType::f32:
      return 4;
    case DType::i64:
    case DType::u64:
    case DType::f64:
      return 8;
  }
  return 0;
}

Result<DType> parse_dtype(std::string_view text) {
  for (const NamedValue<DType>& d : kDTypes)
    if (d.name == text) return d.value;
  return make_error(ErrorCode::invalid_argument,
                    "unknown dtype " + quoted_name(text) + " (known: " + names_in<DType>(kDTypes, ", ") + ")");
}

std::string shape_text(std::span<const std::uint64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// One tensor's header entry, checked against the data section
// ([data_start, data_start + data_size) of the file, described by `section`).
// Errors: invalid_argument, the message naming the tensor.
Result<TensorInfo> parse_tensor(const std::string& key, const nlohmann::json& val, std::uint64_t data_start,
                                std::uint64_t data_size, const std::string& section) {
  const auto refuse = [](const std::string& what) { return make_error(ErrorCode::invalid_argument, what); };
  const std::string t = "tensor " + quoted_name(key);
  if (key.empty()) return refuse("a tensor has an empty name");
  if (!val.is_object()) return refuse(t + ": its entry is not a JSON object");
  const auto dt = val.find("dtype");
  if (dt == val.end() || !dt->is_string()) return refuse(t + ": \"dtype\" is missing or not a string");
  Result<DType> dtype = parse_dtype(dt->get_ref<const std::string&>());
  if (!dtype.ok()) return refuse(t + ": " + dtype.error().message);
  const auto sh = val.find("shape");
  if (sh == val.end() || !sh->is_array()) return refuse(t + ": \"shape\" is missing or not an array");
  TensorInfo info;
  info.name = key;
  info.dtype = *dtype;
  std::uint64_t elements = 1;
  bool overflow = false;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) {
      return refuse(t + ": \"shape\" holds " + d.dump() + ", not a non-negative integer");
    }
    const auto v = d.get<std::uint64_t>();
    info.shape.push_back(v);
    overflow = overflow || mul_overflows(elements, v, &elements);
  }
  std::uint64_t expected = 0;
  overflow = overflow || mul_overflows(elements, dtype_size(*dtype), &expected);
  const auto offs = val.find("data_offsets");
  if (offs == val.end() || !offs->is_array() || offs->size() != 2 ||
      !(*offs)[0].is_number_unsigned() || !(*offs)[1].is_number_unsigned()) {
    return refuse(t + ": \"data_offsets\" must be [BEGIN, END], two non-negative integers");
  }
  const auto begin = (*offs)[0].get<std::uint64_t>();
  const auto end = (*offs)[1].get<std::uint64_t>();
  const std::string range = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (end < begin) return refuse(t + ": " + range + " are reversed (END < BEGIN)");
  if (end > data_size) {
    return refuse(t + ": " + range + " end at file offset " +
               (end > UINT64_MAX - data_start ? std::string("beyond 2^64")
                                              : std::to_string(data_start + end)) +
               ", past the end of the file" + section);
  }
  if (overflow) {
    return refuse(t + ": shape " + shape_text(info.shape) + " of " + std::string(to_string(*dtype)) +
               " overflows 64-bit byte counts");
  }
  if (end - begin != expected) {
    return refuse(t + ": " + range + " hold " + std::to_string(end - begin) + " bytes (file offsets " +
               std::to_string(data_start + begin) + ".." + std::to_string(data_start + end) +
               "), but shape " + shape_text(info.shape) + " of " + std::string(to_string(*dtype)) +
               " needs " + std::to_string(expected));
  }
  info.offset = begin;
  info.bytes = expected;
  return info;
}

}  // namespace

Result<std::vector<TensorInfo>> WeightBank::parse_safetensors(
    std::span<const std::byte> file, std::string_view name,
    std::map<std::string, std::string>* metadata) {
  const std::uint64_t size = file.size();
  const auto bad = [&](const std::string& what) {
    return make_error(ErrorCode::invalid_argument, std::string(name) + ": " + what);
  };
  if (size < 8) {
    return bad("truncated: the file is " + std::to_string(size) +
               " bytes, too short for the 8-byte header length at offset 0");
  }
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(file[i]);
  if (n > size - 8) {
    return bad("header length " + std::to_string(n) +
               " (the u64 at offset 0) runs past the end of the file: the header would end at "
               "offset " + (n > UINT64_MAX - 8 ? std::string("beyond 2^64") : std::to_string(8 + n)) +
               " but the file is " + std::to_string(size) + " bytes (truncated, or not a safetensors file)");
  }
  if (n > kMaxHeaderBytes) {
    return bad("header length " + std::to_string(n) + " (the u64 at offset 0) exceeds the " +
               std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (n == 0) return bad("header length at offset 0 is 0: the JSON header is missing");
  const char* header = reinterpret_cast<const char*>(file.data() + 8);
  std::size_t deep_at = 0;
  if (nesting_depth(header, n, kMaxNesting, &deep_at) > kMaxNesting) {
    return bad("header JSON nests deeper than " + std::to_string(kMaxNesting) + " levels at offset " +
               std::to_string(8 + deep_at));
  }
  // The JSON parser stops at a NUL as at the end of input: whatever follows would pass unread.
  if (const void* nul = std::memchr(header, 0, n); nul != nullptr) {
    return bad("header JSON has a NUL byte at offset " +
               std::to_string(8 + (static_cast<const char*>(nul) - header)) + " (not valid JSON)");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header, header + n);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts from 1 within the header.
    const std::uint64_t at = 8 + (e.byte > 0 ? e.byte - 1 : 0);
    return bad("header JSON (offsets 8.." + std::to_string(8 + n) + ") is malformed near offset " +
               std::to_string(at) + ": " + e.what());
  } catch (const std::exception& e) {
    return bad(std::string("header JSON could not be parsed: ") + e.what());
  }
  if (!j.is_object()) return bad("header at offset 8 is not a JSON object");

  const std::uint64_t data_start = 8 + n;
  const std::uint64_t data_size = size - data_start;
  const std::string section = " (the data section is file offsets " + std::to_string(data_start) +
                              ".." + std::to_string(size) + ", " + std::to_string(data_size) + " bytes)";
  std::vector<TensorInfo> tensors;
  for (const auto& [key, val] : j.items()) {
    if (key == "__metadata__") {
      if (!val.is_object()) return bad("__metadata__ is not a JSON object");
      for (const auto& [mk, mv] : val.items()) {
        if (!mv.is_string()) return bad("__metadata__ value " + quoted_name(mk) + " is not a string");
        if (metadata != nullptr) (*metadata)[mk] = mv.get<std::string>();
      }
      continue;
    }
    Result<TensorInfo> info = parse_tensor(key, val, data_start, data_size, section);
    if (!info.ok()) return bad(info.error().message);
    tensors.push_back(std::move(*info));
  }
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
  });
  // Overlap: in offset order, a non-empty tensor must start at or after the end
  // of every earlier one.
  const TensorInfo* reach = nullptr;
  for (const TensorInfo& t : tensors) {
    if (t.bytes == 0) continue;
    if (reach != nullptr && t.offset < reach->offset + reach->bytes) {
      return bad("tensors " + quoted_name(reach->name) + " (data_offsets [" + std::to_string(reach->offset) +
                 ", " + std::to_string(reach->offset + reach->bytes) + "]) and " + quoted_name(t.name) +
                 " (data_offsets [" + std::to_string(t.offset) + ", " + std::to_string(t.offset + t.bytes) +
                 "]) overlap at file offset " + std::to_string(data_start + t.offset));
    }
    if (reach == nullptr || t.offset + t.bytes > reach->offset + reach->bytes) reach = &t;
  }
  return tensors;
}

namespace {

// What the header says of one tensor, and how many bytes write_data must write.
struct TensorHead {
  std::string_view name;
  DType dtype;
  std::span<const std::uint64_t> shape;
  std::uint64_t bytes;
};

// Writes the header of `tensors`, then the data of each in order through
// write_data(i, out), which must write exactly tensors[i].bytes bytes.
template <class WriteData>
Result<void> write_file(const std::string& path, std::span<const TensorHead> tensors,
                        const std::map<std::string, std::string>& metadata, WriteData&& write_data) {
  const auto bad = [&](const std::string& what) {
    return make_error(ErrorCode::invalid_argument, "write_safetensors(" + path + "): " + what);
  };
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const TensorHead& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return bad("tensor name " + quoted_name(t.name) + " is not allowed");
    }
    if (!names.insert(t.name).second) return bad("duplicate tensor name " + quoted_name(t.name));
    std::uint64_t expected = dtype_size(t.dtype);
    for (std::uint64_t d : t.shape) {
      if (mul_overflows(expected, d, &expected)) return bad("tensor " + quoted_name(t.name) + ": shape overflows");
    }
    if (expected != t.bytes) {
      return bad("tensor " + quoted_name(t.name) + ": shape " + shape_text(t.shape) + " of " +
                 std::string(to_string(t.dtype)) + " needs " + std::to_string(expected) + " bytes, got " +
                 std::to_string(t.bytes));
    }
    header[std::string(t.name)] = {{"dtype", std::string(to_string(t.dtype))},
                                   {"shape", std::vector<std::uint64_t>(t.shape.begin(), t.shape.end())},
                                   {"data_offsets", {offset, offset + expected}}};
    offset += expected;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return bad("cannot open for writing");
  std::array<char, 8> len{};
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out.write(len.data(), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (std::size_t i = 0; i < tensors.size() && out; ++i) write_data(i, out);
  out.flush();
  if (!out) return bad("write failed");
  return {};
}

void write_bytes(std::ostream& out, std::span<const std::byte> bytes) {
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

Result<void> write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                               const std::map<std::string, std::string>& metadata) {
  std::vector<TensorHead> heads;
  heads.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) heads.push_back({t.name, t.dtype, t.shape, t.data.size()});
  return write_file(path, heads, metadata,
                    [&](std::size_t i, std::ostream& out) { write_bytes(out, tensors[i].data); });
}

Result<void> write_safetensors(const std::string& path, const WeightBank& bank) {
  std::vector<TensorHead> heads;
  heads.reserve(bank.tensors().size());
  for (const TensorInfo& t : bank.tensors()) heads.push_back({t.name, t.dtype, t.shape, t.bytes});
  // A lazy bank's tensors are generated a piece at a time: a bank larger than
  // host memory still writes.
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  std::vector<std::byte> piece(bank.lazy() ? kPiece : 0);
  return write_file(path, heads, bank.metadata(), [&](std::size_t i, std::ostream& out) {
    if (!bank.lazy()) return write_bytes(out, bank.bytes(i));
    const std::uint64_t n = bank.tensors()[i].bytes;
    for (std::uint64_t off = 0; off < n && out; off += kPiece) {
      const std::span<std::byte> part(piece.data(), std::min(kPiece, n - off));
      bank.read(i, off, part);
      write_bytes(out, part);
    }
  });
}

}  // namespace ferry
