// WeightBank: a safetensors file read into memory or a synthetic buffer
// (resident, or generated range by range as uploads stage it), and its placement
// with a transfer engine.
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <unordered_map>

#include "core/input_file.hpp"
#include "core/align.hpp"
#include "ferry/backend.hpp"
#include "ferry/content.hpp"
#include "ferry/host_arena.hpp"
#include "ferry/names.hpp"
#include "ferry/stream_order.hpp"
#include "ferry/transfer_engine.hpp"
#include "ferry/weight_bank.hpp"

namespace ferry {
namespace {

constexpr std::uint64_t kPage = 4096;
constexpr std::uint64_t kSyntheticAlign = 256;

using detail::align_up;

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
  // Storage: a page-aligned heap buffer holding the file or the synthetic
  // tensors; lazy: an anonymous mapping, backed only where a range is staged.
  std::byte* buffer = nullptr;
  std::size_t buffer_len = 0;
  bool lazy = false;
  std::vector<std::pair<Pattern, std::uint64_t>> generators;  // synthetic: each tensor's (pattern, seed)
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
  std::vector<std::pair<TransferEngine*, RegionId>> also;  // place_also: more engines, same bytes
  std::vector<HostBlock> blocks;  // arena placement: one per tensor (null when empty)

  // Lazy registered placement: the ranges generated in place and not yet dropped.
  struct Staging {
    std::uint64_t begin = 0, end = 0;  // offsets in the buffer
    std::uint32_t holders = 0;         // stage() calls not yet released
    std::vector<StreamPoint> readers;  // released: points to complete before the drop
  };
  // Lock order: stage_mu, then the StreamOrder's locks (is_complete); never the reverse.
  std::mutex stage_mu;  // guards everything below
  std::map<std::uint64_t, Staging> staged;  // by id
  std::uint64_t next_id = 1;
  std::set<std::uint64_t> kept_pages;  // page offsets never dropped: canary areas
  BankStats st;

  ~Impl() {
    // Leaked rather than released while transfers may still read it (unplace failed).
    if (!unplace().ok()) return;
    if (lazy) {
      if (buffer != nullptr) munmap(buffer, buffer_len);
    } else {
      std::free(buffer);
    }
  }

  void generate(std::size_t i, std::uint64_t offset, std::span<std::byte> out) const {
    fill_with(generators[i].first, generators[i].second, offset, out);
  }

  // Generates the bytes of every tensor that overlaps [begin, end) of the buffer, in place.
  void generate_in_place(std::uint64_t begin, std::uint64_t end) {
    auto it = std::upper_bound(tensors.begin(), tensors.end(), begin,
                               [](std::uint64_t v, const TensorInfo& t) { return v < t.offset + t.bytes; });
    for (; it != tensors.end() && it->offset < end; ++it) {
      const std::uint64_t b = std::max(begin, it->offset), e = std::min(end, it->offset + it->bytes);
      if (b < e) generate(static_cast<std::size_t>(it - tensors.begin()), b - it->offset, {buffer + b, e - b});
    }
  }

  void add_resident(std::uint64_t bytes) {
    st.resident_bytes += bytes;
    st.peak_resident_bytes = std::max(st.peak_resident_bytes, st.resident_bytes);
  }

  // Gives back the pages wholly inside `s` that no other staging overlaps and
  // that are not kept. Under stage_mu.
  void drop(const Staging& s) {
    const auto shared = [&](std::uint64_t page) {
      if (kept_pages.count(page) != 0) return true;
      for (const auto& [id, o] : staged) {
        if (&o != &s && o.begin < page + kPage && page < o.end) return true;
      }
      return false;
    };
    std::uint64_t run = 0, run_bytes = 0;
    const auto flush = [&] {
      // Anonymous private memory reads back as zeros after this: the range is absent again.
      if (run_bytes != 0) (void)madvise(buffer + run, run_bytes, MADV_DONTNEED);
      run_bytes = 0;
    };
    for (std::uint64_t page = align_up(s.begin, kPage); page + kPage <= s.end; page += kPage) {
      if (shared(page)) {
        flush();
        continue;
      }
      if (run_bytes == 0) run = page;
      run_bytes += kPage;
    }
    flush();
    st.resident_bytes -= s.end - s.begin;
    ++st.dropped;
  }

