/* ferry — the C ABI: ferry from C, Rust (FFI), Python (ctypes) and anything else
 * that calls C. C11; compiles as C and as C++; no C++ type crosses it.
 *
 * Conventions, for every function below:
 *   - The result is a ferry_status. FERRY_OK is 0; on any other status the
 *     outputs are untouched and ferry_last_error() holds this thread's message.
 *   - Nothing aborts or throws: a NULL where none is allowed, a bad stream, a zero
 *     or absurd size is FERRY_ERROR_INVALID_ARGUMENT (or OUT_OF_MEMORY for a size
 *     the device can never hold), never a crash. Each pointer is marked
 *     FERRY_NULLABLE or FERRY_NONNULL (clang's _Nullable/_Nonnull, which clang
 *     checks at the call; empty elsewhere); a NULL passed for a FERRY_NONNULL one
 *     is still refused with INVALID_ARGUMENT at run time.
 *   - Every function lists the statuses it returns besides FERRY_OK; any function
 *     that returns a status may also return OUT_OF_MEMORY (host memory ran out)
 *     and BACKEND (an internal error), and every function taking a ferry_runtime
 *     returns INVALID_ARGUMENT for a NULL one or when called from inside a launch
 *     function (ferry_launch_fn).
 *   - Structs that grow carry their size: ferry_runtime_options and the three
 *     stats structs start with `struct_size`, the sizeof the struct the caller
 *     was compiled with. In C and C++ the caller need not set it:
 *     ferry_runtime_options_init and the stats getters are macros that pass
 *     sizeof to their ..._sized function, so `ferry_pool_stats s;
 *     ferry_get_pool_stats(rt, &s);` is right as written, and the getter sets
 *     s.struct_size. Fields are only ever added at the end, so a program built
 *     against an older header keeps working with a newer library: ferry reads
 *     and writes only the caller's prefix (and a newer caller's fields this
 *     library lacks must be 0). A size below the first release's
 *     (FERRY_*_V1_SIZE), over 4096 or not a multiple of 8 is INVALID_ARGUMENT.
 *     Bindings (Python's ctypes, Rust) call the ..._sized functions with their
 *     mirror's size, checked at load against ferry_struct_size. The stats
 *     getters under the macros' names stay exported and read out->struct_size
 *     (0, as a struct never set holds, is INVALID_ARGUMENT); in C,
 *     `(ferry_get_pool_stats)(rt, &s)` calls one.
 *     ferry_race grows the same way, as the elements of ferry_get_races_sized's
 *     array (the size an argument). The other structs (ferry_handle,
 *     ferry_operand, ferry_launch_context, and ferry_race_side, twice inside
 *     ferry_race) never change: a new field means a new struct and a new function.
 *   - Thread safety: a ferry_runtime may be used from any thread at once, except
 *     ferry_runtime_destroy, which must not race with any other call on it.
 *     ferry_last_error is per thread.
 *   - Blocking: said per function. "Never blocks" means it does not wait for
 *     device work (it may take a short internal lock).
 *   - Streams are 0..63. Handles are values: a freed, foreign or forged handle
 *     is FERRY_ERROR_STALE_HANDLE, never another allocation's memory.
 *
 * docs/guide.md shows a program in C; docs/spec.md states the guarantees. */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>

/* FERRY_VERSION_MAJOR, _MINOR, _PATCH and _STRING: the header's version,
 * configured from CMakeLists.txt's project(VERSION). */
#include "ferry/version.h"

#if defined(_WIN32)
#define FERRY_C_API
#else
#define FERRY_C_API __attribute__((visibility("default")))
#endif

#if defined(__clang__)
#define FERRY_NULLABLE _Nullable
#define FERRY_NONNULL _Nonnull
/* The specifiers are a clang extension; -pedantic says so at every use. */
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wnullability-extension"
#else
#define FERRY_NULLABLE
#define FERRY_NONNULL
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ferry_status {
  FERRY_OK = 0,
  FERRY_ERROR_OUT_OF_MEMORY = 1,
  FERRY_ERROR_STALE_HANDLE = 2,
  FERRY_ERROR_INVALID_ARGUMENT = 3,
  FERRY_ERROR_TRANSFER_CORRUPT = 4,
  FERRY_ERROR_BACKEND = 5,
  FERRY_ERROR_UNSUPPORTED = 6,
  FERRY_ERROR_TIMEOUT = 7
} ferry_status;

typedef struct ferry_runtime_s* ferry_runtime;
typedef struct ferry_handle {
  uint32_t pool, slot, generation; /* {0,0,0} is the null handle */
} ferry_handle;

/* The library's version, "MAJOR.MINOR.PATCH": FERRY_VERSION_STRING as the library
 * was built (may differ from the header the caller was compiled with). Never fails. */
FERRY_C_API const char* FERRY_NONNULL ferry_version(void);
/* The name of a status ("ok", "out_of_memory", ...; "unknown" for any other int).
 * Never fails. */
FERRY_C_API const char* FERRY_NONNULL ferry_status_name(ferry_status status);
/* This thread's message of its last failed call; "" if none. Valid until this
 * thread's next ferry call. Never fails. */
FERRY_C_API const char* FERRY_NONNULL ferry_last_error(void);
/* sizeof the struct named `name` ("ferry_runtime_options", "ferry_pool_stats",
 * ... every struct of this header) as this library was built; 0 for a NULL or
 * unknown name. For bindings that mirror the structs (Python's ctypes, Rust) to
 * check their mirrors when they load the library. Never fails. */
FERRY_C_API size_t ferry_struct_size(const char* FERRY_NULLABLE name);

/* ---- A runtime: backend, stream order, pool, pinned arena, transfer engine and,
 * when cache_slots > 0, an offload cache. */
