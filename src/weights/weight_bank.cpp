// WeightBank: a safetensors file read into memory or a synthetic buffer, and
// its placement with a transfer engine.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/input_file.hpp"
#include "ferry/content.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/names.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/weight_bank.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kSyntheticAlign = 256;

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

constexpr std::array<NamedValue<BankPlacement>, 2> kPlacements{{
    {BankPlacement::registered, "registered"},
    {BankPlacement::arena, "arena"},
}};

}  // namespace

std::string_view to_string(BankPlacement placement) noexcept {
  return name_in<BankPlacement>(kPlacements, placement);
}

Result<BankPlacement> parse_bank_placement(std::string_view text) {
  return value_in<BankPlacement>(kPlacements, text, "bank placement");
}

struct WeightBank::Impl {
  std::string source;
  bool from_file = false;
  // Storage: a page-aligned heap buffer holding the file or the synthetic tensors.
  std::byte* buffer = nullptr;
  std::size_t buffer_len = 0;
  const std::byte* data = nullptr;  // tensor offsets are relative to this
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string, std::size_t> index;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_bytes = 0;

  mutable std::mutex hash_mu;  // guards hashes (first computation only)
  mutable std::vector<std::uint64_t> hashes;
  mutable std::vector<std::uint8_t> hashed;

  // Placement.
  TransferEngine* engine = nullptr;
  std::optional<BankPlacement> placement;
  RegionId region = 0;
  std::vector<HostBlock> blocks;  // arena placement: one per tensor (null when empty)

  ~Impl() {
    (void)unplace();
    std::free(buffer);
  }

  void build_index() {
    hashes.assign(tensors.size(), 0);
    hashed.assign(tensors.size(), 0);
    data_bytes = 0;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      index.emplace(tensors[i].name, i);
      data_bytes += tensors[i].bytes;
    }
  }

  std::span<const std::byte> original(std::size_t i) const {
    return {data + tensors[i].offset, tensors[i].bytes};
  }

  // The registered range: the whole buffer, page-aligned.
  std::pair<std::byte*, std::uint64_t> whole() const { return {buffer, buffer_len}; }

  Result<void> unplace() {
    if (!placement) return {};
    Result<void> result;
    if (*placement == BankPlacement::registered) {
      result = engine->unregister(region);
    } else {
      // Stream-ordered: a block still read by a transfer stays pinned until it completes.
      for (const HostBlock& b : blocks) {
        if (!b) continue;
        Result<void> r = engine->arena().free(b);
        if (!r.ok() && result.ok()) result = std::move(r);
      }
      blocks.clear();
    }
    placement.reset();
    engine = nullptr;
    region = 0;
    return result;
  }
};