  // Drops every released staging whose readers all completed (polling never
  // changes the sim's schedule). Under stage_mu.
  void retire_staged() {
    for (auto it = staged.begin(); it != staged.end();) {
      Staging& s = it->second;
      if (s.holders != 0) {
        ++it;
        continue;
      }
      std::erase_if(s.readers, [&](StreamPoint p) { return engine->arena().order().is_complete(p); });
      if (!s.readers.empty()) {
        ++it;
        continue;
      }
      drop(s);
      it = staged.erase(it);
    }
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
    while (!also.empty()) {
      FERRY_TRY(also.back().first->unregister(also.back().second));
      also.pop_back();
    }
    if (*placement == BankPlacement::registered) {
      result = engine->unregister(region);
      // Transfers may still read the bank: it stays placed, its bytes in place.
      if (!result.ok()) return result;
      if (lazy) {
        // unregister() waited for every transfer out of the bank: nothing reads it now.
        std::lock_guard lock(stage_mu);
        (void)madvise(buffer, buffer_len, MADV_DONTNEED);
        staged.clear();
        kept_pages.clear();
        st.resident_bytes = 0;
      }
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
  impl->buffer_len = align_up(size, kPage);
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
  impl->add_resident(impl->buffer_len);
  return WeightBank(std::move(impl));
}

Result<WeightBank> WeightBank::synthetic(std::span<const SyntheticTensor> tensors, std::string name,
                                         SyntheticStorage storage) {
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
    offset = align_up(offset + info.bytes, kSyntheticAlign);
    impl->index.emplace(s.name, impl->tensors.size());
    impl->tensors.push_back(std::move(info));
    impl->generators.emplace_back(s.pattern, s.seed);
  }
  impl->index.clear();
  impl->buffer_len = align_up(std::max<std::uint64_t>(offset, 1), kPage);
  if (storage == SyntheticStorage::lazy) {
    // Address space only: pages are backed when a staging writes them.
    void* m = mmap(nullptr, impl->buffer_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
      return make_error(ErrorCode::out_of_memory,
                        "synthetic bank: cannot reserve " + std::to_string(impl->buffer_len) + " bytes of address space");
    }
    impl->buffer = static_cast<std::byte*>(m);
    impl->lazy = true;
  } else {
    impl->buffer = static_cast<std::byte*>(std::aligned_alloc(kPage, impl->buffer_len));
    if (impl->buffer == nullptr) {
      return make_error(ErrorCode::out_of_memory,
                        "synthetic bank: cannot allocate " + std::to_string(impl->buffer_len) + " bytes");
    }
    std::memset(impl->buffer, 0, impl->buffer_len);
    for (std::size_t i = 0; i < impl->tensors.size(); ++i) {
      const TensorInfo& t = impl->tensors[i];
      impl->generate(i, 0, {impl->buffer + t.offset, t.bytes});
    }
    impl->add_resident(impl->buffer_len);
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

bool WeightBank::lazy() const noexcept { return impl_->lazy; }

std::span<const std::byte> WeightBank::bytes(std::size_t index) const noexcept {
  const Impl& p = *impl_;
  if (p.placement == BankPlacement::arena && p.blocks[index]) {
    const HostBlock& b = p.blocks[index];
    return {b.data, b.bytes};
  }
  if (p.lazy) return {};
  return p.original(index);
}

void WeightBank::read(std::size_t index, std::uint64_t offset, std::span<std::byte> out) const {
  const Impl& p = *impl_;
  if (p.lazy) {
    p.generate(index, offset, out);
  } else if (!out.empty()) {
    std::memcpy(out.data(), p.original(index).data() + offset, out.size());
  }
}

std::uint64_t WeightBank::hash(std::size_t index, std::uint64_t offset, std::uint64_t bytes) const {
  const Impl& p = *impl_;
  if (!p.lazy) return content_hash(p.original(index).subspan(offset, bytes));
  return pattern_hash(p.generators[index].first, p.generators[index].second, offset, bytes);
}

std::uint64_t WeightBank::hash(std::size_t index) const {
  const Impl& p = *impl_;
  {
    std::lock_guard lock(p.hash_mu);
    if (p.hashed[index]) return p.hashes[index];
  }
  // Hash outside the lock: it costs time proportional to the tensor. Two racing
  // first calls compute the same value.
  const std::uint64_t h = hash(index, 0, p.tensors[index].bytes);
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
    if (p.lazy && !engine.arena().order().backend().info().lazy_host_ranges) {
      return make_error(ErrorCode::unsupported,
                        p.source + ": a lazy bank is registered only on the sim (a driver pins the pages it "
                                   "registers, so they cannot stay unbacked); use a resident bank");
    }
    // Registered in place. Resident: never written, the backend only reads it.
    // Lazy: a range is written (always the same bytes) only while no transfer reads it.
    Result<RegionId> region = p.lazy ? engine.register_generated(base, len) : engine.register_immutable(base, len);
    if (!region.ok()) {
      Error e = std::move(region).error();
      e.message = p.source + ": registering " + std::to_string(len) + " bytes in place: " + e.message;
      return e;
    }
    p.region = *region;
    p.engine = &engine;
    p.placement = placement;
    if (p.lazy) {
      // Canaries copy the first bytes of each registered piece and compare them
      // with what was there when they began: those pages must never change.
      std::lock_guard lock(p.stage_mu);
      const std::uint64_t piece = engine.arena().options().register_piece_bytes;
      for (std::uint64_t at = 0; at < len; at += piece) {
        // The canary's bytes may straddle a page boundary (any piece size): keep both pages.
        const std::uint64_t first = at / kPage * kPage;
        const std::uint64_t last = std::min(len - 1, at + kCanaryBytes - 1) / kPage * kPage;
        for (std::uint64_t page = first; page <= last; page += kPage) {
          if (!p.kept_pages.insert(page).second) continue;
          p.generate_in_place(page, std::min(page + kPage, len));
          p.add_resident(kPage);
        }
      }
      return {};  // the engine hashes each staged range on its first upload
    }
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
    read(i, 0, {b->data, p.tensors[i].bytes});
    blocks[i] = *b;
  }
  p.blocks = std::move(blocks);
  p.engine = &engine;
  p.placement = placement;
  return {};
}

Result<void> WeightBank::place_also(TransferEngine& engine) {
  Impl& p = *impl_;
  if (p.placement != BankPlacement::registered || p.lazy) {
    return make_error(ErrorCode::invalid_argument,
                      p.source + ": place_also needs a resident bank placed registered (this one is " +
                          (p.placement ? std::string(to_string(*p.placement)) : std::string("not placed")) +
                          (p.lazy ? ", lazy)" : ")"));
  }
  const auto known = [&](const auto& e) { return e.first == &engine; };
  if (&engine == p.engine || std::any_of(p.also.begin(), p.also.end(), known)) {
    return make_error(ErrorCode::invalid_argument, p.source + ": already placed with this engine");
  }
  auto [base, len] = p.whole();
  Result<RegionId> region = engine.register_immutable(base, len);
  if (!region.ok()) {
    Error e = std::move(region).error();
    e.message = p.source + ": registering " + std::to_string(len) + " bytes in place: " + e.message;
    return e;
  }
  p.also.emplace_back(&engine, *region);
  if (engine.policy() != IntegrityPolicy::verify) return {};
  for (std::size_t i = 0; i < p.tensors.size(); ++i) {
    if (p.tensors[i].bytes == 0) continue;
    FERRY_TRY(engine.precompute_hash(p.original(i).data(), p.tensors[i].bytes));
  }
  return {};
}

Result<StagedRange> WeightBank::stage(std::size_t index, std::uint64_t offset, std::uint64_t bytes) const {
  Impl& m = *impl_;  // the staging state changes under a const bank: its bytes do not
  if (!m.placement) return make_error(ErrorCode::invalid_argument, m.source + ": stage() before place()");
  if (index >= m.tensors.size()) {
    return make_error(ErrorCode::invalid_argument, m.source + ": no tensor " + std::to_string(index) + " (it has " +
                                                       std::to_string(m.tensors.size()) + ")");
  }
  const TensorInfo& t = m.tensors[index];
  if (bytes == 0 || offset > t.bytes || bytes > t.bytes - offset) {
    return make_error(ErrorCode::invalid_argument,
                      m.source + ": tensor \"" + t.name + "\" has " + std::to_string(t.bytes) + " bytes; cannot stage [" +
                          std::to_string(offset) + ", +" + std::to_string(bytes) + ")");
  }
  if (!m.lazy || *m.placement == BankPlacement::arena) return StagedRange{this->bytes(index).subspan(offset, bytes), 0};
  std::lock_guard lock(m.stage_mu);
  m.retire_staged();
  const std::uint64_t begin = t.offset + offset, end = begin + bytes;
  const std::span<const std::byte> span(m.buffer + begin, bytes);
  for (auto& [id, s] : m.staged) {
    // Present already (held, or released with transfers still reading it): share it.
    if (s.begin == begin && s.end == end) {
      ++s.holders;
      return StagedRange{span, id};
    }
  }
  // Generated under the lock: a partly overlapping staging may write the same
  // bytes, never different ones, so readers of it see no change.
  m.generate(index, offset, {m.buffer + begin, bytes});
  const std::uint64_t id = m.next_id++;
  m.staged.emplace(id, Impl::Staging{begin, end, 1, {}});
  m.add_resident(bytes);
  ++m.st.staged;
  m.st.generated_bytes += bytes;
  return StagedRange{span, id};
}

void WeightBank::release(const StagedRange& range, StreamPoint done) const {
  if (range.id == 0) return;
  Impl& m = *impl_;
  std::lock_guard lock(m.stage_mu);
  auto it = m.staged.find(range.id);
  if (it == m.staged.end() || it->second.holders == 0) return;  // unplaced since, or released twice
  --it->second.holders;
  it->second.readers.push_back(done);
  m.retire_staged();
}

void WeightBank::release(const StagedRange& range) const {
  if (range.id == 0) return;
  Impl& m = *impl_;
  std::lock_guard lock(m.stage_mu);
  auto it = m.staged.find(range.id);
  if (it == m.staged.end() || it->second.holders == 0) return;
  --it->second.holders;
  m.retire_staged();
}

BankStats WeightBank::stats() const {
  Impl& p = *impl_;
  std::lock_guard lock(p.stage_mu);
  if (p.placement) p.retire_staged();
  BankStats s = p.st;
  s.data_bytes = p.data_bytes;
  return s;
}

Result<void> WeightBank::unplace() { return impl_ ? impl_->unplace() : Result<void>(); }
bool WeightBank::placed() const noexcept { return impl_ && impl_->placement.has_value(); }
std::optional<BankPlacement> WeightBank::placement() const noexcept {
  return impl_ ? impl_->placement : std::nullopt;
}

}  // namespace ferry