typedef struct ferry_runtime_options {
  size_t struct_size;     /* sizeof(ferry_runtime_options) as the caller was built: set by ferry_runtime_options_init */
  const char* FERRY_NULLABLE backend;   /* "sim" (default when NULL) or "cuda" */
  const char* FERRY_NULLABLE profile;   /* sim device profile: "h200" (default), "rtx4090", "rtx3090", "tiny" */
  uint64_t capacity;      /* pool capacity in bytes; 0 = the device's */
  uint64_t seed;          /* sim seed */
  const char* FERRY_NULLABLE integrity; /* "off" | "probe" | "verify" (default when NULL) */
  const char* FERRY_NULLABLE inject;    /* sim fault spec as the CLI's --inject */
  uint32_t cache_slots;   /* offload cache slots; 0 = no cache */
  uint64_t cache_slot_bytes; /* 0: the largest entry defined before the first fill */
  /* ---- v1 ends here; a shorter caller gets the defaults for what follows. */
  int race_check;         /* sim: 1 reports stream races (ferry_get_races); cuda refuses it */
  /* How many devices (ferry_device_*, below): 0 or 1 = one. Device i is the sim
   * profile `profile` with seed + i, or cuda ordinal i. 64 bits wide so that the
   * struct grows: the 4 bytes after race_check are padding an older caller never set. */
  uint64_t device_count;
  /* sim: the links between devices, "A-B:KIND" pairs separated by commas, KIND
   * pcie or nvlink (e.g. "0-1:nvlink"); NULL or "": none, so peer copies go
   * through pinned host memory. nvlink needs a profile that has it (h200). */
  const char* FERRY_NULLABLE links;
} ferry_runtime_options;
/* The first release's ferry_runtime_options: the smallest struct_size accepted. */
#define FERRY_RUNTIME_OPTIONS_V1_SIZE offsetof(ferry_runtime_options, race_check)

/* Fills the first `struct_size` bytes of *options with the defaults and sets
 * options->struct_size to the bytes filled (the smaller of struct_size and this
 * library's sizeof). Errors: INVALID_ARGUMENT (NULL options, or a struct_size
 * refused as the conventions say: nothing is written). Never blocks. */
FERRY_C_API ferry_status ferry_runtime_options_init_sized(ferry_runtime_options* FERRY_NULLABLE options,
                                                          size_t struct_size);
/* Fills *options, as large as this library's own ferry_runtime_options, with the
 * defaults: for a binding that checked ferry_struct_size. Does nothing for NULL.
 * Never fails. In C and C++ the macro below replaces the call with
 * ferry_runtime_options_init_sized(options, sizeof(ferry_runtime_options)), the
 * size the caller was compiled with. */
FERRY_C_API void ferry_runtime_options_init(ferry_runtime_options* FERRY_NULLABLE options);
#define ferry_runtime_options_init(options) ferry_runtime_options_init_sized((options), sizeof(ferry_runtime_options))
/* options: nullable (the defaults). On success *out is a runtime to destroy.
 * Errors: INVALID_ARGUMENT (NULL out; options->struct_size refused as the
 * conventions say; unknown backend, profile, integrity or fault spec; faults asked
 * of cuda; links malformed, naming a device beyond device_count or a pair twice,
 * nvlink on a profile without one, links on cuda), UNSUPPORTED (cuda without a device or driver, or asked for
 * race_check; a newer caller's field this library does not know, set to other
 * than zero), BACKEND. Blocks while the device initializes (bounded). */
FERRY_C_API ferry_status ferry_runtime_create(const ferry_runtime_options* FERRY_NULLABLE options,
                                              ferry_runtime FERRY_NULLABLE* FERRY_NONNULL out);
/* rt: nullable (a no-op). Waits for the runtime's work, then frees everything. Blocks. */
FERRY_C_API void ferry_runtime_destroy(ferry_runtime FERRY_NULLABLE rt);

/* ---- Device memory (the pool). */
/* Errors: INVALID_ARGUMENT (0 bytes, bad stream), OUT_OF_MEMORY (after the reclaim
 * sequence; the message carries the pool's diagnostic, whose cause says when the
 * request is larger than the whole capacity). May block (bounded) in
 * the reclaim, waiting for in-flight frees. */
FERRY_C_API ferry_status ferry_alloc(ferry_runtime FERRY_NONNULL rt, uint64_t bytes, uint32_t stream, ferry_handle* FERRY_NONNULL out);
/* Stream-ordered: legal with work in flight. Errors: STALE_HANDLE. Never blocks. */
FERRY_C_API ferry_status ferry_free(ferry_runtime FERRY_NONNULL rt, ferry_handle h);
/* The block's device address and requested size (either output nullable). The
 * address is for the program's own kernels; it carries no lease (ferry_launch
 * and ferry_record_use do). Errors: STALE_HANDLE. Never blocks. */
FERRY_C_API ferry_status ferry_device_address(ferry_runtime FERRY_NONNULL rt, ferry_handle h, uint64_t* FERRY_NULLABLE addr,
                                              uint64_t* FERRY_NULLABLE bytes);
/* Names the block for diagnostics: the race reports (ferry_get_races) carry `tag`
 * (copied; NULL clears it) for it. Errors: STALE_HANDLE. Never blocks. */
FERRY_C_API ferry_status ferry_set_tag(ferry_runtime FERRY_NONNULL rt, ferry_handle h, const char* FERRY_NULLABLE tag);
/* Releases cached device memory and completed frees. Errors: only the
 * conventions' (NULL rt, a call from a launch function). Never blocks. */
FERRY_C_API ferry_status ferry_trim(ferry_runtime FERRY_NONNULL rt);

/* ---- Transfers, under the runtime's integrity policy. */
/* Host -> device: `bytes` from src into dst at dst_offset. Under verify, returns
 * once the device hash matched (retrying another path on a mismatch); src may be
 * reused on return. Errors: INVALID_ARGUMENT (0 bytes, range outside the block),
 * STALE_HANDLE, TRANSFER_CORRUPT (never verified), TIMEOUT, BACKEND. Blocks. */
FERRY_C_API ferry_status ferry_upload(ferry_runtime FERRY_NONNULL rt, uint32_t stream, ferry_handle dst, uint64_t dst_offset,
                                      const void* FERRY_NONNULL src, uint64_t bytes);
/* Device -> host; blocks until the bytes are in dst. Errors as ferry_upload, and
 * the sticky fault of `stream` (a failed launch ordered before the copy): the
 * status the launch function returned, never the stale bytes as a success. */
