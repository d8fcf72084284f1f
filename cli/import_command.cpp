// `ferry import torch-snapshot SNAP.pickle`: a PyTorch memory snapshot's
// history as a ferry trace (docs/spec.md §3, "PyTorch memory snapshots").
#include <fstream>
#include <memory>
#include <ostream>
#include <string>

#include "common_options.hpp"
#include "subcommand.hpp"
#include "core/text.hpp"
#include "ferry/replay.hpp"
#include "ferry/torch_snapshot.hpp"

namespace ferry::cli {
namespace {

struct ImportArgs {
  std::string file;
  std::string out;  // empty: stdout
  int device = -1;  // -1: the device with the most entries
};

int run_import(const ImportArgs& args, const Io& io) {
  if (!args.out.empty()) {
    if (const std::string why = overwrite_refusal("-o", args.out, args.file, "the snapshot"); !why.empty()) {
      io.err << "ferry import: " << why << '\n';
      return kExitUsage;
    }
  }
  Result<std::string> bytes = read_trace_file(args.file);
  if (!bytes.ok()) {
    io.err << "ferry import: " << bytes.error().message << '\n';
    return bytes.error().code == ErrorCode::invalid_argument ? kExitUsage : kExitFailed;
  }
  Result<TorchSnapshotImport> imported = import_torch_snapshot(
      *bytes, args.file, args.device < 0 ? std::nullopt : std::optional<int>(args.device));
  if (!imported.ok()) {
    io.err << "ferry import: " << imported.error().message << '\n';
    return imported.error().code == ErrorCode::invalid_argument ? kExitUsage : kExitFailed;
  }
  const TorchSnapshotSource& s = imported->source;
  std::ostream& said = args.out.empty() ? io.err : io.out;  // the trace alone on stdout without -o
  if (args.out.empty()) {
    io.out << imported->trace;
  } else {
    std::ofstream f(args.out, std::ios::trunc | std::ios::binary);
    f << imported->trace;
    f.flush();
    if (!f) {
      io.err << "ferry import: -o: cannot write " << args.out << '\n';
      return kExitFailed;
    }
  }
  said << "imported " << args.file << ": device " << s.device << " of " << s.devices
       << (args.device < 0 ? " (the one with the most entries)" : "") << ", " << s.events << " events -> "
       << s.allocs + s.reconstructed_blocks << " allocs (" << s.reconstructed_blocks
       << " reconstructed: alive before the history began), " << s.frees << " frees ("
       << s.deferred_frees << " completed later than requested), " << s.streams << " streams\n"
       << "  PyTorch: peak requested " << text::human_bytes(s.peak_requested_bytes) << ", peak reserved "
       << text::human_bytes(s.peak_reserved_bytes) << ", " << s.segment_allocs << " segment allocs, " << s.ooms
       << " OOMs\n";
  if (!args.out.empty()) said << "  wrote " << args.out << '\n';
  return kExitOk;
}

}  // namespace

Subcommand add_import(CLI::App& parent) {
  auto args = std::make_shared<ImportArgs>();
  CLI::App* app = parent.add_subcommand("import", "Read another program's record as a ferry trace");
  app->require_subcommand(1);
  CLI::App* torch = app->add_subcommand(
      "torch-snapshot", "A PyTorch memory snapshot (torch.cuda.memory._dump_snapshot) as a ferry trace");
  add_trace_argument(*torch, "SNAP", args->file,
                     "The snapshot pickle (torch.cuda.memory._dump_snapshot; docs/spec.md §3)");
  torch->add_option("-o,--out", args->out, "Write the trace here (default: stdout; the summary then goes to stderr)");
  torch->add_option("--device", args->device, "The device whose history to import (default: the one with the most entries)")
      ->check(CLI::Range(0, 1 << 20));
  torch->footer(
      "The snapshot is read by a restricted unpickler that executes nothing: an opcode that names\n"
      "or calls a Python object is refused. `ferry replay`, `ferry snapshot` and\n"
      "`ferry bench fragmentation` take a snapshot directly, recognised by its content.\n"
      "Exit status: 0 imported; 1 the output could not be written; 2 a malformed or hostile\n"
      "snapshot (the message names the opcode and byte, or the entry and field), or bad usage.");
  return {app, [args](const Io& io) { return run_import(*args, io); }};
}

}  // namespace ferry::cli
