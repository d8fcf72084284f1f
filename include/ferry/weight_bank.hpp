// ferry — weight banks: named, immutable tensors in host memory, the source of
// every weight upload the offload cache and the workloads make.
//
// A bank comes from a safetensors file (read whole into one page-aligned host
// buffer when opened: a run uploads every tensor, and a memory mapping of a file
// truncated under the run would kill the process with SIGBUS, against I7) or is
// generated deterministically (a seeded pattern per tensor) when no file is
// given. Either way a tensor's bytes are a fixed value while the bank lives, so
// content hashes are computed once per tensor (hash()) and, once the bank is
// placed with a transfer engine, once per tensor by the engine too.
//
// Synthetic storage:
//   resident  every tensor generated into one host buffer when the bank is made
//   lazy      no tensor is held: a tensor's bytes are generated when an upload
//             stages them (stage()) and dropped once that upload's transfers
//             completed, so host memory follows what is in flight, not the
//             model's size (a 141 GB device modeled on a small host). hash()
//             and read() generate the bytes they need in small pieces. Placed
//             `registered`, the bank's address range (reserved, unbacked) is
//             registered with TransferEngine::register_generated; the engine
//             hashes each staged range on its first upload. Sim only: a real
//             driver pins the pages it registers, so they could neither stay
//             unbacked nor be dropped (place() says unsupported). The first page
//             of every registered piece (HostArena's register_piece_bytes) is
//             generated at place() and kept: canaries read it and need constant
//             bytes.
//
// safetensors layout (https://github.com/huggingface/safetensors):
//   bytes [0, 8)       N, the header length, little-endian u64
//   bytes [8, 8+N)     JSON: {"NAME": {"dtype": "BF16", "shape": [..],
//                      "data_offsets": [BEGIN, END]}, ..., "__metadata__": {str: str}}
//   bytes [8+N, EOF)   the data section; offsets are relative to its start
// Validation (every failure is invalid_argument naming the file and the byte
// offset or tensor; nothing a file says can crash the process, I7):
//   file shorter than 8 bytes; N past the end of the file or above 100 MiB;
//   header not a JSON object (or nested deeper than 64 levels); an entry without
//   a string dtype, an array shape of unsigned integers, or data_offsets of two
//   unsigned integers; unknown dtype; END < BEGIN; END past the data section;
//   END - BEGIN != prod(shape) * dtype size (checked for overflow); two tensors
//   whose byte ranges overlap; __metadata__ not an object of strings.
// Decided here: gaps between tensors and bytes after the last one are allowed
// (ignored); unknown keys inside an entry are ignored; duplicate JSON keys keep
// the last entry (the JSON library's behaviour).
//
// Placement: place() makes the bytes uploadable at pinned speed —
//   registered  the bank's own buffer (the file's bytes, or the synthetic ones) is
//               registered in place with TransferEngine::register_immutable;
//               nothing is copied, hashes are computed once by the engine
//   arena       each tensor is copied into its own HostArena block (pinned
//               chunks); the bank's buffer stays as the reference copy
// After place(), bytes() returns the placed bytes (the arena copy, or the
// registered range itself); stage() returns what an upload must name (for a
// resident or arena-placed bank, those bytes; for a lazy registered bank, the
// range generated in place) and release() says when the upload is over.
//
// Once opened, the bank no longer reads the file: it may change or go away. A
// moved-from WeightBank may only be destroyed or assigned to.
//
// Thread safety: a WeightBank may be read (tensors, find, bytes, hash, read,
// stage, release, stats) from any number of threads at once; hash() computes
// under a per-bank mutex the first time, stage()/release() share the staging
// mutex. place()/unplace()/move/destruction need exclusive access. unplace() and
// the destructor block (bounded) until no transfer still reads the bank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/content.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

class TransferEngine;

// safetensors dtypes (spelled as in the format: "BF16", "F32", "I8", ...).
enum class DType : std::uint8_t {
  boolean, u8, i8, f8_e4m3, f8_e5m2, i16, u16, f16, bf16, i32, u32, f32, i64, u64, f64,
};