FERRY_C_API ferry_status ferry_download(ferry_runtime FERRY_NONNULL rt, uint32_t stream, ferry_handle src, uint64_t src_offset,
                                        void* FERRY_NONNULL dst, uint64_t bytes);

/* ---- The program's own kernels. */
enum { FERRY_READ = 1, FERRY_WRITE = 2, FERRY_READ_WRITE = 3 };
typedef struct ferry_operand {
  ferry_handle handle;
  uint64_t offset;
  uint64_t bytes; /* 0: from offset to the end of the block, which must hold at least 1 byte */
  uint32_t access; /* FERRY_READ, FERRY_WRITE or FERRY_READ_WRITE */
} ferry_operand;
typedef struct ferry_launch_context {
  void* FERRY_NULLABLE native_stream; /* cudaStream_t on cuda, NULL on sim */
  uint32_t operand_count;
  const uint64_t* FERRY_NONNULL device_addresses; /* per operand */
  const uint64_t* FERRY_NONNULL bytes;            /* per operand */
  void* FERRY_NONNULL const* FERRY_NULLABLE host_views; /* sim: the operands' bytes (write only where marked); NULL on cuda */
} ferry_launch_context;
/* Runs when the op is dispatched (cuda: enqueue your kernels on native_stream)
 * or completes (sim: compute on host_views). Return FERRY_OK, or a status that
 * becomes the op's error and a sticky fault of its stream (reported by every
 * later wait on the stream, ferry_download and ferry_synchronize included: the
 * pre-kernel bytes never download as a success). It runs under ferry's internal
 * lock: it must not call ferry (every entry point called from it returns
 * INVALID_ARGUMENT naming the rule; ferry_runtime_destroy does nothing), must not
 * block on the device, and must touch only its operands. The context is valid
 * during the call only. */
typedef ferry_status (*ferry_launch_fn)(const ferry_launch_context* FERRY_NONNULL ctx, void* FERRY_NULLABLE user_data);
/* Enqueues fn over the operands on `stream`, leasing them until it completes
 * (a held launch holds its blocks). operands: nullable when operand_count is 0;
 * user_data: nullable, passed through, must stay valid until the op ran.
 * flops, mem_bytes: the modeled cost on sim. Errors: STALE_HANDLE,
 * INVALID_ARGUMENT (NULL fn, bad access, range outside a block, bad stream).
 * Never blocks. */
FERRY_C_API ferry_status ferry_launch(ferry_runtime FERRY_NONNULL rt, uint32_t stream,
                                      const ferry_operand* FERRY_NULLABLE operands, uint32_t operand_count,
                                      ferry_launch_fn FERRY_NONNULL fn, void* FERRY_NULLABLE user_data, double flops,
                                      uint64_t mem_bytes);
/* PyTorch's record_stream, checked: the blocks stay leased until everything
 * enqueued on `stream` so far has completed, the program's own native work
 * included. handles: nullable when count is 0. Errors: STALE_HANDLE (nothing is
 * recorded), INVALID_ARGUMENT (bad stream). Never blocks. */
FERRY_C_API ferry_status ferry_record_use(ferry_runtime FERRY_NONNULL rt, uint32_t stream,
                                          const ferry_handle* FERRY_NULLABLE handles,
                                          uint32_t count);

/* ---- Streams. */
/* Stream `stream` waits for everything enqueued on `for_stream` so far: an event
 * recorded there, waited on by `stream` (recorded as the trace's `wait` while
 * tracing). Errors: INVALID_ARGUMENT (bad stream), BACKEND. Never blocks. */
FERRY_C_API ferry_status ferry_stream_wait(ferry_runtime FERRY_NONNULL rt, uint32_t stream, uint32_t for_stream);
/* 1: hold (new work waits in a host-side queue); 0: release and dispatch. An
 * adopted stream is never held: hold does nothing there. Errors: INVALID_ARGUMENT
 * (bad stream). Never blocks. */
FERRY_C_API ferry_status ferry_hold(ferry_runtime FERRY_NONNULL rt, uint32_t stream, int hold);
/* Dispatches held work and waits for every stream. Errors: the first sticky
 * stream fault (a failed launch), BACKEND, TIMEOUT. Blocks. */
FERRY_C_API ferry_status ferry_synchronize(ferry_runtime FERRY_NONNULL rt);
/* The native stream behind ferry stream `stream` (cudaStream_t on cuda, an
 * opaque token on sim). Errors: INVALID_ARGUMENT (NULL out, bad stream), BACKEND
 * (cuda: the stream could not be created). Never blocks. */
FERRY_C_API ferry_status ferry_native_stream(ferry_runtime FERRY_NONNULL rt, uint32_t stream,
                                             void* FERRY_NULLABLE* FERRY_NONNULL out);
/* A stream id for the program's own native stream (never destroyed or held by
 * ferry). Errors: INVALID_ARGUMENT (NULL, adopted already, one of ferry's own). */
FERRY_C_API ferry_status ferry_adopt_stream(ferry_runtime FERRY_NONNULL rt, void* FERRY_NONNULL native,
                                            uint32_t* FERRY_NONNULL out);
/* Waits (up to timeout_ms) for the adopted stream's work, then forgets it.
 * Errors: INVALID_ARGUMENT (not adopted), TIMEOUT. Blocks. */
FERRY_C_API ferry_status ferry_release_stream(ferry_runtime FERRY_NONNULL rt, uint32_t stream, uint64_t timeout_ms);

/* ---- Statistics. */
/* Each getter writes the first `struct_size` bytes of *out (the caller's sizeof,
 * which the macro of the getter's name passes) and sets out->struct_size to the
 * bytes it wrote (the smaller of struct_size and this library's sizeof); *out
 * need not be initialised. Fields are only ever added at the end.
 * allocs and frees count the program's blocks (ferry_alloc, ferry_free);
 * internal_allocs and internal_frees ferry's own buffers that never hold program
 * data (the transfer engine's probe and canary scratch), whose bytes count in
 * the byte figures as any block's. */
