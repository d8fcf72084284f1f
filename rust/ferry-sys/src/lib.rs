//! Raw declarations of ferry's C ABI, `include/ferry/ferry.h`, written by hand.
//!
//! Every function is `unsafe`; the header's conventions hold: a status of
//! [`FERRY_OK`] or an error whose message [`ferry_last_error`] holds for this
//! thread, outputs untouched on error, a runtime usable from any thread except
//! [`ferry_runtime_destroy`]. The `ferry` crate is the safe API over this one.
//! `tests/layout.rs` checks every struct's size and field offsets against the header,
//! and [`check_struct_sizes`] checks the sizes against the loaded library's.
//!
//! The structs that grow (`ferry_runtime_options` and the three stats structs)
//! start with `struct_size`. Call the `..._sized` functions with `size_of` the
//! struct (C's macros pass `sizeof` to the same functions), and the library reads
//! and writes only that much; the unsized stats getters read `out.struct_size`.
//!
//! ```
//! let v = unsafe { std::ffi::CStr::from_ptr(ferry_sys::ferry_version()) };
//! assert!(!v.to_bytes().is_empty());
//! ```
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

pub const FERRY_VERSION_MAJOR: u32 = 0;
pub const FERRY_VERSION_MINOR: u32 = 1;
pub const FERRY_VERSION_PATCH: u32 = 0;

/// `enum ferry_status`. An int, not a Rust enum: a C caller may hand back any value.
pub type ferry_status = c_int;
pub const FERRY_OK: ferry_status = 0;
pub const FERRY_ERROR_OUT_OF_MEMORY: ferry_status = 1;
pub const FERRY_ERROR_STALE_HANDLE: ferry_status = 2;
pub const FERRY_ERROR_INVALID_ARGUMENT: ferry_status = 3;
pub const FERRY_ERROR_TRANSFER_CORRUPT: ferry_status = 4;
pub const FERRY_ERROR_BACKEND: ferry_status = 5;
pub const FERRY_ERROR_UNSUPPORTED: ferry_status = 6;
pub const FERRY_ERROR_TIMEOUT: ferry_status = 7;

/// The opaque runtime behind a [`ferry_runtime`].
#[repr(C)]
pub struct ferry_runtime_s {
    _private: [u8; 0],
}
pub type ferry_runtime = *mut ferry_runtime_s;

/// The opaque graph behind a [`ferry_graph`].
#[repr(C)]
pub struct ferry_graph_s {
    _private: [u8; 0],
}
/// A captured graph (`ferry_end_capture`), to destroy with `ferry_graph_destroy`.
pub type ferry_graph = *mut ferry_graph_s;

/// {0,0,0} is the null handle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ferry_handle {
    pub pool: u32,
    pub slot: u32,
    pub generation: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferry_runtime_options {
    pub struct_size: usize,
    pub backend: *const c_char,
    pub profile: *const c_char,
    pub capacity: u64,
    pub seed: u64,
    pub integrity: *const c_char,
    pub inject: *const c_char,
    pub cache_slots: u32,
    pub cache_slot_bytes: u64,
    pub race_check: c_int,
    pub device_count: u64,
    pub links: *const c_char,
}

