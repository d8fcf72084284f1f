// ferry — the one narrow interface every backend implements (sim, cuda).
//
// The pool, the arena, the transfer engine and the cache only ever talk to a
// device through this interface. It deals in raw device addresses; handles,
// leases and reuse rules live above it (see stream_order.hpp, device_pool.hpp).
//
// Thread safety: every method may be called from any host thread; a backend
// serializes internally. Methods that may block say so.
#pragma once

#include <chrono>
#include <memory>
#include <cstddef>
#include <optional>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/api.hpp"
#include "ferry/content.hpp"
#include "ferry/names.hpp"
#include "ferry/race.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry FERRY_API {

// The backends this project has. Their names ("sim", "cuda") live in one table.
enum class BackendKind : std::uint8_t { sim, cuda };
std::string_view to_string(BackendKind kind) noexcept;
Result<BackendKind> parse_backend_kind(std::string_view text);
std::span<const NamedValue<BackendKind>> backend_kinds() noexcept;

class Backend;

struct DeviceRange {
  std::uint64_t addr = 0;
  std::uint64_t bytes = 0;
};

// --- Operations a stream can carry. Host pointers must stay valid until the
// operation's ticket has completed (the host arena's leases guarantee it).

struct FillOp {  // device writes the pattern's values for `seed` into dst (content.hpp)
  DeviceRange dst;
  std::uint64_t seed = 0;
  Pattern pattern = Pattern::bytes;
};
struct CopyToDeviceOp {  // host -> device; src is pinned, registered or pageable
  DeviceRange dst;
  const std::byte* src = nullptr;
};
struct CopyToHostOp {  // device -> host
  std::byte* dst = nullptr;
  DeviceRange src;
};
struct CopyOnDeviceOp {  // device -> device, same length
  DeviceRange dst;
  std::uint64_t src_addr = 0;
};
// The link between two devices of one Runtime (devices.hpp): none (copies go
// through pinned host memory), PCIe peer-to-peer, or an NVLink-class link.
enum class PeerLink : std::uint8_t { none, pcie, nvlink };
// device -> device across devices: this stream's device copies dst.bytes from
// src_addr on `peer` (another device's backend, which must outlive the op) over
// `link` (pcie or nvlink). The source is not an operand of this device: whoever
// enqueues it orders the source's writes before it and keeps the source (I2)
// until the op completed. A backend without DeviceInfo::peer_copy refuses it.
struct PeerCopyOp {
  DeviceRange dst;
  Backend* peer = nullptr;
  std::uint64_t src_addr = 0;
  PeerLink link = PeerLink::pcie;
};
struct BatchCopyToDeviceOp {  // many host->device copies as one operation (one ticket)
  std::vector<CopyToDeviceOp> copies;
};
// A kernel that writes into `output` mix_kernel(inputs): a value that depends on
// every byte of every input (see content.hpp), in `pattern`. Every input is hashed
// before the output is written, so the output may overlap an input (an in-place
// epilogue). `flops` and `mem_bytes` are the modeled cost of the real operation
// it stands for (sim charges them against the profile; cuda ignores them).
struct ComputeOp {
  std::vector<DeviceRange> inputs;
  DeviceRange output;
  double flops = 0;
  std::uint64_t mem_bytes = 0;
  Pattern pattern = Pattern::bytes;
};
struct HashOp {  // device computes content_hash(src) and stores it at *result;
                 // *result must stay valid until the op's ticket completes
  DeviceRange src;
  std::uint64_t* result = nullptr;
};
struct WaitOp {  // this stream waits until `point` has completed (an event wait)
  StreamPoint point;
};
// This stream waits for a native event: one the program recorded on its own
// stream (cuda: cudaStreamWaitEvent when the op is dispatched, so the event's
// record at that moment counts), or one export_event() made (cuda and sim).
// `peer`: the backend whose export_event made `event` when that is another
// device's (a wait across devices, Runtime::order_after), which must outlive the
// op; null for this device's own events and the program's. cuda waits on any
// device's event; the sim finds the point through `peer`.
struct NativeWaitOp {
  NativeEvent event = nullptr;
  Backend* peer = nullptr;
};
// A program's own kernel (user_kernel.hpp says what `kernel` receives and may
// do). `flops` and `mem_bytes` are its modeled cost on sim (0 and 0: one pass
// over the operands), through the one cost model; cuda ignores them.
struct UserOperand {
  DeviceRange range;
  Access access = Access::read;
};
struct UserOp {
  std::vector<UserOperand> operands;
  UserKernel kernel;
  double flops = 0;
  std::uint64_t mem_bytes = 0;
  std::string tag;
};
struct NopOp {};

