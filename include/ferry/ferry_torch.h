/* ferry — PyTorch's pluggable CUDA allocator over ferry's device pool
 * (libferry_torch.so). From Python:
 *
 *   torch.cuda.memory.change_current_allocator(torch.cuda.memory.CUDAPluggableAllocator(
 *       "libferry_torch.so", "ferry_torch_malloc", "ferry_torch_free"))
 *
 * or ferry.torch.use_ferry_allocator(), which finds the library. C11; compiles as
 * C and as C++; needs no CUDA header (a cudaStream_t is passed as void*).
 *
 * One ferry runtime per device (the cuda backend, BackendSpec{cuda, device}), made
 * on the first call for that device, by one thread while the others wait. It is
 * never destroyed: it lives until the process exits, since PyTorch may free
 * tensors after every static destructor, and the CUDA runtime's own teardown,
 * has run. A runtime that could not be made (no driver, no device) is not
 * retried: every later call for that device fails with the same message.
 *
 * Streams: each stream PyTorch passes is adopted by ferry on first sight
 * (docs/guide.md "Your streams"), so ferry's frees are ordered with PyTorch's
 * kernels on it. The NULL stream is CUDA's legacy default stream (PyTorch's
 * default); ferry adopts cudaStreamLegacy for it, not one of its own streams,
 * which are non-blocking and so would not be ordered after PyTorch's work there.
 *
 * Thread safety: every function, any thread. Nothing throws or aborts across
 * these functions. Each leaves the calling thread's current CUDA device as it found
 * it: freeing a cuda:1 tensor from a thread on cuda:0 stays on cuda:0. */
#ifndef FERRY_FERRY_TORCH_H
#define FERRY_FERRY_TORCH_H

#include <sys/types.h> /* ssize_t */

#include "ferry/ferry.h" /* ferry_pool_stats, FERRY_C_API */

#ifdef __cplusplus
extern "C" {
#endif

/* `size` bytes of device `device`, stream-ordered on `stream` (nullable: the
 * legacy default stream). Runs ferry's reclaim sequence (waiting, bounded, for
 * in-flight frees) before it gives up. Returns NULL when size <= 0 (with no
 * error) or on failure: then ferry_torch_last_error() says why (the pool's
 * out-of-memory diagnostic, no GPU, ...). May block (bounded) in the reclaim;
 * the first call for a device blocks while the device initializes. */
FERRY_C_API void* ferry_torch_malloc(ssize_t size, int device, void* stream);

/* Frees `ptr` (nullable: a no-op) from ferry_torch_malloc, stream-ordered on
 * `stream`: the block stays leased until every kernel enqueued on `stream` so far
 * has completed, then is reused or unmapped. `size` is not needed (ferry knows the
 * block's size). A pointer ferry_torch_malloc did not return is ignored, with a
 * message for ferry_torch_last_error(). Never blocks on the device. */
FERRY_C_API void ferry_torch_free(void* ptr, ssize_t size, int device, void* stream);

/* This thread's message of its last failed ferry_torch call; "" if none. Valid
 * until this thread's next ferry_torch call. Never NULL. */
FERRY_C_API const char* ferry_torch_last_error(void);

/* The pool statistics of `device` into the first `struct_size` bytes of *out, as
 * ferry_get_pool_stats_sized writes them: zeros when nothing was allocated on it
 * yet. Returns FERRY_OK, FERRY_ERROR_INVALID_ARGUMENT (NULL out, a negative
 * device, struct_size refused as ferry.h says), or the status that made the
 * device's runtime fail (its message in ferry_torch_last_error). Never blocks on
 * the device. */
FERRY_C_API int ferry_torch_get_stats_sized(int device, ferry_pool_stats* out, size_t struct_size);
/* As ferry_torch_get_stats_sized with out->struct_size as the size (0, as a
 * struct never set holds, is INVALID_ARGUMENT). In C and C++ the macro below
 * replaces the call with ferry_torch_get_stats_sized(device, out, sizeof *(out)),
 * so `ferry_pool_stats s; ferry_torch_get_stats(0, &s);` needs nothing set. */
FERRY_C_API int ferry_torch_get_stats(int device, ferry_pool_stats* out);
#define ferry_torch_get_stats(device, out) ferry_torch_get_stats_sized((device), (out), sizeof *(out))

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_TORCH_H */