std::string_view to_string(DType dtype) noexcept;
std::uint64_t dtype_size(DType dtype) noexcept;
// Errors: invalid_argument naming the text and the accepted names.
Result<DType> parse_dtype(std::string_view text);

struct TensorInfo {
  std::string name;
  DType dtype = DType::u8;
  std::vector<std::uint64_t> shape;
  std::uint64_t offset = 0;  // byte offset in the bank's data (the data section for a file)
  std::uint64_t bytes = 0;   // prod(shape) * dtype_size(dtype)
};

// "[4096, 2560]"
std::string shape_text(std::span<const std::uint64_t> shape);

// One tensor of a synthetic bank: its bytes are fill_with(pattern, seed).
struct SyntheticTensor {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<std::uint64_t> shape;
  std::uint64_t seed = 0;
  Pattern pattern = Pattern::bytes;
};

// How a synthetic bank holds its bytes (see "Synthetic storage" above).
enum class SyntheticStorage : std::uint8_t { resident, lazy };

// One range of a placed bank made present for an upload by WeightBank::stage().
struct StagedRange {
  std::span<const std::byte> bytes;  // what the TransferPlan names
  std::uint64_t id = 0;              // the bank's record of it; 0: nothing to release
};

// What a bank holds in host memory.
struct BankStats {
  std::uint64_t data_bytes = 0;  // sum of tensor bytes
  // Host bytes holding tensor data: a resident bank's whole buffer; a lazy
  // bank's staged ranges not yet dropped plus the kept pages (see above). A
  // dropped range may leave its two partial edge pages behind (not counted).
  std::uint64_t resident_bytes = 0, peak_resident_bytes = 0;
  std::uint64_t staged = 0;           // stage() calls that generated bytes
  std::uint64_t generated_bytes = 0;  // bytes stage() generated (lazy)
  std::uint64_t dropped = 0;          // staged ranges whose pages were dropped
};

enum class BankPlacement : std::uint8_t { registered, arena };
std::string_view to_string(BankPlacement placement) noexcept;
Result<BankPlacement> parse_bank_placement(std::string_view text);

class WeightBank {
 public:
  // Reads the file at `path` whole (core/input_file.hpp: never blocks on a FIFO,
  // refuses what is not a regular file) and validates its header (see above).
  // Errors: invalid_argument (cannot open, not a regular file, a read error or a
  // file that shrank while read, or malformed: the message names the file and
  // the offset or tensor); out_of_memory (no host memory to hold it).
  static Result<WeightBank> open_safetensors(const std::string& path);

  // Validates `file` (the whole content of a safetensors file held in memory) and
  // returns its tensors; `name` stands for the file in messages. The function
  // open_safetensors uses, exposed so malformed inputs can be tested without files.
  static Result<std::vector<TensorInfo>> parse_safetensors(std::span<const std::byte> file,
                                                           std::string_view name,
                                                           std::map<std::string, std::string>* metadata = nullptr);

  // A bank holding `tensors`, each filled with its pattern, laid out at
  // 256-byte aligned offsets in one page-aligned buffer (lazy: an address range
  // reserved without memory). Deterministic: lazy and resident banks of the same
  // tensors hold the same bytes at the same offsets.
  // Errors: invalid_argument (empty or duplicate name, size overflow), out_of_memory.
  static Result<WeightBank> synthetic(std::span<const SyntheticTensor> tensors,
                                      std::string name = "synthetic",
                                      SyntheticStorage storage = SyntheticStorage::resident);

  WeightBank(WeightBank&&) noexcept;
  WeightBank& operator=(WeightBank&&) noexcept;
  ~WeightBank();  // unplaces first (blocks, bounded)

  // The file path, or the synthetic bank's name.
  const std::string& source() const noexcept;
  bool from_file() const noexcept;
  std::span<const TensorInfo> tensors() const noexcept;
  std::optional<std::size_t> find(std::string_view name) const;
  // The tensor `name` with exactly this dtype and shape. Errors: invalid_argument
  // naming the source, the tensor and what differs (missing, dtype, shape).
  Result<std::size_t> require(std::string_view name, DType dtype,
                              std::span<const std::uint64_t> shape) const;
  const std::map<std::string, std::string>& metadata() const noexcept;
  std::uint64_t data_bytes() const noexcept;  // sum of tensor bytes

