// Fuzzes the restricted unpickler and the snapshot import (import::unpickle,
// import_torch_snapshot) with the whole input as a file's bytes. Beyond "no
// crash, no sanitizer report": a refusal is invalid_argument naming the file; the
// tree stays within a small multiple of the input; an accepted snapshot's trace
// is one the replay parser accepts, and its figures are consistent.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/torch_snapshot.hpp"
#include "import/pickle.hpp"
#include "replay/trace.hpp"

#include "fuzz_input.hpp"

namespace {

[[noreturn]] void finding(const std::string& what) { ferry_fuzz::finding("fuzz_snapshot", what); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  ferry::Result<ferry::import::Tree> tree = ferry::import::unpickle(bytes);
  if (tree.ok()) {
    // Bounded memory: 8-byte items, 16-byte containers and 12-byte chunks, each
    // at most one per input byte, plus vector growth.
    if (tree->tree_bytes() > 96 * size + 4096) finding("the tree outgrew the input: " + std::to_string(tree->tree_bytes()));
  } else if (tree.error().code != ferry::ErrorCode::invalid_argument || tree.error().message.empty()) {
    finding("an unpickle refusal that is not invalid_argument: " + tree.error().message);
  }
  ferry::Result<ferry::TorchSnapshotImport> imported = ferry::import_torch_snapshot(bytes, "fuzz.pickle");
  if (!imported.ok()) {
    if (imported.error().code != ferry::ErrorCode::invalid_argument ||
        imported.error().message.rfind("fuzz.pickle: ", 0) != 0) {
      finding("a refusal that is not invalid_argument naming the file: " + imported.error().message);
    }
    return 0;
  }
  if (!tree.ok()) finding("an import accepted what the unpickler refused");
  const ferry::TorchSnapshotSource& s = imported->source;
  if (s.frees > s.allocs + s.reconstructed_blocks) finding("more frees than blocks");
  if (s.allocs + s.frees + s.ooms + s.segment_allocs > s.events) finding("more counted entries than events");
  ferry::Result<ferry::replay::Trace> trace = ferry::replay::parse_trace(imported->trace, "fuzz.jsonl");
  if (!trace.ok()) finding("the imported trace does not parse: " + trace.error().message);
  return 0;
}