pub const FERRY_READ: u32 = 1;
pub const FERRY_WRITE: u32 = 2;
pub const FERRY_READ_WRITE: u32 = 3;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ferry_operand {
    pub handle: ferry_handle,
    pub offset: u64,
    pub bytes: u64,
    pub access: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferry_launch_context {
    pub native_stream: *mut c_void,
    pub operand_count: u32,
    pub device_addresses: *const u64,
    pub bytes: *const u64,
    pub host_views: *const *mut c_void,
}

pub type ferry_launch_fn =
    Option<unsafe extern "C" fn(ctx: *const ferry_launch_context, user_data: *mut c_void) -> ferry_status>;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ferry_pool_stats {
    pub struct_size: usize,
    pub allocated_bytes: u64,
    pub peak_allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub pending_free_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    pub ooms: u64,
    pub reclaims: u64,
    pub internal_allocs: u64,
    pub internal_frees: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ferry_integrity_stats {
    pub struct_size: usize,
    pub bytes_moved: u64,
    pub bytes_verified: u64,
    pub mismatches: u64,
    pub retries: u64,
    pub fallbacks: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferry_race_side {
    pub stream: u32,
    pub ticket: u64,
    pub kind: *const c_char,
    pub tag: *const c_char,
    pub access: u32,
    pub block: ferry_handle,
    pub block_tag: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferry_race {
    pub earlier: ferry_race_side,
    pub later: ferry_race_side,
    pub addr: u64,
    pub bytes: u64,
    pub reuse: c_int,
    // ---- v1 ends here (earlier_device lies in v1's padding)
    pub earlier_device: u32,
    pub later_device: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ferry_cache_stats {
    pub struct_size: usize,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub uploads: u64,
    pub bytes_uploaded: u64,
    pub prefetches: u64,
}

extern "C" {
    pub fn ferry_version() -> *const c_char;
    pub fn ferry_status_name(status: ferry_status) -> *const c_char;
    pub fn ferry_last_error() -> *const c_char;

    pub fn ferry_struct_size(name: *const c_char) -> usize;

    pub fn ferry_runtime_options_init(options: *mut ferry_runtime_options);
    pub fn ferry_runtime_options_init_sized(options: *mut ferry_runtime_options, struct_size: usize) -> ferry_status;
    pub fn ferry_runtime_create(options: *const ferry_runtime_options, out: *mut ferry_runtime) -> ferry_status;
    pub fn ferry_runtime_destroy(rt: ferry_runtime);

    pub fn ferry_alloc(rt: ferry_runtime, bytes: u64, stream: u32, out: *mut ferry_handle) -> ferry_status;
    pub fn ferry_free(rt: ferry_runtime, h: ferry_handle) -> ferry_status;
    pub fn ferry_device_address(rt: ferry_runtime, h: ferry_handle, addr: *mut u64, bytes: *mut u64)
        -> ferry_status;
    pub fn ferry_set_tag(rt: ferry_runtime, h: ferry_handle, tag: *const c_char) -> ferry_status;
    pub fn ferry_trim(rt: ferry_runtime) -> ferry_status;

    pub fn ferry_upload(rt: ferry_runtime, stream: u32, dst: ferry_handle, dst_offset: u64, src: *const c_void,
                        bytes: u64) -> ferry_status;
    pub fn ferry_download(rt: ferry_runtime, stream: u32, src: ferry_handle, src_offset: u64, dst: *mut c_void,
                          bytes: u64) -> ferry_status;

    pub fn ferry_launch(rt: ferry_runtime, stream: u32, operands: *const ferry_operand, operand_count: u32,
                        fn_: ferry_launch_fn, user_data: *mut c_void, flops: f64, mem_bytes: u64) -> ferry_status;
    pub fn ferry_record_use(rt: ferry_runtime, stream: u32, handles: *const ferry_handle, count: u32)
        -> ferry_status;

    pub fn ferry_stream_wait(rt: ferry_runtime, stream: u32, for_stream: u32) -> ferry_status;
    pub fn ferry_hold(rt: ferry_runtime, stream: u32, hold: c_int) -> ferry_status;
    pub fn ferry_synchronize(rt: ferry_runtime) -> ferry_status;
    pub fn ferry_native_stream(rt: ferry_runtime, stream: u32, out: *mut *mut c_void) -> ferry_status;
    pub fn ferry_adopt_stream(rt: ferry_runtime, native: *mut c_void, out: *mut u32) -> ferry_status;
    pub fn ferry_release_stream(rt: ferry_runtime, stream: u32, timeout_ms: u64) -> ferry_status;

    pub fn ferry_get_pool_stats(rt: ferry_runtime, out: *mut ferry_pool_stats) -> ferry_status;
    pub fn ferry_get_pool_stats_sized(rt: ferry_runtime, out: *mut ferry_pool_stats, struct_size: usize)
        -> ferry_status;
    pub fn ferry_get_integrity_stats(rt: ferry_runtime, out: *mut ferry_integrity_stats) -> ferry_status;
    pub fn ferry_get_integrity_stats_sized(rt: ferry_runtime, out: *mut ferry_integrity_stats, struct_size: usize)
        -> ferry_status;
    pub fn ferry_memory_summary(rt: ferry_runtime, buf: *mut c_char, capacity: usize, length: *mut usize)
        -> ferry_status;

    pub fn ferry_get_races(rt: ferry_runtime, out: *mut ferry_race, capacity: u32, kept: *mut u32,
                           total: *mut u64) -> ferry_status;
    pub fn ferry_get_races_sized(rt: ferry_runtime, out: *mut ferry_race, capacity: u32, struct_size: usize,
                                 kept: *mut u32, total: *mut u64) -> ferry_status;

    pub fn ferry_cache_define(rt: ferry_runtime, key: u64, pieces: *const *const c_void, piece_bytes: *const u64,
                              count: u32) -> ferry_status;
    pub fn ferry_cache_acquire(rt: ferry_runtime, key: u64, stream: u32, slot: *mut ferry_handle,
                               offsets: *mut u64, hit: *mut c_int) -> ferry_status;
    pub fn ferry_cache_release(rt: ferry_runtime, key: u64) -> ferry_status;
    pub fn ferry_get_cache_stats(rt: ferry_runtime, out: *mut ferry_cache_stats) -> ferry_status;
    pub fn ferry_get_cache_stats_sized(rt: ferry_runtime, out: *mut ferry_cache_stats, struct_size: usize)
        -> ferry_status;

    pub fn ferry_trace_start(rt: ferry_runtime, path: *const c_char) -> ferry_status;
    pub fn ferry_trace_stop(rt: ferry_runtime) -> ferry_status;

    pub fn ferry_import_torch_snapshot(bytes: *const c_void, size: usize, device: c_int, out_path: *const c_char,
                                       source_json: *mut c_char, capacity: usize, length: *mut usize)
        -> ferry_status;

    pub fn ferry_device_count(rt: ferry_runtime, out: *mut u32) -> ferry_status;
    pub fn ferry_device_link(rt: ferry_runtime, a: u32, b: u32, out: *mut *const c_char) -> ferry_status;
    pub fn ferry_device_of(rt: ferry_runtime, h: ferry_handle, out: *mut u32) -> ferry_status;
    pub fn ferry_device_block(rt: ferry_runtime, h: ferry_handle, device: *mut u32, addr: *mut u64, bytes: *mut u64)
        -> ferry_status;
    pub fn ferry_device_alloc(rt: ferry_runtime, device: u32, bytes: u64, stream: u32, out: *mut ferry_handle)
        -> ferry_status;
    pub fn ferry_device_free(rt: ferry_runtime, h: ferry_handle) -> ferry_status;
    pub fn ferry_device_upload(rt: ferry_runtime, stream: u32, dst: ferry_handle, dst_offset: u64,
                               src: *const c_void, bytes: u64) -> ferry_status;
    pub fn ferry_device_download(rt: ferry_runtime, stream: u32, src: ferry_handle, src_offset: u64,
                                 dst: *mut c_void, bytes: u64) -> ferry_status;
    pub fn ferry_copy_peer(rt: ferry_runtime, dst: ferry_handle, dst_offset: u64, src: ferry_handle,
                           src_offset: u64, bytes: u64, stream: u32, verified: *mut c_int) -> ferry_status;
    pub fn ferry_device_stream_wait(rt: ferry_runtime, device: u32, stream: u32, for_device: u32, for_stream: u32)
        -> ferry_status;
    pub fn ferry_device_launch(rt: ferry_runtime, device: u32, stream: u32, operands: *const ferry_operand,
                               operand_count: u32, fn_: ferry_launch_fn, user_data: *mut c_void, flops: f64,
                               mem_bytes: u64) -> ferry_status;
    pub fn ferry_device_record_use(rt: ferry_runtime, device: u32, stream: u32, handles: *const ferry_handle,
                                   count: u32) -> ferry_status;
    pub fn ferry_device_hold(rt: ferry_runtime, device: u32, stream: u32, hold: c_int) -> ferry_status;
    pub fn ferry_device_synchronize(rt: ferry_runtime, device: u32) -> ferry_status;
    pub fn ferry_device_native_stream(rt: ferry_runtime, device: u32, stream: u32, out: *mut *mut c_void)
        -> ferry_status;
    pub fn ferry_device_get_pool_stats_sized(rt: ferry_runtime, device: u32, out: *mut ferry_pool_stats,
                                             struct_size: usize) -> ferry_status;
    pub fn ferry_device_get_integrity_stats_sized(rt: ferry_runtime, device: u32, out: *mut ferry_integrity_stats,
                                                  struct_size: usize) -> ferry_status;

    pub fn ferry_begin_capture(rt: ferry_runtime, stream: u32, share_pool_of: ferry_graph) -> ferry_status;
    pub fn ferry_end_capture(rt: ferry_runtime, stream: u32, out: *mut ferry_graph) -> ferry_status;
    pub fn ferry_graph_launch(rt: ferry_runtime, graph: ferry_graph, stream: u32) -> ferry_status;
    pub fn ferry_graph_destroy(graph: ferry_graph) -> ferry_status;

    // ferry's own device work (ferry.h): fill, compute, the asynchronous copy to the host.
    pub fn ferry_fill(rt: ferry_runtime, stream: u32, dst: ferry_handle, seed: u64) -> ferry_status;
    pub fn ferry_compute(rt: ferry_runtime, stream: u32, inputs: *const ferry_handle, input_count: u32,
                         output: ferry_handle, flops: f64, mem_bytes: u64) -> ferry_status;
    pub fn ferry_copy_to_host(rt: ferry_runtime, stream: u32, src: ferry_handle, dst: *mut c_void, bytes: u64)
        -> ferry_status;
    pub fn ferry_device_fill(rt: ferry_runtime, device: u32, stream: u32, dst: ferry_handle, seed: u64)
        -> ferry_status;
    pub fn ferry_device_compute(rt: ferry_runtime, device: u32, stream: u32, inputs: *const ferry_handle,
                                input_count: u32, output: ferry_handle, flops: f64, mem_bytes: u64) -> ferry_status;
    pub fn ferry_device_copy_to_host(rt: ferry_runtime, device: u32, stream: u32, src: ferry_handle,
                                     dst: *mut c_void, bytes: u64) -> ferry_status;
}

// ---- Several devices: adopted streams on any device, and one offload cache
// across the devices (ferry.h's section of that name).

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ferry_multi_cache_stats {
    pub struct_size: usize,
    pub peer_fills: u64,
    pub host_fills: u64,
    pub bytes_peer: u64,
}

extern "C" {
    pub fn ferry_device_adopt_stream(rt: ferry_runtime, device: u32, native: *mut c_void, out: *mut u32)
        -> ferry_status;
    pub fn ferry_device_release_stream(rt: ferry_runtime, device: u32, stream: u32, timeout_ms: u64)
        -> ferry_status;
    pub fn ferry_multi_cache_create(rt: ferry_runtime, slots: u32, slot_bytes: u64, placement: *const c_char)
        -> ferry_status;
    pub fn ferry_multi_cache_define(rt: ferry_runtime, key: u64, pieces: *const *const c_void,
                                    piece_bytes: *const u64, count: u32) -> ferry_status;
    pub fn ferry_multi_cache_placed(rt: ferry_runtime, key: u64, device: *mut u32) -> ferry_status;
    pub fn ferry_multi_cache_acquire(rt: ferry_runtime, key: u64, device: u32, stream: u32, slot: *mut ferry_handle,
                                     offsets: *mut u64, hit: *mut c_int, from_peer: *mut c_int) -> ferry_status;
    pub fn ferry_multi_cache_release(rt: ferry_runtime, key: u64, device: u32) -> ferry_status;
    pub fn ferry_get_multi_cache_stats_sized(rt: ferry_runtime, out: *mut ferry_multi_cache_stats,
                                             struct_size: usize) -> ferry_status;
    pub fn ferry_get_multi_cache_device_stats_sized(rt: ferry_runtime, device: u32, out: *mut ferry_cache_stats,
                                                    struct_size: usize) -> ferry_status;
}

/// Every struct of `ferry.h` that this crate declares, by its C name, with its size here.
pub fn struct_sizes() -> [(&'static str, usize); 10] {
    use std::mem::size_of;
    [
        ("ferry_handle", size_of::<ferry_handle>()),
        ("ferry_runtime_options", size_of::<ferry_runtime_options>()),
        ("ferry_operand", size_of::<ferry_operand>()),
        ("ferry_launch_context", size_of::<ferry_launch_context>()),
        ("ferry_pool_stats", size_of::<ferry_pool_stats>()),
        ("ferry_integrity_stats", size_of::<ferry_integrity_stats>()),
        ("ferry_race_side", size_of::<ferry_race_side>()),
        ("ferry_race", size_of::<ferry_race>()),
        ("ferry_cache_stats", size_of::<ferry_cache_stats>()),
        ("ferry_multi_cache_stats", size_of::<ferry_multi_cache_stats>()),
    ]
}

/// `Err` naming the struct when the loaded library lays out `name` in other than
/// `size` bytes (or does not know it): this crate and the library come from
/// different versions of `ferry.h`, and a call would read or write past a struct.
pub fn check_struct_size(name: &str, size: usize) -> Result<(), String> {
    let c_name = std::ffi::CString::new(name).map_err(|_| format!("{:?} holds a NUL", name))?;
    let theirs = unsafe { ferry_struct_size(c_name.as_ptr()) };
    if theirs == size {
        return Ok(());
    }
    let version = unsafe { std::ffi::CStr::from_ptr(ferry_version()) }.to_string_lossy().into_owned();
    Err(format!(
        "libferry ({}) lays out {} in {} bytes, ferry-sys ({}) in {}: the library and the crate are from \
         different versions of ferry.h",
        version,
        name,
        theirs,
        env!("CARGO_PKG_VERSION"),
        size
    ))
}

/// [`check_struct_size`] for every struct this crate declares.
pub fn check_struct_sizes() -> Result<(), String> {
    struct_sizes().iter().try_for_each(|&(name, size)| check_struct_size(name, size))
}