typedef struct ferry_pool_stats {
  size_t struct_size;
  uint64_t allocated_bytes, peak_allocated_bytes, reserved_bytes, peak_reserved_bytes,
      pending_free_bytes, allocs, frees, ooms, reclaims;
  /* ---- v1 ends here */
  uint64_t internal_allocs, internal_frees;
} ferry_pool_stats;
#define FERRY_POOL_STATS_V1_SIZE offsetof(ferry_pool_stats, internal_allocs)
/* Errors: INVALID_ARGUMENT (NULL out; struct_size refused as the conventions
 * say: *out is untouched). Never blocks. */
FERRY_C_API ferry_status ferry_get_pool_stats_sized(ferry_runtime FERRY_NONNULL rt,
                                                    ferry_pool_stats* FERRY_NONNULL out, size_t struct_size);
/* As ferry_get_pool_stats_sized with out->struct_size as the size (0, as a
 * struct never set holds, is INVALID_ARGUMENT). In C and C++ the macro below
 * replaces the call with ferry_get_pool_stats_sized(rt, out, sizeof *(out)). */
FERRY_C_API ferry_status ferry_get_pool_stats(ferry_runtime FERRY_NONNULL rt, ferry_pool_stats* FERRY_NONNULL out);
#define ferry_get_pool_stats(rt, out) ferry_get_pool_stats_sized((rt), (out), sizeof *(out))
typedef struct ferry_integrity_stats {
  size_t struct_size;
  uint64_t bytes_moved, bytes_verified, mismatches, retries, fallbacks;
} ferry_integrity_stats;
#define FERRY_INTEGRITY_STATS_V1_SIZE sizeof(ferry_integrity_stats)
/* Errors: as ferry_get_pool_stats_sized. Never blocks. */
FERRY_C_API ferry_status ferry_get_integrity_stats_sized(ferry_runtime FERRY_NONNULL rt,
                                                         ferry_integrity_stats* FERRY_NONNULL out,
                                                         size_t struct_size);
/* The size from out->struct_size, as ferry_get_pool_stats; the macro passes sizeof *(out). */
FERRY_C_API ferry_status ferry_get_integrity_stats(ferry_runtime FERRY_NONNULL rt,
                                                   ferry_integrity_stats* FERRY_NONNULL out);
#define ferry_get_integrity_stats(rt, out) ferry_get_integrity_stats_sized((rt), (out), sizeof *(out))
/* PyTorch's memory_summary, as text: writes at most `capacity` bytes including
 * the NUL into buf (nullable when capacity is 0) and the full length, without
 * the NUL, into *length (nullable). Errors: INVALID_ARGUMENT (NULL buf with
 * capacity > 0). Never blocks. */
FERRY_C_API ferry_status ferry_memory_summary(ferry_runtime FERRY_NONNULL rt, char* FERRY_NULLABLE buf, size_t capacity,
                                              size_t* FERRY_NULLABLE length);

/* ---- Stream races (sim with race_check): two accesses to overlapping device bytes
 * from different streams, at least one a write, with no happens-before between them. */
typedef struct ferry_race_side {
  uint32_t stream;
  uint64_t ticket;
  const char* FERRY_NONNULL kind; /* the operation: "fill", "copy_to_device", "user", ... */
  const char* FERRY_NONNULL tag;  /* a C++ user op's tag; "" for ferry_launch, which has none */
  uint32_t access;  /* FERRY_READ, FERRY_WRITE or FERRY_READ_WRITE */
  ferry_handle block;    /* the pool block the bytes were when this side touched them; null: none */
  const char* FERRY_NONNULL block_tag; /* its ferry_set_tag name; "" when unnamed */
} ferry_race_side;
typedef struct ferry_race {
  ferry_race_side earlier, later;
  uint64_t addr, bytes; /* the overlapping device bytes */
  int reuse; /* 1: the sides' blocks differ: the bytes were freed and handed out again
              * while the earlier side's work could still run (allocator reuse) */
  /* ---- v1 ends here (earlier_device lies in v1's padding) */
  /* The device of each side's operation (RaceAccess::device; a peer copy's read
   * of its source is the destination device's operation, on the source's bytes). */
  uint32_t earlier_device, later_device;
} ferry_race;
#define FERRY_RACE_V1_SIZE offsetof(ferry_race, later_device)
/* Copies up to `capacity` of the races kept (the first 64) into out (nullable when
 * capacity is 0), each element `struct_size` bytes apart (the caller's
 * sizeof(ferry_race): ferry writes that prefix of each); *kept (nullable): how
 * many were copied; *total (nullable): every race found. The strings stay valid
 * while rt lives.
 * Errors: UNSUPPORTED (the runtime does not check races), INVALID_ARGUMENT
 * (NULL out with capacity > 0; a struct_size as ferry_get_pool_stats_sized
 * refuses). Never blocks. */
FERRY_C_API ferry_status ferry_get_races_sized(ferry_runtime FERRY_NONNULL rt, ferry_race* FERRY_NULLABLE out,
                                               uint32_t capacity, size_t struct_size, uint32_t* FERRY_NULLABLE kept,
                                               uint64_t* FERRY_NULLABLE total);
/* As ferry_get_races_sized with FERRY_RACE_V1_SIZE (the first release's
 * elements); the macro replaces the call with ferry_get_races_sized(..., sizeof(ferry_race), ...)
 * (out may be NULL). */
FERRY_C_API ferry_status ferry_get_races(ferry_runtime FERRY_NONNULL rt, ferry_race* FERRY_NULLABLE out,
                                         uint32_t capacity, uint32_t* FERRY_NULLABLE kept,
                                         uint64_t* FERRY_NULLABLE total);
#define ferry_get_races(rt, out, capacity, kept, total) \
  ferry_get_races_sized((rt), (out), (capacity), sizeof(ferry_race), (kept), (total))

/* ---- The offload cache (ferry_runtime_options.cache_slots > 0). */
/* Declares entry `key` as `count` host pieces, uploaded back to back into one
 * slot. The bytes must stay valid and unchanged while the runtime lives.
 * Errors: INVALID_ARGUMENT (no cache, duplicate key, no or empty piece). */