// A program's kernels, real matrix products among them (gemm.hpp), are UserOps:
// the core knows no kernel of its own beyond the content model's.
using Op = std::variant<FillOp, CopyToDeviceOp, CopyToHostOp, CopyOnDeviceOp, BatchCopyToDeviceOp, ComputeOp,
                        HashOp, WaitOp, NativeWaitOp, UserOp, NopOp, PeerCopyOp>;

struct DeviceInfo {
  BackendKind backend = BackendKind::sim;
  std::string device;        // profile name on sim, GPU name on cuda
  std::uint64_t capacity = 0;      // physical device memory, bytes
  // What one process may expect to get: on cuda the memory free when the backend
  // started minus a margin for contexts, libraries and scratch; 0 means `capacity`
  // (the sim). The pool's default capacity, and its ceiling without virtual memory
  // (one allocation of all of it must succeed).
  std::uint64_t available = 0;
  std::uint64_t granularity = 0;   // unit of map()/unmap(), a power of two
  bool virtual_memory = false;     // map/unmap of granules inside reserved ranges
  bool batched_copy = false;       // BatchCopyToDeviceOp is native (else unsupported: callers copy per range)
  bool host_register = false;      // register_host() pins existing ranges in place
  double h2d_bytes_per_s = 0;      // nominal host->device bandwidth (pinned)
  double mem_bytes_per_s = 0;      // nominal device memory bandwidth
  double flops_per_s = 0;          // nominal compute rate (bf16)
  bool modeled_time = false;       // the clock is virtual: durations are modeled, not measured
  // What a backend can do, asked by everything above src/backends instead of its
  // kind (tools/check-layers refuses a branch on BackendKind there). Known before a
  // device opens: capabilities_of (make_backend.hpp).
  bool host_visible = false;       // a kernel sees its operands' device bytes as host spans (KernelArg in/out)
  bool race_checking = false;      // BackendSpec::race_check is honoured (every operation and byte seen)
  bool fault_injection = false;    // BackendSpec::faults are injected
  bool lazy_host_ranges = false;   // a registered host range may stay unbacked until read (no driver pins it)
  bool peer_copy = false;          // PeerCopyOp runs (the sim: from another sim device of the process;
                                   // cuda: where the driver says another device's memory is reachable,
                                   // from a peer connect_peer opened)
  bool native_graphs = false;      // begin_graph / end_graph make a stream's ops one native graph, replayed
                                   // as one launch (cuda: a CUDA graph; the sim: when its spec asks)
  bool profiled = false;           // the device is a DeviceProfile the spec names (spec_profile): its capacity,
                                   // granule and latencies are known before it opens, and a run may scale them
};

// What a backend counted of the faults it injected or saw (all 0 on a real device,
// whose faults surface as backend_error instead).
struct FaultCounters {
  // Device operations that touched unmapped memory (the sim then fails from then
  // on, like a CUDA illegal address). A correct runtime keeps it 0.
  std::uint64_t illegal_accesses = 0;
  // Copies out of pinned memory that the injected pinned-noop fault swallowed.
  std::uint64_t swallowed_copies = 0;
  // Batched copies the device refused at enqueue, then issued one copy at a time
  // (cuda): the bytes arrive, the batched path did not run.
  std::uint64_t batch_fallbacks = 0;
  // Sim: map() calls that the injected fail-map fault failed.
  std::uint64_t failed_maps = 0;
  // Sim: peer copies that the injected peer-noop fault swallowed.
  std::uint64_t swallowed_peer_copies = 0;
};

// A stream's device work made one graph of the device's own (Backend::end_graph):
// `launch` is a user kernel (user_kernel.hpp) that replays every op of it on the
// stream it is given, as one launch (cuda: cudaGraphLaunch; the sim: the ops'
// effects on its operands' views, in order). Enqueue it as a UserOp whose operands
// cover every device range of the ops (read_write): that op's leases and order are
// the replay's. What the graph holds on the device is freed once the last copy of
// `launch` is gone and every launch of it has completed.
struct NativeGraph {
  UserKernel launch;
  std::uint64_t ops = 0;       // device ops in the graph
  double flops = 0;            // the ops' stated cost (op_contract.hpp), summed: the UserOp's
  std::uint64_t mem_bytes = 0;
};

struct HostMemoryStats {
  std::uint64_t pinned_allocs = 0;   // calls that pinned new memory in the driver
  std::uint64_t pinned_frees = 0;
  std::uint64_t pinned_bytes = 0;    // currently pinned by allocate_pinned
  std::uint64_t registrations = 0;
  std::uint64_t unregistrations = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual const DeviceInfo& info() const noexcept = 0;

