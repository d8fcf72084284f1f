// ferry — a program's own kernel as a stream operation: what it declares, what it
// receives, and what it may do (docs/guide.md "Your kernels").
//
// A user operation (UserOp in backend.hpp; enqueue_user in user_op.hpp builds one
// from pool handles) names its device operands, each marked read, write or
// read-write, and a callable. The backend calls the callable once per operation:
//
//   * cuda: when the operation is dispatched to the device — after any hold on its
//     stream is released (report 003's lazy queue) — with the native stream to
//     enqueue its own kernels on and the operands' device addresses. ferry records
//     the operation's completion event after the callable returns, so the ticket
//     completes when everything the callable enqueued has.
//   * sim: when the operation completes in virtual time, with host views of the
//     operands' bytes: `in` for what it may read, `out` (writable, holding the
//     current bytes) for what it may write. What it writes into `out` lands in
//     device memory when it returns ok, operand by operand in declaration order.
//     So a program runs its host reference of its kernel in ferry's deterministic
//     model.
//
// What a callable may and may not do. It runs on whichever host thread dispatches
// (cuda) or completes (sim) the operation, with the backend's internal lock held
// (and, on cuda, the hold layer's): it must not call any ferry function on any
// stream (it would deadlock or reorder: such a call returns invalid_argument,
// see refuse_inside_user_kernel), must not block on device work
// (cudaStreamSynchronize, cudaDeviceSynchronize, cudaMalloc may), must enqueue
// work only on `stream`, and must not touch device memory outside its operands.
// It may launch kernels and async copies on `stream`, call cuBLAS bound to it, and
// read or write `out`/`in` (sim). Its views are valid only during the call.
//
// Failure is a value: a callable returns Result<void>. An error (or an exception,
// which is caught) becomes the operation's error and a sticky fault of its stream:
// every Backend::wait on that ticket or a later one of the stream returns it. The
// ticket still completes, so the operands' leases retire (StreamOrder::wait, which
// answers "has it completed?" for leases, reports completion, not the fault). On
// sim nothing it wrote lands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "ferry/api.hpp"
#include "ferry/result.hpp"
#include "ferry/stream.hpp"

namespace ferry FERRY_API {

// How an operation touches an operand (the race checker reads these marks).
enum class Access : std::uint8_t { read, write, read_write };
std::string_view to_string(Access access) noexcept;  // "read", "write", "read_write"
inline bool reads(Access a) noexcept { return a != Access::write; }
inline bool writes(Access a) noexcept { return a != Access::read; }

// One operand as the callable sees it.
struct KernelArg {
  std::uint64_t addr = 0;   // device address
  std::uint64_t bytes = 0;
  Access access = Access::read;
  std::span<const std::byte> in;  // sim, readable operands: the bytes; empty on cuda
  std::span<std::byte> out;       // sim, writable operands: writable bytes; empty on cuda
};

struct KernelLaunch {
  NativeStream stream = nullptr;     // cudaStream_t on cuda; nullptr on sim
  std::span<const KernelArg> args;   // the operands, in declaration order
  StreamPoint point;                 // this operation's stream and ticket
  std::string_view tag;              // the caller's name for the operation
};

using UserKernel = std::function<Result<void>(const KernelLaunch&)>;

// Calls `kernel`, turning an exception into backend_error and naming the
// operation in a failure's message; the calling thread is inside a user kernel
// meanwhile. For backends.
Result<void> call_user_kernel(const UserKernel& kernel, const KernelLaunch& launch) noexcept;

// True on a thread while it runs a user kernel's callable.
bool inside_user_kernel() noexcept;
// The refusal of a ferry call made from inside a user kernel (it would deadlock
// on the lock the kernel runs under): invalid_argument naming `call` and the rule;
// ok on any other thread. Every public entry point that may block or enqueue
// (the backend's hold layer, DevicePool, Runtime, the C ABI) asks it first.
Result<void> refuse_inside_user_kernel(std::string_view call);

}  // namespace ferry