WeightBank::WeightBank(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WeightBank::WeightBank(WeightBank&&) noexcept = default;
WeightBank& WeightBank::operator=(WeightBank&&) noexcept = default;
WeightBank::~WeightBank() = default;

Result<WeightBank> WeightBank::open_safetensors(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->source = path;
  impl->from_file = true;
  Result<InputFile> file = InputFile::open(path);
  if (!file.ok()) return std::move(file).error();
  const std::uint64_t size = file->size();
  if (size == 0) {
    auto parsed = parse_safetensors({}, path);
    return std::move(parsed).error();  // an empty file is always malformed
  }
  // Read whole rather than mapped: a run uploads every tensor anyway, and a
  // mapped file truncated under the run would kill the process with SIGBUS (I7).
  impl->buffer_len = round_up(size, kPage);
  impl->buffer = static_cast<std::byte*>(std::aligned_alloc(kPage, impl->buffer_len));
  if (impl->buffer == nullptr) {
    return make_error(ErrorCode::out_of_memory,
                      path + ": cannot allocate " + std::to_string(impl->buffer_len) + " bytes of host memory to read it");
  }
  std::memset(impl->buffer + size, 0, impl->buffer_len - size);
  FERRY_TRY(file->read_exactly({impl->buffer, size}));
  const std::span<const std::byte> bytes(impl->buffer, size);
  Result<std::vector<TensorInfo>> tensors = parse_safetensors(bytes, path, &impl->metadata);
  if (!tensors.ok()) return std::move(tensors).error();
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  impl->data = bytes.data() + 8 + n;
  impl->tensors = std::move(tensors).value();
  impl->build_index();
  return WeightBank(std::move(impl));
}

Result<WeightBank> WeightBank::synthetic(std::span<const SyntheticTensor> tensors, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->source = std::move(name);
  std::uint64_t offset = 0;
  for (const SyntheticTensor& s : tensors) {
    if (s.name.empty() || s.name == "__metadata__") {
      return make_error(ErrorCode::invalid_argument, "synthetic bank: tensor name \"" + s.name + "\" is not allowed");
    }
    if (impl->index.count(s.name) != 0) {
      return make_error(ErrorCode::invalid_argument, "synthetic bank: duplicate tensor \"" + s.name + "\"");
    }
    TensorInfo info{s.name, s.dtype, s.shape, 0, dtype_size(s.dtype)};
    for (std::uint64_t d : s.shape) {
      if (__builtin_mul_overflow(info.bytes, d, &info.bytes)) {
        return make_error(ErrorCode::invalid_argument,
                          "synthetic bank: tensor \"" + s.name + "\" shape " + shape_text(s.shape) + " overflows");
      }
    }
    if (info.bytes > (std::uint64_t{1} << 46) || offset > (std::uint64_t{1} << 46)) {
      return make_error(ErrorCode::invalid_argument, "synthetic bank: tensor \"" + s.name + "\" is too large");
    }
    info.offset = offset;
    offset = round_up(offset + info.bytes, kSyntheticAlign);
    impl->index.emplace(s.name, impl->tensors.size());
    impl->tensors.push_back(std::move(info));
  }
  impl->index.clear();
  impl->buffer_len = round_up(std::max<std::uint64_t>(offset, 1), kPage);
  impl->buffer = static_cast<std::byte*>(std::aligned_alloc(kPage, impl->buffer_len));
  if (impl->buffer == nullptr) {
    return make_error(ErrorCode::out_of_memory,
                      "synthetic bank: cannot allocate " + std::to_string(impl->buffer_len) + " bytes");
  }
  std::memset(impl->buffer, 0, impl->buffer_len);
  for (std::size_t i = 0; i < impl->tensors.size(); ++i) {
    const TensorInfo& t = impl->tensors[i];
    fill_with(tensors[i].pattern, tensors[i].seed, 0, {impl->buffer + t.offset, t.bytes});
  }
  impl->data = impl->buffer;
  impl->build_index();
  return WeightBank(std::move(impl));
}

const std::string& WeightBank::source() const noexcept { return impl_->source; }
bool WeightBank::from_file() const noexcept { return impl_->from_file; }
std::span<const TensorInfo> WeightBank::tensors() const noexcept { return impl_->tensors; }
const std::map<std::string, std::string>& WeightBank::metadata() const noexcept { return impl_->metadata; }
std::uint64_t WeightBank::data_bytes() const noexcept { return impl_->data_bytes; }

std::optional<std::size_t> WeightBank::find(std::string_view name) const {
  auto it = impl_->index.find(std::string(name));
  if (it == impl_->index.end()) return std::nullopt;
  return it->second;
}

Result<std::size_t> WeightBank::require(std::string_view name, DType dtype,
                                        std::span<const std::uint64_t> shape) const {
  const auto i = find(name);
  if (!i) {
    return make_error(ErrorCode::invalid_argument,
                      impl_->source + ": tensor \"" + std::string(name) + "\" is missing (expected " +
                          std::string(to_string(dtype)) + " " + shape_text(shape) + ")");
  }
  const TensorInfo& t = impl_->tensors[*i];
  if (t.dtype != dtype || !std::equal(t.shape.begin(), t.shape.end(), shape.begin(), shape.end())) {
    return make_error(ErrorCode::invalid_argument,
                      impl_->source + ": tensor \"" + t.name + "\" is " + std::string(to_string(t.dtype)) +
                          " " + shape_text(t.shape) + ", expected " + std::string(to_string(dtype)) + " " +
                          shape_text(shape));
  }
  return *i;
}

std::span<const std::byte> WeightBank::bytes(std::size_t index) const noexcept {
  const Impl& p = *impl_;
  if (p.placement == BankPlacement::arena && p.blocks[index]) {
    const HostBlock& b = p.blocks[index];
    return {b.data, b.bytes};
  }
  return p.original(index);
}

std::uint64_t WeightBank::hash(std::size_t index) const {
  const Impl& p = *impl_;
  {
    std::lock_guard lock(p.hash_mu);
    if (p.hashed[index]) return p.hashes[index];
  }
  // Hash outside the lock: it costs time proportional to the tensor. Two racing
  // first calls compute the same value.
  const std::uint64_t h = content_hash(p.original(index));
  std::lock_guard lock(p.hash_mu);
  p.hashes[index] = h;
  p.hashed[index] = 1;
  return h;
}

Result<void> WeightBank::place(TransferEngine& engine, BankPlacement placement) {
  Impl& p = *impl_;
  if (p.placement) {
    return make_error(ErrorCode::invalid_argument,
                      p.source + ": already placed (" + std::string(to_string(*p.placement)) + ")");
  }
  if (placement == BankPlacement::registered) {
    auto [base, len] = p.whole();
    // Registered in place and never written: the bank never changes its buffer,
    // the backend only reads it.
    Result<RegionId> region = engine.register_immutable(base, len);
    if (!region.ok()) {
      Error e = std::move(region).error();
      e.message = p.source + ": registering " + std::to_string(len) + " bytes in place: " + e.message;
      return e;
    }
    p.region = *region;
    p.engine = &engine;
    p.placement = placement;
    if (engine.policy() == IntegrityPolicy::verify) {
      // verify compares every upload with its source hash: compute each
      // tensor's once, now, instead of on its first upload.
      for (std::size_t i = 0; i < p.tensors.size(); ++i) {
        if (p.tensors[i].bytes == 0) continue;
        FERRY_TRY(engine.precompute_hash(p.original(i).data(), p.tensors[i].bytes));
      }
    }
    return {};
  }
  std::vector<HostBlock> blocks(p.tensors.size());
  for (std::size_t i = 0; i < p.tensors.size(); ++i) {
    if (p.tensors[i].bytes == 0) continue;
    Result<HostBlock> b = engine.arena().allocate(p.tensors[i].bytes);
    if (!b.ok()) {
      for (const HostBlock& done : blocks)
        if (done) (void)engine.arena().free(done);
      Error e = std::move(b).error();
      e.message = p.source + ": copying tensor \"" + p.tensors[i].name + "\" into the host arena: " + e.message;
      return e;
    }
    std::memcpy(b->data, p.original(i).data(), p.tensors[i].bytes);
    blocks[i] = *b;
  }
  p.blocks = std::move(blocks);
  p.engine = &engine;
  p.placement = placement;
  return {};
}

Result<void> WeightBank::unplace() { return impl_ ? impl_->unplace() : Result<void>(); }
bool WeightBank::placed() const noexcept { return impl_ && impl_->placement.has_value(); }
std::optional<BankPlacement> WeightBank::placement() const noexcept {
  return impl_ ? impl_->placement : std::nullopt;
}

}  // namespace ferry