  // --- Device address space. Addresses are never 0. reserve_address returns a
  // granule-aligned range with no physical memory behind it; map/unmap attach and
  // detach physical granules (addr and bytes granule-aligned). Without
  // virtual_memory a backend backs the whole reservation at reserve time and
  // map/unmap only account. map fails with out_of_memory when physical memory
  // is exhausted. unmap does not wait for in-flight work: callers unmap only what
  // the lease mechanism says is finished (I2).
  virtual Result<std::uint64_t> reserve_address(std::uint64_t bytes) = 0;
  virtual Result<void> release_address(std::uint64_t base, std::uint64_t bytes) = 0;
  virtual Result<void> map(std::uint64_t addr, std::uint64_t bytes) = 0;
  virtual Result<void> unmap(std::uint64_t addr, std::uint64_t bytes) = 0;
  virtual std::uint64_t mapped_bytes() const = 0;

  // --- Streams. Every backend gets these from one layer (holding_backend.hpp):
  // enqueue checks op against the one contract (op_contract.hpp), appends it to
  // `stream`'s host-side queue and returns its ticket (the previous ticket + 1).
  // Inside ferry every enqueue goes through StreamOrder::submit, whose ticket
  // prediction assumes no other enqueuer. Unless the stream is held, or the op
  // waits for held work, it is dispatched to the device at once. Never blocks on
  // device work. Errors: invalid_argument (bad stream or op: check_op's), unsupported
  // (an op this backend cannot run here: a batched copy without one), backend_error
  // (sticky device fault).
  virtual Result<Ticket> enqueue(StreamId stream, Op op) = 0;
  virtual Ticket submitted(StreamId stream) const = 0;  // last ticket handed out
  virtual Ticket completed(StreamId stream) = 0;        // last ticket completed; polls

  // Held streams keep new ops in the host-side queue (report 003's lazy dispatch).
  // set_hold(s, false) dispatches what the queue holds. An adopted stream is
  // never held (adopt_stream).
  virtual void set_hold(StreamId stream, bool hold) = 0;
  virtual bool held(StreamId stream) const = 0;
  // Dispatches what the host-side queues hold; the hold itself stays on.
  virtual Result<void> flush(StreamId stream) = 0;
  virtual Result<void> flush_all() = 0;

  // Blocks until `point` has completed. Dispatches held ops of that stream up to
  // the point first. Errors: timeout (after `timeout` of backend time, or at once
  // when the point waits for held work, which is named), backend_error (device
  // fault), or the stream's sticky fault when an op at or before the point failed
  // (a held op that failed when issued, a user kernel's own error).
  virtual Result<void> wait(StreamPoint point, std::chrono::nanoseconds timeout) = 0;
  // Flushes and waits for every stream. Blocks.
  virtual Result<void> synchronize() = 0;

  // --- Host memory.
  virtual Result<std::byte*> allocate_pinned(std::uint64_t bytes) = 0;
  virtual Result<void> free_pinned(std::byte* ptr) = 0;
  virtual Result<void> register_host(std::byte* ptr, std::uint64_t bytes) = 0;
  virtual Result<void> unregister_host(std::byte* ptr) = 0;
  virtual HostMemoryStats host_stats() const = 0;

  // --- Time: virtual nanoseconds on sim, steady-clock nanoseconds on cuda.
  virtual std::uint64_t now_ns() const = 0;
  // Lets `ns` of host time pass: a modeled clock moves forward (completing what
  // finishes by then); a real device's host thread sleeps. Blocks on a real device.
  virtual void advance(std::uint64_t ns);