  bool lazy() const noexcept;

  // The tensor's bytes: the placed copy once placed, else the bank's buffer.
  // A lazy bank holds none: empty unless placed `arena`.
  // Precondition: index < tensors().size().
  std::span<const std::byte> bytes(std::size_t index) const noexcept;
  // The tensor's content_hash, computed on first call and cached.
  std::uint64_t hash(std::size_t index) const;
  // content_hash of bytes [offset, offset + bytes) of the tensor (not cached).
  // Precondition: the range lies inside the tensor.
  std::uint64_t hash(std::size_t index, std::uint64_t offset, std::uint64_t bytes) const;
  // Copies bytes [offset, offset + out.size()) of the tensor into `out`
  // (generated for a lazy bank). Precondition: the range lies inside the tensor.
  void read(std::size_t index, std::uint64_t offset, std::span<std::byte> out) const;

  // The source of one upload of bytes [offset, offset + bytes) of the tensor:
  // the placed bytes in place (id 0), or, for a lazy registered bank, the range
  // generated in place now (already present when another staging holds it).
  // Keep it until the upload finished, then release() it, once: a staging shared
  // by several stage() calls counts its holders, so a second release of one
  // result takes another holder's away.
  // Errors: invalid_argument (not placed, no such tensor, range outside the
  // tensor or empty). Never blocks on the device; generates the range under the
  // bank's staging mutex (time proportional to it), so stagers take turns.
  Result<StagedRange> stage(std::size_t index, std::uint64_t offset, std::uint64_t bytes) const;
  // Ends a staging: its pages are dropped once `done` (the point after which
  // every transfer that read it completed, e.g. TransferReceipt::done) has
  // completed, found without waiting at later stage(), release() and stats()
  // calls, and at unplace() at the latest. The overload without a point: no
  // transfer read it. A staging never released stays until unplace(). id 0: no-op.
  void release(const StagedRange& range, StreamPoint done) const;
  void release(const StagedRange& range) const;
  BankStats stats() const;

  // Makes the bytes uploadable through `engine` (see Placement above; a lazy
  // bank placed `arena` generates every tensor into its block now). The engine
  // must outlive the placement. Errors: invalid_argument (already placed),
  // unsupported (a lazy bank registered off the sim), what register_immutable /
  // register_generated / HostArena::allocate say (nothing stays placed on
  // error). Never blocks on the device.
  Result<void> place(TransferEngine& engine, BankPlacement placement);
  // Registers a bank placed `registered` with another device's engine too (a
  // Runtime over several devices), so its uploads there read pinned memory and
  // verify against hashes computed once, as on the first. A lazy bank cannot:
  // its stagings are released on the first engine's streams. The engine must
  // outlive the placement. Errors: invalid_argument (not placed `registered`,
  // lazy, this engine already), what register_immutable / precompute_hash say.
  // Never blocks on the device.
  Result<void> place_also(TransferEngine& engine);
  // Undoes place() and place_also(): waits (bounded) until no transfer reads the
  // bank, then unregisters or frees the arena blocks. No-op when not placed. Blocks.
  Result<void> unplace();
  bool placed() const noexcept;
  std::optional<BankPlacement> placement() const noexcept;

 private:
  struct Impl;
  explicit WeightBank(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One tensor to write: data.size() must equal prod(shape) * dtype_size(dtype).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::u8;
  std::vector<std::uint64_t> shape;
  std::span<const std::byte> data;
};

// Writes a safetensors file (tensors in the given order, header padded with
// spaces to a multiple of 8 bytes). Errors: invalid_argument (size mismatch,
// empty or duplicate name, "__metadata__" as a tensor name, unwritable path).
Result<void> write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                               const std::map<std::string, std::string>& metadata = {});
// Writes every tensor of `bank` (its current bytes; a lazy bank's generated) and its metadata.
Result<void> write_safetensors(const std::string& path, const WeightBank& bank);

}  // namespace ferry