FERRY_C_API ferry_status ferry_cache_define(ferry_runtime FERRY_NONNULL rt, uint64_t key,
                                            const void* FERRY_NULLABLE const* FERRY_NULLABLE pieces,
                                            const uint64_t* FERRY_NULLABLE piece_bytes, uint32_t count);
/* Makes `key` resident, orders `stream` after its upload and pins it. *slot is
 * its block; piece i lies at offsets[i] (offsets nullable; else it has room for
 * the entry's count). *hit (nullable): 1 when no fetch was needed. Errors:
 * INVALID_ARGUMENT, OUT_OF_MEMORY (every slot pinned), TRANSFER_CORRUPT. Blocks. */
FERRY_C_API ferry_status ferry_cache_acquire(ferry_runtime FERRY_NONNULL rt, uint64_t key, uint32_t stream,
                                             ferry_handle* FERRY_NONNULL slot, uint64_t* FERRY_NULLABLE offsets,
                                             int* FERRY_NULLABLE hit);
/* Unpins one acquire. Work already enqueued keeps its own lease. Errors:
 * INVALID_ARGUMENT (no cache; `key` is not pinned). Never blocks. */
FERRY_C_API ferry_status ferry_cache_release(ferry_runtime FERRY_NONNULL rt, uint64_t key);
typedef struct ferry_cache_stats {
  size_t struct_size; /* as ferry_pool_stats's */
  uint64_t hits, misses, evictions, uploads, bytes_uploaded, prefetches;
} ferry_cache_stats;
#define FERRY_CACHE_STATS_V1_SIZE sizeof(ferry_cache_stats)
/* Writes as ferry_get_pool_stats_sized. Errors: INVALID_ARGUMENT (no cache; NULL
 * out; struct_size refused as the conventions say). Never blocks. */
FERRY_C_API ferry_status ferry_get_cache_stats_sized(ferry_runtime FERRY_NONNULL rt,
                                                     ferry_cache_stats* FERRY_NONNULL out, size_t struct_size);
/* The size from out->struct_size, as ferry_get_pool_stats; the macro passes sizeof *(out). */
FERRY_C_API ferry_status ferry_get_cache_stats(ferry_runtime FERRY_NONNULL rt, ferry_cache_stats* FERRY_NONNULL out);
#define ferry_get_cache_stats(rt, out) ferry_get_cache_stats_sized((rt), (out), sizeof *(out))

/* ---- Trace recording: from ferry_trace_start until ferry_trace_stop, the pool
 * calls above (alloc, free, upload, download, hold, synchronize, trim) and
 * ferry_fill, ferry_compute and ferry_copy_to_host (below) are written
 * to `path` in the replay format (docs/spec.md §3; `ferry replay FILE`). Blocks
 * live at start are recorded first, as allocs marked "existing". Graph capture
 * (below) is recorded as the program made it: the calls on a capturing stream
 * between `capture` begin and end lines, each ferry_graph_launch as a `replay`
 * line, ferry_graph_destroy as a `capture` destroy line. The file is
 * opened without blocking and its first lines are written and flushed before the
 * call returns. Errors: INVALID_ARGUMENT (already recording; a stream is
 * capturing: the calls its capture recorded so far were not seen, so it could
 * not be written; the path cannot be opened, is not a regular file — a FIFO,
 * /dev/full — or cannot be written), UNSUPPORTED (the runtime has several devices:
 * the recorder writes device 0's calls only, so the other devices' calls, waits
 * across devices and peer copies would be missing). Never waits behind other
 * threads' calls. */
FERRY_C_API ferry_status ferry_trace_start(ferry_runtime FERRY_NONNULL rt, const char* FERRY_NONNULL path);
/* Flushes and closes the trace, once the calls that were recording when it was
 * called have returned (never later ones). Errors: INVALID_ARGUMENT (not
 * recording), BACKEND (a write failed). */
FERRY_C_API ferry_status ferry_trace_stop(ferry_runtime FERRY_NONNULL rt);

/* ---- PyTorch memory snapshots (docs/spec.md §3): the `size` bytes of a
 * torch.cuda.memory._dump_snapshot pickle, read by a restricted unpickler that
 * executes nothing, written to `out_path` as a ferry trace. device < 0: the
 * device with the most entries. The report's `source` object, as JSON, goes to
 * `source_json` like ferry_memory_summary's text (at most `capacity` bytes
 * including the NUL; nullable when capacity is 0) with its full length in
 * *length (nullable). No runtime is needed. Errors: INVALID_ARGUMENT (not a
 * snapshot, a refused opcode, a malformed entry: the message names the opcode
 * and byte, or the entry and field; a NULL `bytes` with size > 0 or a NULL
 * out_path), BACKEND (out_path cannot be written), OUT_OF_MEMORY. */
FERRY_C_API ferry_status ferry_import_torch_snapshot(const void* FERRY_NULLABLE bytes, size_t size, int device,
                                                     const char* FERRY_NONNULL out_path,
                                                     char* FERRY_NULLABLE source_json, size_t capacity,
                                                     size_t* FERRY_NULLABLE length);

/* ---- Graph capture (ferry/graph.hpp): a stream's work recorded once and
 * replayed many times, over memory that stays the graph's while it lives.
 * Between ferry_begin_capture and ferry_end_capture the calls on `stream`
 * (ferry_launch, ferry_record_use, ferry_upload under integrity "off",
 * ferry_copy_peer within device 0 unless under "verify", ferry_alloc and
 * ferry_free, ferry_fill, ferry_compute and ferry_copy_to_host) are recorded,
 * not run; what cannot be captured (ferry_upload under
 * "probe" or "verify", ferry_download, ferry_synchronize, ferry_hold,
 * ferry_stream_wait across streams, ferry_copy_peer across devices, an
 * allocation that would need the reclaim ladder) returns INVALID_ARGUMENT
 * naming the call and why, and
 * spoils the capture. Blocks allocated on the capturing stream are the graph's
 * private pool: a ferry_free of one is deferred until the pool's last graph is
 * destroyed, and a later ferry_alloc of a capture of the same pool that fits
 * reuses it (the same size whole, else a part of it, best fit). A graph must be destroyed before its runtime. A captured
 * ferry_upload reads the caller's bytes again at every launch (the call keeps
 * the pointer, not a copy): they must stay valid and unchanged while the graph
 * lives. A captured ferry_launch's callback and user data, and a captured
 * ferry_copy_to_host's dst, must stay valid until the graph is destroyed and its
 * last replay ran: ferry_graph_destroy does not wait for replays in flight (a
 * ferry_synchronize after it does). */
