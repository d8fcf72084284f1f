// ferry — your own work on pool memory: a program's kernel as a stream operation
// (enqueue_user), and work ferry did not enqueue holding blocks (record_use).
//
// Both lease their blocks through StreamOrder::submit like every other operation
// (I2): a user op held in a host-side queue holds its operands, and a block freed
// meanwhile is not reused until the op has completed. user_kernel.hpp says what
// the kernel receives and may do. Thread safety: like the pool's, any thread; both
// calls never block on the device.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/device_pool.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"
#include "ferry/user_kernel.hpp"

namespace ferry FERRY_API {

// `bytes` of an Operand meaning "from `offset` to the end of the block".
inline constexpr std::uint64_t kRestOfBlock = UINT64_MAX;

// Bytes [offset, offset + bytes) of a pool block, and how the kernel touches them.
struct Operand {
  DeviceHandle handle;
  Access access = Access::read;
  std::uint64_t offset = 0;
  std::uint64_t bytes = kRestOfBlock;
};

// The device bytes [offset, offset + bytes) of a block of `span` (kRestOfBlock:
// to its end): the one rule of an operand's range. Errors: invalid_argument when
// the range leaves the block or is empty (offset at the block's end with
// kRestOfBlock); the message starts with `what`.
Result<DeviceRange> operand_range(const DeviceSpan& span, std::uint64_t offset, std::uint64_t bytes,
                                  std::string_view what);

// The modeled cost of a kernel on sim (cost_model.hpp); 0 and 0: one pass over
// its operands at memory bandwidth.
struct UserCost {
  double flops = 0;
  std::uint64_t mem_bytes = 0;
};

// Enqueues `kernel` on `stream` over `operands`, ordered after the point where
// each block became its allocation's (DevicePool::make_ready). Returns its ticket.
// Errors, all before anything is enqueued for the op: stale_handle (a freed,
// foreign or forged operand), invalid_argument (a range outside its block, an
// empty kernel, negative or non-finite flops, a bad stream), backend_error.
// A kernel that fails later is the op's error, returned by waits (user_kernel.hpp).
Result<Ticket> enqueue_user(DevicePool& pool, StreamId stream, std::span<const Operand> operands,
                            UserKernel kernel, UserCost cost = {}, std::string tag = {});

// PyTorch's record_stream, checked: every block of `handles` stays leased until
// everything enqueued on `stream` so far has completed — ferry's work and the
// program's own on the stream's native handle (native_stream, adopt_stream) —
// so a free() meanwhile does not let another stream reuse it early. Enqueues one
// no-op on `stream` that carries the leases; returns its ticket. It does not
// order `stream` after the blocks' earlier users: for the program's own work on a
// block allocated on another stream, call DevicePool::make_ready first.
// Errors: stale_handle (a freed or foreign handle; nothing is enqueued),
// invalid_argument (bad stream), backend_error.
Result<Ticket> record_use(DevicePool& pool, StreamId stream, std::span<const DeviceHandle> handles);

}  // namespace ferry