  virtual FaultCounters fault_counters() const { return {}; }
  // The stream races found so far, when this backend checks for them (the sim
  // with race_check on); nullptr otherwise. Backends that share a checker
  // (join_race_checker) answer the same log, every device's races in it.
  virtual std::shared_ptr<const RaceLog> race_log() const { return nullptr; }
  // This backend becomes a further device of `first`'s race checker (a Runtime's
  // devices join device 0's as they are made), so that a race between the two
  // devices' work is found (vector clocks over every device's streams; a peer
  // copy's read of its source, a wait across devices). Call before this backend
  // enqueues anything. Backends without a checker ignore it. Errors:
  // invalid_argument (work enqueued already; one checks races and the other not).
  // Never blocks.
  virtual Result<void> join_race_checker(Backend& first) {
    (void)first;
    return {};
  }
  // This device is about to copy from `peer` (another device of the same
  // Runtime: its PeerCopyOps will name it): where the device's driver says the
  // two reach each other, makes `peer`'s memory readable here and answers the
  // pair's link (none: they do not reach each other, so copies between them go
  // through host memory). std::nullopt: this backend has no driver to ask (a
  // modeled device; the sim's links are DevicesOptions::links). Runtime::create
  // calls it once per ordered pair of its devices, once all are built, and asks
  // no one else (Runtime::link_between). Errors: backend_error (the driver says
  // the pair reach each other, then refuses to open the access). Blocks while
  // the driver opens the access.
  virtual Result<std::optional<PeerLink>> connect_peer(Backend& peer) {
    (void)peer;
    return std::optional<PeerLink>();
  }
  // The host is about to read or write host bytes [ptr, ptr + bytes) that device
  // operations may use (the arena hands a block to the program): a race checker
  // checks it against those operations. Others ignore it. Never blocks.
  virtual void note_host_access(const std::byte* ptr, std::uint64_t bytes, Access access) {
    (void)ptr, (void)bytes, (void)access;
  }
  // Device bytes [addr, addr + bytes) are now the pool block `handle`, named `tag`
  // (empty: unnamed): a race checker names the block in its reports, and tells a
  // reuse of the bytes by another allocation. Others ignore it. Never blocks.
  virtual void note_block(std::uint64_t addr, std::uint64_t bytes, const DeviceHandle& handle,
                          std::string_view tag) {
    (void)addr, (void)bytes, (void)handle, (void)tag;
  }

  // --- Native graphs (DeviceInfo::native_graphs). begin_graph(s): from now on
  // the device work enqueued on `s` (every op but waits) is kept for a graph
  // instead of run; each such op still gets its ticket, carried by a no-op in
  // its place, so its leases retire as always. Waits run as always (the order
  // they give is the launch's to give again). end_graph(s) stops that and makes
  // the kept ops one graph. Errors: unsupported (no native graphs; an op the
  // device cannot put in a graph, named: host memory, a batched copy, a peer
  // copy, a hash), invalid_argument (bad stream; begin: s keeps ops already;
  // end: s keeps none or no op was kept), backend_error. Whatever end_graph
  // answers, `s` runs its ops again. Only one thread may enqueue on `s` between
  // the two calls. Never block on device work.
  virtual Result<void> begin_graph(StreamId stream);
  virtual Result<NativeGraph> end_graph(StreamId stream);

  // The backend that runs the ops: this one, or for an adaptor (forwarding_backend.hpp)
  // the one at the end of its chain. A backend layer reaches its own backend's
  // extras through it (cuda's cuBLAS handles for the GEMM user op, gemm.hpp).
  virtual Backend& innermost() noexcept { return *this; }

  // --- Native streams and events: the program's own work beside ferry's
  // (docs/guide.md "Your streams"). Every backend gets these from the hold layer.
  //
  // The native stream behind ferry stream `stream` (made on first use), for the
  // program to enqueue its own work on; ferry keeps owning it. Work the program
  // enqueues there directly is ordered with ferry's only while the stream is not
  // held (held ferry ops are dispatched later, after it). Errors: invalid_argument
  // (bad stream), backend_error.
  virtual Result<NativeStream> native_stream(StreamId stream) = 0;
  // Gives the program's own native stream (e.g. PyTorch's current stream) a
  // StreamId: ferry ops on it are enqueued on `native` itself, in order with the
  // program's work there. ferry never destroys it, and never holds it: set_hold on
  // an adopted stream does nothing (a held op would run after the program's later
  // work). The id is the first one from kFirstAdoptedStream up to
  // kLastAdoptedStream, then below kFirstAdoptedStream, that no ferry work has used. Errors:
  // invalid_argument (null, one of ferry's own streams, or adopted already: the
  // message names its id), out_of_memory (every id is in use), backend_error.
  virtual Result<StreamId> adopt_stream(NativeStream native) = 0;
  // Waits (bounded by `timeout`) until every ticket of the adopted stream has
  // completed, then forgets `native`; the id becomes a plain ferry stream again.
  // Errors: invalid_argument (not adopted), timeout (work still runs or waits for
  // held work: the stream stays adopted), backend_error.
  virtual Result<void> release_stream(StreamId stream, std::chrono::nanoseconds timeout) = 0;
  // A native event that completes when `point` has, for a program's stream to wait
  // on (cudaStreamWaitEvent) or a NativeWaitOp. Dispatches held work of the
  // point's stream up to it, as wait() does. Valid until release_event. Errors:
  // invalid_argument (a point not handed out), timeout (the point waits for held
  // work on another stream, which is named), backend_error.
  virtual Result<NativeEvent> export_event(StreamPoint point) = 0;
  // Errors: invalid_argument (not an event export_event made, released already,
  // or still waited on by a NativeWaitOp in a host-side queue).
  virtual Result<void> release_event(NativeEvent event) = 0;
};

}  // namespace ferry