typedef struct ferry_graph_s* ferry_graph;
/* Starts recording `stream`. share_pool_of: nullable; a graph whose private pool
 * the capture allocates from (PyTorch's pool=), or NULL for a pool of its own.
 * Errors: INVALID_ARGUMENT (bad stream, capturing already, a pool another
 * capture is using). Never blocks. */
FERRY_C_API ferry_status ferry_begin_capture(ferry_runtime FERRY_NONNULL rt, uint32_t stream,
                                             ferry_graph FERRY_NULLABLE share_pool_of);
/* Ends the capture on `stream` and stores the graph in *out (NULL on error).
 * Errors: INVALID_ARGUMENT (not capturing; the capture's first refused call,
 * named after "spoiled: "), OUT_OF_MEMORY (host). Never blocks. */
FERRY_C_API ferry_status ferry_end_capture(ferry_runtime FERRY_NONNULL rt, uint32_t stream,
                                           ferry_graph FERRY_NULLABLE* FERRY_NONNULL out);
/* Enqueues the graph's calls on `stream`, in order (one native graph launch
 * where the device makes them, ferry/graph.hpp); every block it touches is
 * leased until this replay completes. Errors: STALE_HANDLE (a block of the graph
 * was freed outside it: nothing is enqueued), INVALID_ARGUMENT (another runtime's
 * graph, bad or capturing stream), what a recorded call's enqueue returns. Never
 * blocks. */
FERRY_C_API ferry_status ferry_graph_launch(ferry_runtime FERRY_NONNULL rt, ferry_graph FERRY_NONNULL graph,
                                            uint32_t stream);
/* Destroys the graph (NULL: does nothing, FERRY_OK); when it was its pool's last,
 * the blocks the program freed are freed, stream-ordered after its last replay.
 * Errors: STALE_HANDLE (a pool block freed behind its back; the rest are freed
 * and the graph is gone all the same). Never blocks. */
FERRY_C_API ferry_status ferry_graph_destroy(ferry_graph FERRY_NULLABLE graph);

/* ---- Several devices (docs/scale.md). The calls above act on device 0; a
 * handle names its device's pool, so a handle of device 1 given to them is
 * STALE_HANDLE (the message names both devices). The calls below take any
 * device's handle; on device 0 they are the calls above (a capture records
 * them, a trace writes them). */
/* The runtime's device count in *out. Errors: INVALID_ARGUMENT (NULL out). Never blocks. */
FERRY_C_API ferry_status ferry_device_count(ferry_runtime FERRY_NONNULL rt, uint32_t* FERRY_NONNULL out);
/* The link between devices a and b, in *out: on the sim as ferry_runtime_options.links
 * set it, on cuda as the driver reports it (links must be NULL or "" there):
 * "none", "pcie" or "nvlink" (a static string; "none" for a == b). A linked pair's
 * ferry_copy_peer copies device to device over the link; an unlinked pair's go
 * through pinned host memory. Errors: INVALID_ARGUMENT (a device beyond the
 * count, NULL out). Never blocks. */
FERRY_C_API ferry_status ferry_device_link(ferry_runtime FERRY_NONNULL rt, uint32_t a, uint32_t b,
                                           const char* FERRY_NULLABLE* FERRY_NONNULL out);
/* The device whose pool the live handle `h` names, in *out. Errors: STALE_HANDLE
 * (live in no device's pool), INVALID_ARGUMENT (NULL out). Never blocks. */
FERRY_C_API ferry_status ferry_device_of(ferry_runtime FERRY_NONNULL rt, ferry_handle h, uint32_t* FERRY_NONNULL out);
/* ferry_device_address of a handle of any device: its device, address and
 * requested bytes (each out nullable). Errors: STALE_HANDLE. Never blocks. */
FERRY_C_API ferry_status ferry_device_block(ferry_runtime FERRY_NONNULL rt, ferry_handle h, uint32_t* FERRY_NULLABLE device,
                                            uint64_t* FERRY_NULLABLE addr, uint64_t* FERRY_NULLABLE bytes);
/* ferry_alloc on device `device`. Errors: those of ferry_alloc; INVALID_ARGUMENT
 * (no such device). May block (bounded) in the reclaim. */
FERRY_C_API ferry_status ferry_device_alloc(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint64_t bytes,
                                            uint32_t stream, ferry_handle* FERRY_NONNULL out);
/* ferry_free of a handle of any device. Errors: STALE_HANDLE. Never blocks. */
FERRY_C_API ferry_status ferry_device_free(ferry_runtime FERRY_NONNULL rt, ferry_handle h);
/* ferry_upload / ferry_download on the device the handle names, on that device's
 * `stream`. Errors and blocking as theirs. */
FERRY_C_API ferry_status ferry_device_upload(ferry_runtime FERRY_NONNULL rt, uint32_t stream, ferry_handle dst,
                                             uint64_t dst_offset, const void* FERRY_NONNULL src, uint64_t bytes);
FERRY_C_API ferry_status ferry_device_download(ferry_runtime FERRY_NONNULL rt, uint32_t stream, ferry_handle src,
                                               uint64_t src_offset, void* FERRY_NONNULL dst, uint64_t bytes);
/* Copies `bytes` of src (from src_offset) to dst (at dst_offset), on whichever
 * devices they name: within one device a device-to-device copy; between two
 * linked devices (ferry_device_link) a device-to-device copy over the link, between
 * two others through pinned host memory, each leg under the integrity policy
 * (verify: the destination's device hash equals the source's; a mismatch retries
 * another path, a direct copy caught wrong is redone through the host). *verified (nullable) is 1 when verify checked it. Errors: INVALID_ARGUMENT
 * (0 bytes, a range outside its block, bad stream), STALE_HANDLE, OUT_OF_MEMORY,
 * TRANSFER_CORRUPT, TIMEOUT, BACKEND. Blocks (bounded) while the staged source leg,
 * or a direct copy's two hashes, complete; a direct copy under "off" blocks on nothing
 * (the source's stream waits across devices for it, leasing the source). */
FERRY_C_API ferry_status ferry_copy_peer(ferry_runtime FERRY_NONNULL rt, ferry_handle dst, uint64_t dst_offset,
                                         ferry_handle src, uint64_t src_offset, uint64_t bytes, uint32_t stream,
                                         int* FERRY_NULLABLE verified);
/* Stream `stream` of device `device` waits for everything enqueued on `for_stream`
 * of device `for_device` so far, without the host: an event of that device waited
 * on by the stream (ferry_stream_wait when both are one device). Nothing is
 * enqueued when that work has completed. Held work of `for_stream` is dispatched.
 * Errors: INVALID_ARGUMENT (no such device, named; bad stream), TIMEOUT (the work
 * waits for held work of another stream), BACKEND. Never blocks on device work. */
FERRY_C_API ferry_status ferry_device_stream_wait(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                                  uint32_t for_device, uint32_t for_stream);
/* The stream calls above on device `device`'s streams and blocks: each as the
 * call of the same name without "device_" (device 0 is that call itself, traced
 * and captured as it is; another device's calls are neither), its handles of
 * that device (another's is STALE_HANDLE naming both). Errors: theirs, and
 * INVALID_ARGUMENT (no such device, named). Blocking: theirs. */
FERRY_C_API ferry_status ferry_device_launch(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                             const ferry_operand* FERRY_NULLABLE operands, uint32_t operand_count,
                                             ferry_launch_fn FERRY_NONNULL fn, void* FERRY_NULLABLE user_data,
                                             double flops, uint64_t mem_bytes);
FERRY_C_API ferry_status ferry_device_record_use(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                                 const ferry_handle* FERRY_NULLABLE handles, uint32_t count);
FERRY_C_API ferry_status ferry_device_hold(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream, int hold);
/* Dispatches device `device`'s held work and waits for every stream of it (the
 * other devices' work is not waited for). */
FERRY_C_API ferry_status ferry_device_synchronize(ferry_runtime FERRY_NONNULL rt, uint32_t device);
FERRY_C_API ferry_status ferry_device_native_stream(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                                    void* FERRY_NULLABLE* FERRY_NONNULL out);
/* Device `device`'s pool and transfer engine figures, as the getters without
 * "device_" (struct_size as they take it). */
FERRY_C_API ferry_status ferry_device_get_pool_stats_sized(ferry_runtime FERRY_NONNULL rt, uint32_t device,
                                                           ferry_pool_stats* FERRY_NONNULL out, size_t struct_size);
FERRY_C_API ferry_status ferry_device_get_integrity_stats_sized(ferry_runtime FERRY_NONNULL rt, uint32_t device,
                                                                ferry_integrity_stats* FERRY_NONNULL out,
                                                                size_t struct_size);

/* ---- ferry's own device work (ferry/pool_calls.hpp): a fill, a compute and an
 * asynchronous copy to the host, enqueued on `stream` and leasing their blocks
 * until they complete (I2). They go through the runtime's calls as the calls
 * above do: a trace writes them (fill, compute, check lines) and a capturing
 * stream records them (replayed at each ferry_graph_launch). None verifies
 * (no integrity policy applies: nothing crosses the host link inward). */
/* Writes the deterministic pattern of `seed` (the replay format's `fill`) into
 * the whole block. Errors: STALE_HANDLE, INVALID_ARGUMENT (bad stream). Never
 * blocks. */
FERRY_C_API ferry_status ferry_fill(ferry_runtime FERRY_NONNULL rt, uint32_t stream, ferry_handle dst, uint64_t seed);
/* A kernel that writes into the whole of `output` a value that depends on every
 * byte of every input (the replay format's `compute`); flops, mem_bytes: its
 * modeled cost on sim. inputs: nullable when input_count is 0. Errors:
 * STALE_HANDLE (an input or the output), INVALID_ARGUMENT (NULL inputs with a
 * count, bad stream). Never blocks. */
FERRY_C_API ferry_status ferry_compute(ferry_runtime FERRY_NONNULL rt, uint32_t stream,
                                       const ferry_handle* FERRY_NULLABLE inputs, uint32_t input_count,
                                       ferry_handle output, double flops, uint64_t mem_bytes);
/* Device -> host without a host wait: the block's bytes (its requested size,
 * ferry_device_address) are written to the first of dst's `bytes` when the op
 * completes, not by the call: read them after a ferry_synchronize, whose error
 * (a failed launch ordered before the copy: its stream's sticky fault) says they
 * are not to be trusted. dst must stay valid and not be read or reused until
 * then; in a capture, until the graph is destroyed and its last replay ran (each
 * replay writes it again; ferry keeps the pointer, not a copy). Errors:
 * INVALID_ARGUMENT (NULL dst, `bytes` smaller than the block, bad stream),
 * STALE_HANDLE. Never blocks. */
FERRY_C_API ferry_status ferry_copy_to_host(ferry_runtime FERRY_NONNULL rt, uint32_t stream, ferry_handle src,
                                            void* FERRY_NONNULL dst, uint64_t bytes);
/* The three above on device `device`'s streams and blocks, as the "Several
 * devices" calls: device 0 is the call itself (traced and captured); another
 * device's are neither, its handles that device's (another's is STALE_HANDLE).
 * Errors: theirs, and INVALID_ARGUMENT (no such device, named). Never block. */
FERRY_C_API ferry_status ferry_device_fill(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                           ferry_handle dst, uint64_t seed);
FERRY_C_API ferry_status ferry_device_compute(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                              const ferry_handle* FERRY_NULLABLE inputs, uint32_t input_count,
                                              ferry_handle output, double flops, uint64_t mem_bytes);
FERRY_C_API ferry_status ferry_device_copy_to_host(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                                   ferry_handle src, void* FERRY_NONNULL dst, uint64_t bytes);

/* ---- Several devices: adopted streams on any device, and one offload cache
 * across the devices (ferry/multi_device_cache.hpp). */
/* ferry_adopt_stream on device `device`: a stream id of that device for the
 * program's own native stream (cuda: one of that device's), used with the
 * ferry_device_* stream calls. A native stream adopted on one device is refused
 * on every other until released (ferry_adopt_stream is device 0's form of this
 * call). Errors: INVALID_ARGUMENT (no such device, named; NULL native or out,
 * adopted already on this device or, named, on another, one of the device's own),
 * OUT_OF_MEMORY (no adoptable id left on the device). Never blocks. */
FERRY_C_API ferry_status ferry_device_adopt_stream(ferry_runtime FERRY_NONNULL rt, uint32_t device,
                                                   void* FERRY_NONNULL native, uint32_t* FERRY_NONNULL out);
/* ferry_release_stream of a stream adopted on device `device`: waits (up to
 * timeout_ms) for its work, then forgets it. Errors: INVALID_ARGUMENT (no such
 * device; `stream` not adopted on it: a stream another device adopted is named as
 * that device's), TIMEOUT. Blocks. */
FERRY_C_API ferry_status ferry_device_release_stream(ferry_runtime FERRY_NONNULL rt, uint32_t device, uint32_t stream,
                                                     uint64_t timeout_ms);
/* Makes the runtime's cache across devices: `slots` slots of `slot_bytes` (0: the
 * largest entry defined before the first fill) on every device, uploads on each
 * device's stream 1. placement (NULL: "round_robin"): the device an entry goes to,
 * "round_robin" (its definition index modulo the device count) or "most_room" (the
 * device with the most free slots when it is placed, kept while it stays
 * resident). An acquire on a device that does not hold the entry fills it over
 * the link from a device that does when the cost model says the link is faster
 * (ferry_copy_peer, verified under the policy), else from the host pieces. It is
 * apart from ferry_cache_* (device 0's cache, cache_slots) and lives as long as
 * the runtime. Errors: INVALID_ARGUMENT (made already, slots 0, unknown
 * placement). Never blocks. */
FERRY_C_API ferry_status ferry_multi_cache_create(ferry_runtime FERRY_NONNULL rt, uint32_t slots, uint64_t slot_bytes,
                                                  const char* FERRY_NULLABLE placement);
/* ferry_cache_define for every device's slots. Errors: INVALID_ARGUMENT (no cache
 * across devices, duplicate key, no or empty piece). Never blocks. */
FERRY_C_API ferry_status ferry_multi_cache_define(ferry_runtime FERRY_NONNULL rt, uint64_t key,
                                                  const void* FERRY_NULLABLE const* FERRY_NULLABLE pieces,
                                                  const uint64_t* FERRY_NULLABLE piece_bytes, uint32_t count);
/* The device the placement gives `key` now, in *device. Errors: INVALID_ARGUMENT
 * (no cache across devices, undefined key, NULL device). Never blocks. */
FERRY_C_API ferry_status ferry_multi_cache_placed(ferry_runtime FERRY_NONNULL rt, uint64_t key,
                                                  uint32_t* FERRY_NONNULL device);
/* ferry_cache_acquire on device `device` (its `stream` is ordered after the fill):
 * *slot is a block of that device. *from_peer (nullable): 1 when this acquire
 * filled the slot from another device's copy. Errors: INVALID_ARGUMENT (no cache
 * across devices, undefined key, no such device, bad stream), OUT_OF_MEMORY (every
 * slot of the device pinned), TRANSFER_CORRUPT, TIMEOUT. Blocks. */
FERRY_C_API ferry_status ferry_multi_cache_acquire(ferry_runtime FERRY_NONNULL rt, uint64_t key, uint32_t device,
                                                   uint32_t stream, ferry_handle* FERRY_NONNULL slot,
                                                   uint64_t* FERRY_NULLABLE offsets, int* FERRY_NULLABLE hit,
                                                   int* FERRY_NULLABLE from_peer);
/* Unpins one acquire of `key` on `device`. Errors: INVALID_ARGUMENT (no cache
 * across devices, no such device, not pinned there). Never blocks. */
FERRY_C_API ferry_status ferry_multi_cache_release(ferry_runtime FERRY_NONNULL rt, uint64_t key, uint32_t device);
/* The cache across devices as a whole: misses filled from another device's copy,
 * misses uploaded from the host pieces, and the bytes the peer fills moved. */
typedef struct ferry_multi_cache_stats {
  size_t struct_size; /* as ferry_pool_stats's */
  uint64_t peer_fills, host_fills, bytes_peer;
} ferry_multi_cache_stats;
#define FERRY_MULTI_CACHE_STATS_V1_SIZE sizeof(ferry_multi_cache_stats)
/* Writes as ferry_get_pool_stats_sized. Errors: INVALID_ARGUMENT (no cache across
 * devices; NULL out; struct_size refused as the conventions say). Never blocks. */
FERRY_C_API ferry_status ferry_get_multi_cache_stats_sized(ferry_runtime FERRY_NONNULL rt,
                                                           ferry_multi_cache_stats* FERRY_NONNULL out,
                                                           size_t struct_size);
/* Device `device`'s slots of the cache across devices, as ferry_get_cache_stats_sized
 * (a peer fill there counts as a miss, not an upload). Errors: those, and
 * INVALID_ARGUMENT (no such device). Never blocks. */
FERRY_C_API ferry_status ferry_get_multi_cache_device_stats_sized(ferry_runtime FERRY_NONNULL rt, uint32_t device,
                                                                  ferry_cache_stats* FERRY_NONNULL out,
                                                                  size_t struct_size);

#ifdef __cplusplus
}
#endif

#if defined(__clang__)
#pragma clang diagnostic pop
#endif

#endif /* FERRY_FERRY_H */
