//! ferry from Rust: a safe API over ferry's C ABI (`include/ferry/ferry.h`, through
//! the `ferry-sys` crate).
//!
//! A [`Runtime`] owns a device (`sim` or `cuda`), a stream-ordered pool, verified
//! transfers and, when asked, an offload cache. Device memory is an [`Allocation`]
//! that borrows the runtime and frees itself, stream-ordered, on drop. Every
//! fallible call returns `Result<T, Error>`; a stale, foreign or forged handle is
//! [`Error::StaleHandle`], never another allocation's memory.
//!
//! ```
//! use ferry::{Operand, Runtime};
//! let rt = Runtime::builder().profile("tiny").capacity(8 << 20).build()?;
//! let a = rt.alloc(4, 0)?;
//! let b = rt.alloc(4, 0)?;
//! rt.upload(0, &a, 0, &[1, 2, 3, 4])?;
//! rt.launch(0, &[Operand::read(&a), Operand::write(&b)], |ctx| {
//!     let (input, output) = ctx.input_output(0, 1)?; // sim: the operands' bytes
//!     for (o, i) in output.iter_mut().zip(input) { *o = i + 1; }
//!     Ok(())
//! })?;
//! drop(a); // stream-ordered: the launch still holds it
//! let mut out = [0u8; 4];
//! rt.download(0, &b, 0, &mut out)?;
//! assert_eq!(out, [2, 3, 4, 5]);
//! # Ok::<(), ferry::Error>(())
//! ```
//!
//! Threads: a [`Runtime`] is `Send + Sync` (the header allows every call from any
//! thread at once); it is destroyed by its `Drop`, which the borrow checker keeps
//! from racing with any other call. A launch closure runs under ferry's internal
//! lock, on whichever thread completes the work: it must not call ferry (such a call
//! returns [`Error::InvalidArgument`]).

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use ferry_sys as sys;

mod graph;
pub use graph::Graph;
mod device_work;
pub use device_work::HostCopy;
mod multi_cache;
pub use multi_cache::{MultiCache, MultiCachePin, MultiCacheStats, Placement};

/// The version of the loaded library ("MAJOR.MINOR.PATCH", CMakeLists.txt's project(VERSION)).
///
/// ```
/// assert!(ferry::version().starts_with("0."));
/// ```
pub fn version() -> String {
    unsafe { text(sys::ferry_version()) }
}

unsafe fn text(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    CStr::from_ptr(p).to_string_lossy().into_owned()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------- errors

/// One of ferry's error codes with its message (which names the request and the
/// state, e.g. an out-of-memory's pool figures).
///
/// ```
/// let rt = ferry::Runtime::builder().profile("tiny").build()?;
/// let err = rt.alloc(0, 0).unwrap_err();
/// assert!(matches!(err, ferry::Error::InvalidArgument(_)));
/// assert!(err.to_string().starts_with("invalid_argument: "));
/// # Ok::<(), ferry::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    OutOfMemory(String),
    StaleHandle(String),
    InvalidArgument(String),
    TransferCorrupt(String),
    Backend(String),
    Unsupported(String),
    Timeout(String),
}

/// `Result<T, ferry::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The error for a C status (any value but `FERRY_OK`; an unknown one is `Backend`).
    pub fn from_status(status: sys::ferry_status, message: String) -> Error {
        match status {
            sys::FERRY_ERROR_OUT_OF_MEMORY => Error::OutOfMemory(message),
            sys::FERRY_ERROR_STALE_HANDLE => Error::StaleHandle(message),
            sys::FERRY_ERROR_INVALID_ARGUMENT => Error::InvalidArgument(message),
            sys::FERRY_ERROR_TRANSFER_CORRUPT => Error::TransferCorrupt(message),
            sys::FERRY_ERROR_UNSUPPORTED => Error::Unsupported(message),
            sys::FERRY_ERROR_TIMEOUT => Error::Timeout(message),
            _ => Error::Backend(message),
        }
    }

    /// The C status of this error.
    pub fn status(&self) -> sys::ferry_status {
        match self {
            Error::OutOfMemory(_) => sys::FERRY_ERROR_OUT_OF_MEMORY,
            Error::StaleHandle(_) => sys::FERRY_ERROR_STALE_HANDLE,
            Error::InvalidArgument(_) => sys::FERRY_ERROR_INVALID_ARGUMENT,
            Error::TransferCorrupt(_) => sys::FERRY_ERROR_TRANSFER_CORRUPT,
            Error::Backend(_) => sys::FERRY_ERROR_BACKEND,
            Error::Unsupported(_) => sys::FERRY_ERROR_UNSUPPORTED,
            Error::Timeout(_) => sys::FERRY_ERROR_TIMEOUT,
        }
    }

    /// The code's name: "out_of_memory", "stale_handle", ...
    pub fn name(&self) -> String {
        unsafe { text(sys::ferry_status_name(self.status())) }
    }

    /// ferry's message.
    pub fn message(&self) -> &str {
        match self {
            Error::OutOfMemory(m)
            | Error::StaleHandle(m)
            | Error::InvalidArgument(m)
            | Error::TransferCorrupt(m)
            | Error::Backend(m)
            | Error::Unsupported(m)
            | Error::Timeout(m) => m,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name(), self.message())
    }
}

impl std::error::Error for Error {}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

thread_local! {
    // Set while a launch closure runs on this thread: ferry must not be called then.
    static IN_LAUNCH: Cell<bool> = const { Cell::new(false) };
}

fn not_in_launch(call: &str) -> Result<()> {
    if IN_LAUNCH.with(|f| f.get()) {
        return Err(invalid(format!("{}: called from inside a launch closure (it runs under ferry's lock)", call)));
    }
    Ok(())
}

fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| invalid(format!("{}: {:?} contains a NUL byte", what, s)))
}

fn count(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| invalid(format!("{}: {} items (at most {})", what, n, u32::MAX)))
}

// ---------------------------------------------------------------- the runtime

/// The device the runtime drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The simulated GPU: deterministic, no device needed.
    Sim,
    /// A CUDA device.
    Cuda,
}

/// How uploads are checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Integrity {
    Off,
    Probe,
    /// Every upload's device hash is compared before it returns (the default).
    Verify,
}

/// The options of [`Runtime::builder`]; unset ones are the C defaults (sim, h200,
/// the device's capacity, verify, no cache, no race check).
#[derive(Clone, Debug, Default)]
pub struct RuntimeBuilder {
    backend: Option<Backend>,
    profile: Option<String>,
    capacity: u64,
    seed: Option<u64>,
    integrity: Option<Integrity>,
    inject: Option<String>,
    cache_slots: u32,
    cache_slot_bytes: u64,
    race_check: bool,
    devices: u32,
    links: Option<String>,
}

impl RuntimeBuilder {
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }
    /// The sim's device profile: "h200", "rtx4090", "rtx3090", "tiny".
    pub fn profile(mut self, profile: &str) -> Self {
        self.profile = Some(profile.to_string());
        self
    }
    /// Pool capacity in bytes (0: the device's).
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }
    /// The sim's seed: the same seed gives the same schedule and bytes.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }
    pub fn integrity(mut self, integrity: Integrity) -> Self {
        self.integrity = Some(integrity);
        self
    }
    /// A sim fault spec, as the CLI's `--inject`.
    pub fn inject(mut self, spec: &str) -> Self {
        self.inject = Some(spec.to_string());
        self
    }
    /// An offload cache of `slots` slots of `slot_bytes` each (0: the largest entry
    /// defined before the first fill).
    pub fn cache(mut self, slots: u32, slot_bytes: u64) -> Self {
        self.cache_slots = slots;
        self.cache_slot_bytes = slot_bytes;
        self
    }
    /// sim: report stream races ([`Runtime::races`]); cuda refuses it.
    pub fn race_check(mut self, on: bool) -> Self {
        self.race_check = on;
        self
    }
    /// How many devices (docs/scale.md): a pool, an arena and streams each (sim:
    /// the profile with seed + i; cuda: ordinal i). 0 or 1: one.
    /// [`Runtime::alloc_on`] picks the device; calls on an allocation act on its own.
    pub fn devices(mut self, count: u32) -> Self {
        self.devices = count;
        self
    }
    /// sim: the links between devices, "A-B:KIND" pairs separated by commas (KIND
    /// `pcie` or `nvlink`, e.g. "0-1:nvlink"). A linked pair's [`Runtime::copy_peer`]
    /// goes device to device over its link; any other pair's through pinned host memory.
    pub fn links(mut self, spec: &str) -> Self {
        self.links = Some(spec.to_string());
        self
    }

    /// Creates the runtime. Errors: `InvalidArgument` (unknown profile or fault
    /// spec, faults asked of cuda, bad links), `Unsupported` (cuda without a device), `Backend`.
    /// Blocks while the device initializes.
    pub fn build(self) -> Result<Runtime> {
        not_in_launch("Runtime::build")?;
        let backend = self.backend.map(|b| match b {
            Backend::Sim => CString::new("sim").unwrap(),
            Backend::Cuda => CString::new("cuda").unwrap(),
        });
        let integrity = self.integrity.map(|i| match i {
            Integrity::Off => CString::new("off").unwrap(),
            Integrity::Probe => CString::new("probe").unwrap(),
            Integrity::Verify => CString::new("verify").unwrap(),
        });
        let profile = self.profile.as_deref().map(|p| c_string("profile", p)).transpose()?;
        let inject = self.inject.as_deref().map(|p| c_string("inject", p)).transpose()?;
        let links = self.links.as_deref().map(|p| c_string("links", p)).transpose()?;
        let opt = |s: &Option<CString>| s.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        check_library()?;
        let mut o = std::mem::MaybeUninit::<sys::ferry_runtime_options>::uninit();
        let mut o = unsafe {
            check(sys::ferry_runtime_options_init_sized(
                o.as_mut_ptr(),
                std::mem::size_of::<sys::ferry_runtime_options>(),
            ))?;
            o.assume_init()
        };
        if backend.is_some() {
            o.backend = opt(&backend);
        }
        if profile.is_some() {
            o.profile = opt(&profile);
        }
        if integrity.is_some() {
            o.integrity = opt(&integrity);
        }
        if inject.is_some() {
            o.inject = opt(&inject);
        }
        if links.is_some() {
            o.links = opt(&links);
        }
        if let Some(seed) = self.seed {
            o.seed = seed;
        }
        o.capacity = self.capacity;
        o.cache_slots = self.cache_slots;
        o.cache_slot_bytes = self.cache_slot_bytes;
        o.race_check = self.race_check as c_int;
        o.device_count = u64::from(self.devices);
        let mut raw: sys::ferry_runtime = ptr::null_mut();
        check(unsafe { sys::ferry_runtime_create(&o, &mut raw) })?;
        let raw = NonNull::new(raw).expect("ferry_runtime_create succeeded with a runtime");
        let mut devices = 0u32;
        let counted = check(unsafe { sys::ferry_device_count(raw.as_ptr(), &mut devices) });
        let rt = Runtime {
            raw,
            shared: Box::new(Shared::default()),
            backend: self.backend.unwrap_or(Backend::Sim),
            devices,
        };
        counted.map(|()| rt)
    }
}

/// `Err(Unsupported)` when the loaded libferry lays out a struct in other than
/// ferry-sys's size (checked once per process): a call would read or write past it.
fn check_library() -> Result<()> {
    static CHECKED: Mutex<Option<std::result::Result<(), String>>> = Mutex::new(None);
    let mut checked = lock(&CHECKED);
    checked.get_or_insert_with(sys::check_struct_sizes).clone().map_err(Error::Unsupported)
}

fn check(status: sys::ferry_status) -> Result<()> {
    if status == sys::FERRY_OK {
        return Ok(());
    }
    Err(Error::from_status(status, unsafe { text(sys::ferry_last_error()) }))
}

#[derive(Default)]
struct Shared {
    // Launches ferry has not called back yet, by address: taken by the callback,
    // dropped with the runtime for any it never ran.
    pending: Mutex<HashSet<usize>>,
    // What launch closures failed with (bounded): the C fault carries only a status.
    launch_errors: Mutex<Vec<Error>>,
    // cache_define's pieces: ferry reads them while the runtime lives.
    cache_pieces: Mutex<HashMap<u64, Vec<Vec<u8>>>>,
    // MultiCache::define's pieces (multi_cache.rs), kept as cache_pieces are.
    multi_cache_pieces: Mutex<HashMap<u64, Vec<Vec<u8>>>>,
    // Streams this crate began a capture on (graph.rs), each with what its
    // recorded calls use at every replay (device_work::Kept): launch refuses them.
    capturing: Mutex<HashMap<u32, device_work::Kept>>,
    // Makes `capturing` and ferry's own capture state one fact: begin_capture and
    // end_capture hold it exclusively across their C call and their map update; a
    // call a capture records over host memory (upload, copy_to_host, launch) holds
    // it shared from its look at `capturing` to the end of its C call, so ferry
    // never records a call this crate handed memory to as a one-shot.
    capture_gate: RwLock<()>,
    // What ferry may still touch after its owner went (a destroyed graph's Kept, a
    // dropped HostCopy's buffer), by device: dropped by the next synchronize of
    // that device begun after it was retired (device_work::Retired).
    retired: Mutex<device_work::Retired>,
}

const KEPT_LAUNCH_ERRORS: usize = 16;

/// A ferry runtime; `Drop` waits for its work, then frees everything (its
/// [`Allocation`]s borrow it, so none outlives it).
///
/// ```
/// let rt = ferry::Runtime::builder()
///     .backend(ferry::Backend::Sim)
///     .profile("tiny")
///     .capacity(16 << 20)
///     .integrity(ferry::Integrity::Verify)
///     .build()?;
/// assert_eq!(rt.backend(), ferry::Backend::Sim);
/// # Ok::<(), ferry::Error>(())
/// ```
pub struct Runtime {
    raw: NonNull<sys::ferry_runtime_s>,
    shared: Box<Shared>,
    backend: Backend,
    devices: u32,
}

// The header: "a ferry_runtime may be used from any thread at once, except
// ferry_runtime_destroy"; destroy runs only in Drop, which owns the runtime.
unsafe impl Send for Runtime {}
unsafe impl Sync for Runtime {}

impl Drop for Runtime {
    fn drop(&mut self) {
        if IN_LAUNCH.with(|f| f.get()) {
            // Destroy waits for this very launch: leaking is the only way out.
            return;
        }
        unsafe { sys::ferry_runtime_destroy(self.raw.as_ptr()) };
        // No callback runs after destroy: what is left here never ran.
        for addr in lock(&self.shared.pending).drain() {
            drop(unsafe { Box::from_raw(addr as *mut PendingLaunch) });
        }
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("backend", &self.backend).finish()
    }
}

impl Runtime {
    /// Options for a new runtime.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// How many devices the runtime drives ([`RuntimeBuilder::devices`]).
    pub fn device_count(&self) -> u32 {
        self.devices
    }

    /// The link between devices `a` and `b` ([`RuntimeBuilder::links`] on the sim;
    /// on cuda what the driver reports): "none", "pcie" or "nvlink". Errors:
    /// `InvalidArgument` (a device beyond the count).
    pub fn device_link(&self, a: u32, b: u32) -> Result<String> {
        let rt = self.rt("device_link")?;
        let mut name: *const std::os::raw::c_char = ptr::null();
        self.check(unsafe { sys::ferry_device_link(rt, a, b, &mut name) })?;
        Ok(unsafe { text(name) })
    }

    fn rt(&self, call: &str) -> Result<sys::ferry_runtime> {
        not_in_launch(call)?;
        Ok(self.raw.as_ptr())
    }

    // A status of this runtime, with the messages of failed launch closures added
    // to the stream fault they caused.
    fn check(&self, status: sys::ferry_status) -> Result<()> {
        let err = match check(status) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if !err.message().contains("the launch function returned") {
            return Err(err);
        }
        let related: Vec<String> = lock(&self.shared.launch_errors)
            .iter()
            .filter(|e| e.status() == err.status())
            .map(|e| e.message().to_string())
            .collect();
        if related.is_empty() {
            return Err(err);
        }
        Err(Error::from_status(
            err.status(),
            format!("{}; the launch closure said: {}", err.message(), related.join("; ")),
        ))
    }

    /// A block of `bytes`, stream-ordered on `stream`. Errors: `InvalidArgument`
    /// (0 bytes, bad stream), `OutOfMemory` (after the reclaim; the message is the
    /// pool's diagnostic). May block (bounded) in the reclaim.
    pub fn alloc(&self, bytes: u64, stream: u32) -> Result<Allocation<'_>> {
        let rt = self.rt("alloc")?;
        let mut h = sys::ferry_handle::default();
        self.check(unsafe { sys::ferry_alloc(rt, bytes, stream, &mut h) })?;
        Allocation::from_handle(self, Handle(h))
    }

    /// A block of `bytes` on `device`, stream-ordered on that device's `stream`.
    /// Errors: those of [`Runtime::alloc`]; `InvalidArgument` (no such device).
    pub fn alloc_on(&self, device: u32, bytes: u64, stream: u32) -> Result<Allocation<'_>> {
        let rt = self.rt("alloc_on")?;
        let mut h = sys::ferry_handle::default();
        self.check(unsafe { sys::ferry_device_alloc(rt, device, bytes, stream, &mut h) })?;
        Allocation::from_handle(self, Handle(h))
    }

    // (device, address, requested bytes) of a live handle of any device.
    fn address_of(&self, h: Handle) -> Result<(u32, u64, u64)> {
        let rt = self.rt("device_address")?;
        let (mut device, mut addr, mut len) = (0u32, 0u64, 0u64);
        if self.devices <= 1 {
            self.check(unsafe { sys::ferry_device_address(rt, h.0, &mut addr, &mut len) })?;
        } else {
            self.check(unsafe { sys::ferry_device_block(rt, h.0, &mut device, &mut addr, &mut len) })?;
        }
        Ok((device, addr, len))
    }

    /// Frees a raw handle (from [`Allocation::into_handle`]) of any device,
    /// stream-ordered. Errors: `StaleHandle`. Never blocks.
    pub fn free(&self, handle: Handle) -> Result<()> {
        let rt = self.rt("free")?;
        if self.devices <= 1 {
            return self.check(unsafe { sys::ferry_free(rt, handle.0) });
        }
        self.check(unsafe { sys::ferry_device_free(rt, handle.0) })
    }

    /// Copies `bytes` of `src` (from `src_offset`) into `dst` (at `dst_offset`),
    /// whichever devices they are on (docs/scale.md); `true` when verify checked it.
    /// On a capturing stream ([`Graph`]) a copy within device 0 is recorded, one
    /// across devices refused. Errors: `InvalidArgument`, `StaleHandle`,
    /// `OutOfMemory`, `TransferCorrupt`, `Timeout`, `Backend`. Blocks (bounded).
    pub fn copy_peer(&self, stream: u32, dst: &Allocation<'_>, dst_offset: u64, src: &Allocation<'_>,
                     src_offset: u64, bytes: u64) -> Result<bool> {
        let rt = self.rt("copy_peer")?;
        self.same_runtime(dst)?;
        self.same_runtime(src)?;
        let mut verified: c_int = 0;
        self.check(unsafe {
            sys::ferry_copy_peer(rt, dst.handle.0, dst_offset, src.handle.0, src_offset, bytes, stream, &mut verified)
        })?;
        Ok(verified == 1)
    }

    /// Releases cached device memory and completed frees. Never blocks.
    pub fn trim(&self) -> Result<()> {
        let rt = self.rt("trim")?;
        self.check(unsafe { sys::ferry_trim(rt) })
    }

    /// Host -> device: `src` into `dst` at `offset`, under the integrity policy
    /// (verify: returns once the device hash matched). On a stream this runtime
    /// captures ([`Graph`]) it is recorded over a copy of `src` that the graph
    /// owns (ferry refuses it unless the policy is off). Errors: `InvalidArgument`
    /// (empty, outside the block, bad stream, a capture's refusal), `StaleHandle`,
    /// `TransferCorrupt`, `Timeout`, `Backend`. Blocks (not when captured).
    pub fn upload(&self, stream: u32, dst: &Allocation<'_>, offset: u64, src: &[u8]) -> Result<()> {
        let rt = self.rt("upload")?;
        self.same_runtime(dst)?;
        let _gate = read(&self.shared.capture_gate);
        let mut capturing = lock(&self.shared.capturing);
        if let Some(kept) = capturing.get_mut(&stream) {
            // A replay reads the bytes again (staged at each launch), after this borrow ends.
            let copy: Box<[u8]> = src.into();
            let status = unsafe {
                sys::ferry_upload(rt, stream, dst.handle.0, offset, copy.as_ptr() as *const c_void, copy.len() as u64)
            };
            self.check(status)?;
            kept.uploads.push(copy);
            return Ok(());
        }
        drop(capturing);
        self.check(unsafe {
            let data = src.as_ptr() as *const c_void;
            if self.devices <= 1 {
                sys::ferry_upload(rt, stream, dst.handle.0, offset, data, src.len() as u64)
            } else {
                sys::ferry_device_upload(rt, stream, dst.handle.0, offset, data, src.len() as u64)
            }
        })
    }

    /// Device -> host; blocks until the bytes are in `dst`. Errors as [`Runtime::upload`].
    pub fn download(&self, stream: u32, src: &Allocation<'_>, offset: u64, dst: &mut [u8]) -> Result<()> {
        let rt = self.rt("download")?;
        self.same_runtime(src)?;
        self.check(unsafe {
            let data = dst.as_mut_ptr() as *mut c_void;
            if self.devices <= 1 {
                sys::ferry_download(rt, stream, src.handle.0, offset, data, dst.len() as u64)
            } else {
                sys::ferry_device_download(rt, stream, src.handle.0, offset, data, dst.len() as u64)
            }
        })
    }

    fn same_runtime(&self, a: &Allocation<'_>) -> Result<()> {
        if ptr::eq(a.rt, self) {
            return Ok(());
        }
        Err(Error::StaleHandle(format!("{:?} belongs to another runtime", a.handle)))
    }

    /// Enqueues `f` over `operands` on `stream`, leasing them until it ran (a block
    /// freed meanwhile stays valid for it). On sim `f` runs when the op completes,
    /// on the operands' bytes ([`LaunchContext::view`]); on cuda at dispatch, to
    /// enqueue kernels on [`LaunchContext::native_stream`]. An `Err` from `f`, or a
    /// panic in it, becomes the op's error: a sticky fault of `stream` that every
    /// later wait ([`Runtime::synchronize`], a download) reports with `f`'s message.
    /// Errors, before anything is enqueued: `StaleHandle`, `InvalidArgument` (range
    /// outside a block, bad stream, a stream this runtime captures: see [`Graph`]).
    /// Never blocks.
    ///
    /// ```
    /// let rt = ferry::Runtime::builder().profile("tiny").build()?;
    /// let a = rt.alloc(16, 0)?;
    /// rt.launch(0, &[ferry::Operand::write(&a)], |_| panic!("bad kernel"))?;
    /// let err = rt.synchronize().unwrap_err();
    /// assert!(err.message().contains("panicked: bad kernel"));
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn launch<F>(&self, stream: u32, operands: &[Operand<'_>], f: F) -> Result<()>
    where
        F: FnOnce(&mut LaunchContext<'_>) -> Result<()> + Send + 'static,
    {
        self.launch_with_cost(stream, operands, 0.0, 0, f)
    }

    /// [`Runtime::launch`] with the op's modeled cost on sim.
    pub fn launch_with_cost<F>(&self, stream: u32, operands: &[Operand<'_>], flops: f64, mem_bytes: u64, f: F)
        -> Result<()>
    where
        F: FnOnce(&mut LaunchContext<'_>) -> Result<()> + Send + 'static,
    {
        self.launch_with_cost_on(0, stream, operands, flops, mem_bytes, f)
    }

    /// [`Runtime::launch`] on `stream` of `device`, over that device's blocks
    /// (another device's is `StaleHandle` naming both; no such device is
    /// `InvalidArgument`).
    pub fn launch_on<F>(&self, device: u32, stream: u32, operands: &[Operand<'_>], f: F) -> Result<()>
    where
        F: FnOnce(&mut LaunchContext<'_>) -> Result<()> + Send + 'static,
    {
        self.launch_with_cost_on(device, stream, operands, 0.0, 0, f)
    }

    /// [`Runtime::launch_on`] with the op's modeled cost on sim.
    pub fn launch_with_cost_on<F>(&self, device: u32, stream: u32, operands: &[Operand<'_>], flops: f64,
                                  mem_bytes: u64, f: F) -> Result<()>
    where
        F: FnOnce(&mut LaunchContext<'_>) -> Result<()> + Send + 'static,
    {
        let rt = self.rt("launch")?;
        let _gate = read(&self.shared.capture_gate);
        self.launch_gated(rt, device, stream, operands, flops, mem_bytes, f)
    }

    // launch_with_cost_on under the capture gate its caller holds shared.
    #[allow(clippy::too_many_arguments)]
    fn launch_gated<F>(&self, rt: sys::ferry_runtime, device: u32, stream: u32, operands: &[Operand<'_>], flops: f64,
                       mem_bytes: u64, f: F) -> Result<()>
    where
        F: FnOnce(&mut LaunchContext<'_>) -> Result<()> + Send + 'static,
    {
        if device == 0 {
            self.refuse_if_capturing("launch", stream,
                                     "the closure is FnOnce and a graph runs it at every replay (launch_replayable \
                                      takes an Fn)")?;
        }
        let raw = self.operands_of("launch", operands)?;
        let n = count("launch: operands", raw.len())?;
        let pending = Box::into_raw(Box::new(PendingLaunch {
            shared: &*self.shared,
            access: raw.iter().map(|o| o.access).collect(),
            f: Box::new(f),
        }));
        // Registered before ferry may call back (on another thread, at once).
        lock(&self.shared.pending).insert(pending as usize);
        let user = pending as *mut c_void;
        // Device 0 through the runtime's own call (traced and captured as it is).
        let status = unsafe {
            if device == 0 {
                sys::ferry_launch(rt, stream, raw.as_ptr(), n, Some(run_launch), user, flops, mem_bytes)
            } else {
                sys::ferry_device_launch(rt, device, stream, raw.as_ptr(), n, Some(run_launch), user, flops, mem_bytes)
            }
        };
        if status != sys::FERRY_OK {
            // Refused: ferry never calls back. Read the message before anything else.
            let err = check(status);
            if lock(&self.shared.pending).remove(&(pending as usize)) {
                drop(unsafe { Box::from_raw(pending) });
            }
            return err;
        }
        Ok(())
    }

    // The operands as ferry takes them; `StaleHandle` for a block of another runtime.
    fn operands_of(&self, call: &str, operands: &[Operand<'_>]) -> Result<Vec<sys::ferry_operand>> {
        for o in operands {
            if let Some(owner) = o.owner {
                if !ptr::eq(owner, self) {
                    return Err(Error::StaleHandle(format!("{}: {:?} belongs to another runtime", call, o.raw.handle)));
                }
            }
        }
        Ok(operands.iter().map(|o| o.raw).collect())
    }

    /// PyTorch's `record_stream`, checked: the blocks stay leased until everything
    /// enqueued on `stream` so far has completed, native work included. Errors:
    /// `StaleHandle` (nothing recorded). Never blocks.
    pub fn record_use(&self, stream: u32, allocations: &[&Allocation<'_>]) -> Result<()> {
        self.record_use_on(0, stream, allocations)
    }

    /// [`Runtime::record_use`] on `stream` of `device`, for blocks of that device.
    /// Errors: `StaleHandle` (another device's block: nothing recorded),
    /// `InvalidArgument` (no such device). Never blocks.
    pub fn record_use_on(&self, device: u32, stream: u32, allocations: &[&Allocation<'_>]) -> Result<()> {
        let rt = self.rt("record_use")?;
        for a in allocations {
            self.same_runtime(a)?;
        }
        let handles: Vec<sys::ferry_handle> = allocations.iter().map(|a| a.handle.0).collect();
        let n = count("record_use", handles.len())?;
        self.check(unsafe {
            if device == 0 {
                sys::ferry_record_use(rt, stream, handles.as_ptr(), n)
            } else {
                sys::ferry_device_record_use(rt, device, stream, handles.as_ptr(), n)
            }
        })
    }

    /// `stream` waits for everything enqueued on `for_stream` so far. Errors:
    /// `InvalidArgument` (bad stream), `Backend`. Never blocks.
    pub fn stream_wait(&self, stream: u32, for_stream: u32) -> Result<()> {
        let rt = self.rt("stream_wait")?;
        self.check(unsafe { sys::ferry_stream_wait(rt, stream, for_stream) })
    }

    /// `stream` of `device` waits for everything enqueued on `for_stream` of
    /// `for_device` so far, without the host: an event of that device waited on
    /// by the stream (`ferry_device_stream_wait`; the race checker sees the order).
    /// Errors: `InvalidArgument` (no such device, bad stream), `Timeout` (the work
    /// waits for held work of another stream), `Backend`. Never blocks.
    pub fn stream_wait_across(&self, device: u32, stream: u32, for_device: u32, for_stream: u32) -> Result<()> {
        let rt = self.rt("stream_wait_across")?;
        self.check(unsafe { sys::ferry_device_stream_wait(rt, device, stream, for_device, for_stream) })
    }

    /// Holds `stream`: new work waits in a host-side queue until the guard drops
    /// (or [`HoldGuard::release`]), which dispatches it. Errors: `InvalidArgument`.
    ///
    /// ```
    /// let rt = ferry::Runtime::builder().profile("tiny").build()?;
    /// let a = rt.alloc(64, 0)?;
    /// {
    ///     let _held = rt.hold(0)?;
    ///     rt.upload(1, &a, 0, &[7; 64])?;
    /// } // released: queued work dispatches
    /// rt.synchronize()?;
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn hold(&self, stream: u32) -> Result<HoldGuard<'_>> {
        self.hold_on(0, stream)
    }

    /// [`Runtime::hold`] of `stream` of `device`. Errors: `InvalidArgument` (also:
    /// no such device).
    pub fn hold_on(&self, device: u32, stream: u32) -> Result<HoldGuard<'_>> {
        let rt = self.rt("hold")?;
        self.check(unsafe { hold_raw(rt, device, stream, 1) })?;
        Ok(HoldGuard { rt: self, device, stream, released: false })
    }

    /// Dispatches held work and waits for every stream. Errors: the first sticky
    /// stream fault (a failed launch, with its closure's message), `Backend`,
    /// `Timeout`. Blocks.
    pub fn synchronize(&self) -> Result<()> {
        let rt = self.rt("synchronize")?;
        let before = self.retired_mark();
        self.check(unsafe { sys::ferry_synchronize(rt) })?;
        self.drop_retired(0, before);
        Ok(())
    }

    /// [`Runtime::synchronize`] of `device`'s streams only (the other devices' work
    /// is not waited for). Errors: as it, and `InvalidArgument` (no such device).
    pub fn synchronize_device(&self, device: u32) -> Result<()> {
        let rt = self.rt("synchronize")?;
        let before = self.retired_mark();
        self.check(unsafe { sys::ferry_device_synchronize(rt, device) })?;
        self.drop_retired(device, before);
        Ok(())
    }

    /// The native stream behind `stream` (a `cudaStream_t` on cuda, an opaque
    /// token on sim).
    pub fn native_stream(&self, stream: u32) -> Result<*mut c_void> {
        self.native_stream_on(0, stream)
    }

    /// [`Runtime::native_stream`] of `stream` of `device`. Errors: `InvalidArgument`
    /// (also: no such device).
    pub fn native_stream_on(&self, device: u32, stream: u32) -> Result<*mut c_void> {
        let rt = self.rt("native_stream")?;
        let mut out = ptr::null_mut();
        self.check(unsafe {
            if device == 0 {
                sys::ferry_native_stream(rt, stream, &mut out)
            } else {
                sys::ferry_device_native_stream(rt, device, stream, &mut out)
            }
        })?;
        Ok(out)
    }

    /// A stream id for the program's own native stream (ferry never destroys or
    /// holds it). Errors: `InvalidArgument` (null, adopted already, one of ferry's).
    ///
    /// # Safety
    /// On cuda `native` must be a live `cudaStream_t` until [`Runtime::release_stream`].
    pub unsafe fn adopt_stream(&self, native: *mut c_void) -> Result<u32> {
        let rt = self.rt("adopt_stream")?;
        let mut id = 0u32;
        self.check(sys::ferry_adopt_stream(rt, native, &mut id))?;
        Ok(id)
    }

    /// Waits (up to `timeout`) for an adopted stream's work, then forgets it.
    /// Errors: `InvalidArgument` (not adopted), `Timeout`. Blocks.
    pub fn release_stream(&self, stream: u32, timeout: Duration) -> Result<()> {
        let rt = self.rt("release_stream")?;
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.check(unsafe { sys::ferry_release_stream(rt, stream, ms) })
    }

    /// [`Runtime::adopt_stream`] on device `device`: a stream id of that device, for
    /// the `*_on` stream calls. A native stream adopted on one device is refused on
    /// every other until released. Errors: `InvalidArgument` (no such device, null,
    /// adopted already on this or another device, one of ferry's).
    ///
    /// # Safety
    /// On cuda `native` must be a live `cudaStream_t` of that device until
    /// [`Runtime::release_stream_on`].
    pub unsafe fn adopt_stream_on(&self, device: u32, native: *mut c_void) -> Result<u32> {
        let rt = self.rt("adopt_stream_on")?;
        let mut id = 0u32;
        self.check(sys::ferry_device_adopt_stream(rt, device, native, &mut id))?;
        Ok(id)
    }

    /// [`Runtime::release_stream`] of a stream adopted on device `device`. Errors:
    /// `InvalidArgument` (no such device; not adopted on it), `Timeout`. Blocks.
    pub fn release_stream_on(&self, device: u32, stream: u32, timeout: Duration) -> Result<()> {
        let rt = self.rt("release_stream_on")?;
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        self.check(unsafe { sys::ferry_device_release_stream(rt, device, stream, ms) })
    }

    /// The pool's figures (device 0's).
    pub fn pool_stats(&self) -> Result<PoolStats> {
        self.pool_stats_on(0)
    }

    /// Device `device`'s pool figures. Errors: `InvalidArgument` (no such device).
    pub fn pool_stats_on(&self, device: u32) -> Result<PoolStats> {
        let rt = self.rt("pool_stats")?;
        let mut s = PoolStats::default();
        let size = std::mem::size_of::<PoolStats>();
        self.check(unsafe { sys::ferry_device_get_pool_stats_sized(rt, device, &mut s, size) })?;
        Ok(s)
    }

    /// The transfer engine's integrity figures (device 0's).
    pub fn integrity_stats(&self) -> Result<IntegrityStats> {
        self.integrity_stats_on(0)
    }

    /// Device `device`'s transfer engine figures. Errors: `InvalidArgument` (no such device).
    pub fn integrity_stats_on(&self, device: u32) -> Result<IntegrityStats> {
        let rt = self.rt("integrity_stats")?;
        let mut s = IntegrityStats::default();
        let size = std::mem::size_of::<IntegrityStats>();
        self.check(unsafe { sys::ferry_device_get_integrity_stats_sized(rt, device, &mut s, size) })?;
        Ok(s)
    }

    /// PyTorch's `memory_summary`, as text. Never blocks.
    pub fn memory_summary(&self) -> Result<String> {
        let rt = self.rt("memory_summary")?;
        let mut len = 0usize;
        self.check(unsafe { sys::ferry_memory_summary(rt, ptr::null_mut(), 0, &mut len) })?;
        loop {
            let mut buf = vec![0u8; len + 1];
            let mut full = 0usize;
            self.check(unsafe { sys::ferry_memory_summary(rt, buf.as_mut_ptr() as *mut _, buf.len(), &mut full) })?;
            if full <= len {
                buf.truncate(full);
                return Ok(String::from_utf8_lossy(&buf).into_owned());
            }
            len = full; // grew between the two calls
        }
    }

    /// The stream races found (sim with [`RuntimeBuilder::race_check`]): the first
    /// 64 kept, and the count of all. Errors: `Unsupported` (no race check).
    ///
    /// ```
    /// use ferry::Operand;
    /// let rt = ferry::Runtime::builder().profile("tiny").race_check(true).build()?;
    /// let kv = rt.alloc(4096, 0)?;
    /// kv.set_tag("kv")?;
    /// rt.launch(0, &[Operand::write(&kv)], |_| Ok(()))?;
    /// rt.launch(1, &[Operand::write(&kv)], |_| Ok(()))?; // no stream_wait(1, 0)
    /// rt.synchronize()?;
    /// let found = rt.races()?;
    /// assert_eq!(found.total, 1);
    /// assert_eq!(found.races[0].later.block_tag, "kv");
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn races(&self) -> Result<Races> {
        let rt = self.rt("races")?;
        const CAPACITY: u32 = 64;
        let mut raw: Vec<sys::ferry_race> = Vec::with_capacity(CAPACITY as usize);
        let (mut kept, mut total) = (0u32, 0u64);
        let size = std::mem::size_of::<sys::ferry_race>();
        self.check(unsafe { sys::ferry_get_races_sized(rt, raw.as_mut_ptr(), CAPACITY, size, &mut kept, &mut total) })?;
        unsafe { raw.set_len(kept.min(CAPACITY) as usize) };
        let side = |s: &sys::ferry_race_side, device: u32| RaceSide {
            device,
            stream: s.stream,
            ticket: s.ticket,
            kind: unsafe { text(s.kind) },
            tag: unsafe { text(s.tag) },
            access: Access::from_raw(s.access),
            block: Handle(s.block),
            block_tag: unsafe { text(s.block_tag) },
        };
        let races = raw
            .iter()
            .map(|r| Race {
                earlier: side(&r.earlier, r.earlier_device),
                later: side(&r.later, r.later_device),
                addr: r.addr,
                bytes: r.bytes,
                reuse: r.reuse != 0,
            })
            .collect();
        Ok(Races { races, total })
    }

    /// Declares cache entry `key` as `pieces`, uploaded back to back into one slot;
    /// the runtime keeps the bytes. Errors: `InvalidArgument` (no cache, duplicate
    /// key, no or empty piece).
    pub fn cache_define(&self, key: u64, pieces: Vec<Vec<u8>>) -> Result<()> {
        let rt = self.rt("cache_define")?;
        let ptrs: Vec<*const c_void> = pieces.iter().map(|p| p.as_ptr() as *const c_void).collect();
        let sizes: Vec<u64> = pieces.iter().map(|p| p.len() as u64).collect();
        let n = count("cache_define", pieces.len())?;
        let mut kept = lock(&self.shared.cache_pieces);
        self.check(unsafe { sys::ferry_cache_define(rt, key, ptrs.as_ptr(), sizes.as_ptr(), n) })?;
        // The Vecs' heap buffers do not move with them.
        kept.insert(key, pieces);
        Ok(())
    }

    /// Makes `key` resident, orders `stream` after its upload and pins it until the
    /// pin drops. Errors: `InvalidArgument`, `OutOfMemory` (every slot pinned),
    /// `TransferCorrupt`. Blocks.
    ///
    /// ```
    /// let rt = ferry::Runtime::builder().profile("tiny").cache(2, 0).build()?;
    /// rt.cache_define(7, vec![vec![1; 1024], vec![2; 512]])?;
    /// let pin = rt.cache_acquire(7, 0)?;
    /// assert_eq!(pin.offsets(), &[0, 1024]);
    /// assert!(!pin.hit());
    /// drop(pin);
    /// assert!(rt.cache_acquire(7, 0)?.hit());
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn cache_acquire(&self, key: u64, stream: u32) -> Result<CachePin<'_>> {
        let rt = self.rt("cache_acquire")?;
        let pieces = lock(&self.shared.cache_pieces).get(&key).map_or(0, |p| p.len());
        let mut offsets = vec![0u64; pieces.max(1)];
        let mut slot = sys::ferry_handle::default();
        let mut hit: c_int = 0;
        self.check(unsafe { sys::ferry_cache_acquire(rt, key, stream, &mut slot, offsets.as_mut_ptr(), &mut hit) })?;
        offsets.truncate(pieces);
        Ok(CachePin { rt: self, key, slot: Handle(slot), offsets, hit: hit != 0 })
    }

    pub fn cache_stats(&self) -> Result<CacheStats> {
        let rt = self.rt("cache_stats")?;
        let mut s = CacheStats::default();
        let size = std::mem::size_of::<CacheStats>();
        self.check(unsafe { sys::ferry_get_cache_stats_sized(rt, &mut s, size) })?;
        Ok(s)
    }

    /// Records the pool calls (alloc, free, upload, download, hold, synchronize,
    /// trim) to `path` in the replay format (`ferry replay FILE`) until
    /// [`Runtime::trace_stop`]. A runtime of several devices is refused
    /// (unsupported): the recorder writes device 0's calls only.
    pub fn trace_start(&self, path: &Path) -> Result<()> {
        let rt = self.rt("trace_start")?;
        use std::os::unix::ffi::OsStrExt;
        let p = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| invalid(format!("trace_start: {} contains a NUL byte", path.display())))?;
        self.check(unsafe { sys::ferry_trace_start(rt, p.as_ptr()) })
    }

    /// Flushes and closes the trace. Errors: `InvalidArgument` (not recording),
    /// `Backend` (a write failed).
    pub fn trace_stop(&self) -> Result<()> {
        let rt = self.rt("trace_stop")?;
        self.check(unsafe { sys::ferry_trace_stop(rt) })
    }
}

// ---------------------------------------------------------------- memory

/// A raw handle: a value, not a pointer. A freed, foreign or forged one is
/// [`Error::StaleHandle`] wherever it is used.
///
/// ```
/// let rt = ferry::Runtime::builder().profile("tiny").build()?;
/// let a = rt.alloc(64, 0)?;
/// let mut forged = a.handle();
/// forged.0.generation += 1;
/// assert!(matches!(rt.free(forged), Err(ferry::Error::StaleHandle(_))));
/// # Ok::<(), ferry::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Handle(pub sys::ferry_handle);

impl Handle {
    /// The null handle, {0,0,0}.
    pub const NULL: Handle = Handle(sys::ferry_handle { pool: 0, slot: 0, generation: 0 });
    pub fn is_null(&self) -> bool {
        *self == Handle::NULL
    }
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{pool {}, slot {}, generation {}}}", self.0.pool, self.0.slot, self.0.generation)
    }
}

/// A block of device memory; `Drop` frees it, stream-ordered (work already
/// enqueued on it keeps its lease). It borrows its [`Runtime`].
///
/// ```
/// let rt = ferry::Runtime::builder().profile("tiny").build()?;
/// let a = rt.alloc(100, 0)?;
/// assert_eq!(a.len(), 100);
/// a.set_tag("weights")?;
/// let h = a.into_handle();                         // no longer freed on drop
/// let a = ferry::Allocation::from_handle(&rt, h)?;  // owned again
/// drop(a);                                         // freed
/// assert!(matches!(ferry::Allocation::from_handle(&rt, h), Err(ferry::Error::StaleHandle(_))));
/// # Ok::<(), ferry::Error>(())
/// ```
#[derive(Debug)]
pub struct Allocation<'rt> {
    rt: &'rt Runtime,
    handle: Handle,
    device: u32,
    addr: u64,
    len: u64,
}

impl<'rt> Allocation<'rt> {
    /// Takes ownership of a live handle of `rt` (it will be freed on drop).
    /// Errors: `StaleHandle` (freed, foreign or forged). Two owners of one handle are
    /// safe: the second free finds it stale, even once its slot holds a new block.
    pub fn from_handle(rt: &'rt Runtime, handle: Handle) -> Result<Allocation<'rt>> {
        let (device, addr, len) = rt.address_of(handle)?;
        Ok(Allocation { rt, handle, device, addr, len })
    }

    /// The raw handle, no longer freed on drop ([`Runtime::free`] or
    /// [`Allocation::from_handle`] take it back).
    pub fn into_handle(self) -> Handle {
        let h = self.handle;
        std::mem::forget(self);
        h
    }

    /// The device the block is on.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// The raw handle, still owned by this allocation.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// The device address, for the program's own kernels (it carries no lease:
    /// [`Runtime::launch`] and [`Runtime::record_use`] do).
    pub fn device_address(&self) -> u64 {
        self.addr
    }

    /// The requested size in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: ferry refuses zero-byte blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Names the block in race reports; "" clears the name. Errors: `StaleHandle`.
    pub fn set_tag(&self, tag: &str) -> Result<()> {
        let rt = self.rt.rt("set_tag")?;
        let tag = c_string("set_tag", tag)?;
        self.rt.check(unsafe { sys::ferry_set_tag(rt, self.handle.0, tag.as_ptr()) })
    }

    /// Frees now, reporting an error `Drop` would swallow.
    pub fn free(self) -> Result<()> {
        let rt = self.rt;
        rt.free(self.into_handle())
    }
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        // A handle freed through a copy is stale by now: nothing else to do.
        let _ = self.rt.free(self.handle);
    }
}

// ---------------------------------------------------------------- launches

/// How an operation touches an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    ReadWrite,
}

impl Access {
    fn raw(self) -> u32 {
        match self {
            Access::Read => sys::FERRY_READ,
            Access::Write => sys::FERRY_WRITE,
            Access::ReadWrite => sys::FERRY_READ_WRITE,
        }
    }
    fn from_raw(raw: u32) -> Access {
        match raw {
            sys::FERRY_READ => Access::Read,
            sys::FERRY_WRITE => Access::Write,
            _ => Access::ReadWrite,
        }
    }
    fn writes(self) -> bool {
        self != Access::Read
    }
}

/// One operand of [`Runtime::launch`]: a block (or a range of it) and its access.
///
/// ```
/// let rt = ferry::Runtime::builder().profile("tiny").build()?;
/// let a = rt.alloc(64, 0)?;
/// rt.upload(0, &a, 0, &[1; 64])?;
/// rt.launch(0, &[ferry::Operand::read_write(&a).range(8, 4)], |ctx| {
///     ctx.view_mut(0)?.copy_from_slice(&[9; 4]);
///     Ok(())
/// })?;
/// let mut out = [0u8; 16];
/// rt.download(0, &a, 0, &mut out)?;
/// assert_eq!(out[7..13], [1, 9, 9, 9, 9, 1]);
/// # Ok::<(), ferry::Error>(())
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a> {
    raw: sys::ferry_operand,
    owner: Option<&'a Runtime>,
}

impl<'a> Operand<'a> {
    fn new(a: &'a Allocation<'_>, access: Access) -> Operand<'a> {
        let raw = sys::ferry_operand { handle: a.handle.0, offset: 0, bytes: 0, access: access.raw() };
        Operand { raw, owner: Some(a.rt) }
    }
    pub fn read(a: &'a Allocation<'_>) -> Operand<'a> {
        Operand::new(a, Access::Read)
    }
    pub fn write(a: &'a Allocation<'_>) -> Operand<'a> {
        Operand::new(a, Access::Write)
    }
    pub fn read_write(a: &'a Allocation<'_>) -> Operand<'a> {
        Operand::new(a, Access::ReadWrite)
    }
    /// A raw handle (a cache slot, one kept by the program); a stale one fails the launch.
    pub fn handle(handle: Handle, access: Access) -> Operand<'static> {
        let raw = sys::ferry_operand { handle: handle.0, offset: 0, bytes: 0, access: access.raw() };
        Operand { raw, owner: None }
    }
    /// Only `bytes` from `offset` (0 bytes: to the end of the block).
    pub fn range(mut self, offset: u64, bytes: u64) -> Operand<'a> {
        self.raw.offset = offset;
        self.raw.bytes = bytes;
        self
    }
}

type LaunchClosure = Box<dyn FnOnce(&mut LaunchContext<'_>) -> Result<()> + Send>;

struct PendingLaunch {
    shared: *const Shared,
    access: Vec<u32>,
    f: LaunchClosure,
}

unsafe extern "C" fn run_launch(ctx: *const sys::ferry_launch_context, user_data: *mut c_void) -> sys::ferry_status {
    let pending = user_data as *mut PendingLaunch;
    // The runtime (and so `shared`) lives until ferry_runtime_destroy has returned,
    // which waits for every launch.
    let shared = &*(*pending).shared;
    if !lock(&shared.pending).remove(&(pending as usize)) {
        return sys::FERRY_ERROR_BACKEND; // called twice: ferry's bug, never a double free
    }
    let pending = Box::from_raw(pending);
    let PendingLaunch { access, f, .. } = *pending;
    call_closure(shared, ctx, &access, move |c| f(c))
}

// Runs a launch closure as ferry's callback: the status for ferry, a failure's
// message kept for the stream fault it causes (Runtime::check).
unsafe fn call_closure<F>(shared: &Shared, ctx: *const sys::ferry_launch_context, access: &[u32], f: F)
    -> sys::ferry_status
where
    F: FnOnce(&mut LaunchContext<'_>) -> Result<()>,
{
    IN_LAUNCH.with(|flag| flag.set(true));
    // Unwinding into C is undefined behaviour: a panic stops here.
    let outcome = catch_unwind(AssertUnwindSafe(move || {
        let mut c = LaunchContext { raw: &*ctx, access };
        f(&mut c)
    }));
    IN_LAUNCH.with(|flag| flag.set(false));
    let err = match outcome {
        Ok(Ok(())) => return sys::FERRY_OK,
        Ok(Err(e)) => e,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-string payload".to_string());
            let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
            Error::Backend(format!("the launch closure panicked: {}", what))
        }
    };
    let status = err.status();
    let mut kept = lock(&shared.launch_errors);
    if kept.len() < KEPT_LAUNCH_ERRORS {
        kept.push(err);
    }
    status
}

/// What a launch closure gets, valid during the call only.
pub struct LaunchContext<'c> {
    raw: &'c sys::ferry_launch_context,
    access: &'c [u32],
}

impl fmt::Debug for LaunchContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchContext").field("operands", &self.operand_count()).finish()
    }
}

impl<'c> LaunchContext<'c> {
    /// The `cudaStream_t` to enqueue kernels on (cuda); null on sim.
    pub fn native_stream(&self) -> *mut c_void {
        self.raw.native_stream
    }

    pub fn operand_count(&self) -> usize {
        self.raw.operand_count as usize
    }

    fn at(&self, what: &str, i: usize) -> Result<usize> {
        if i < self.operand_count() {
            return Ok(i);
        }
        Err(invalid(format!("launch context: {} of operand {} of {}", what, i, self.operand_count())))
    }

    /// Operand `i`'s device address.
    pub fn device_address(&self, i: usize) -> Result<u64> {
        let i = self.at("device_address", i)?;
        Ok(unsafe { *self.raw.device_addresses.add(i) })
    }

    /// Operand `i`'s size in bytes.
    pub fn bytes(&self, i: usize) -> Result<u64> {
        let i = self.at("bytes", i)?;
        Ok(unsafe { *self.raw.bytes.add(i) })
    }

    /// True on sim, where the closure computes on host views of the operands.
    pub fn has_host_views(&self) -> bool {
        !self.raw.host_views.is_null()
    }

    fn host(&self, i: usize) -> Result<(*mut u8, usize)> {
        if !self.has_host_views() {
            return Err(Error::Unsupported("launch context: no host views on this backend (cuda)".to_string()));
        }
        let len = self.bytes(i)? as usize;
        Ok((unsafe { *self.raw.host_views.add(i) } as *mut u8, len))
    }

    /// sim: operand `i`'s bytes.
    pub fn view(&self, i: usize) -> Result<&[u8]> {
        let (p, len) = self.host(i)?;
        Ok(if len == 0 || p.is_null() { &[] } else { unsafe { std::slice::from_raw_parts(p, len) } })
    }

    /// sim: operand `i`'s bytes to write; `InvalidArgument` unless it was marked
    /// write or read-write.
    pub fn view_mut(&mut self, i: usize) -> Result<&mut [u8]> {
        let (p, len) = self.host(i)?;
        if !Access::from_raw(self.access[i]).writes() {
            return Err(invalid(format!("launch context: operand {} is read-only", i)));
        }
        Ok(if len == 0 || p.is_null() { &mut [] } else { unsafe { std::slice::from_raw_parts_mut(p, len) } })
    }

    /// sim: operand `input`'s bytes and operand `output`'s bytes to write, at once.
    /// `InvalidArgument` when they are the same operand, their bytes overlap, or
    /// `output` is read-only.
    pub fn input_output(&mut self, input: usize, output: usize) -> Result<(&[u8], &mut [u8])> {
        let (ip, ilen) = self.host(input)?;
        let (op, olen) = self.host(output)?;
        if !Access::from_raw(self.access[output]).writes() {
            return Err(invalid(format!("launch context: operand {} is read-only", output)));
        }
        let (i0, o0) = (ip as usize, op as usize);
        if input == output || (ilen > 0 && olen > 0 && i0 < o0 + olen && o0 < i0 + ilen) {
            return Err(invalid(format!("launch context: operands {} and {} share bytes", input, output)));
        }
        let i = if ilen == 0 || ip.is_null() { &[][..] } else { unsafe { std::slice::from_raw_parts(ip, ilen) } };
        let o = if olen == 0 || op.is_null() {
            &mut [][..]
        } else {
            unsafe { std::slice::from_raw_parts_mut(op, olen) }
        };
        Ok((i, o))
    }
}

// ---------------------------------------------------------------- guards

/// A held stream: work enqueued on it waits in a host-side queue until the guard
/// drops, which dispatches it.
#[derive(Debug)]
pub struct HoldGuard<'rt> {
    rt: &'rt Runtime,
    device: u32,
    stream: u32,
    released: bool,
}

impl HoldGuard<'_> {
    /// Releases now, reporting an error `Drop` would swallow.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        let rt = self.rt.rt("hold")?;
        self.rt.check(unsafe { hold_raw(rt, self.device, self.stream, 0) })
    }
}

impl Drop for HoldGuard<'_> {
    fn drop(&mut self) {
        if !self.released {
            if let Ok(rt) = self.rt.rt("hold") {
                unsafe { hold_raw(rt, self.device, self.stream, 0) };
            }
        }
    }
}

/// `ferry_hold` (device 0: the runtime's own call, traced as it is) or `ferry_device_hold`.
unsafe fn hold_raw(rt: sys::ferry_runtime, device: u32, stream: u32, hold: c_int) -> sys::ferry_status {
    if device == 0 {
        sys::ferry_hold(rt, stream, hold)
    } else {
        sys::ferry_device_hold(rt, device, stream, hold)
    }
}

/// A pinned cache entry; dropping it unpins (work already enqueued keeps its lease).
#[derive(Debug)]
pub struct CachePin<'rt> {
    rt: &'rt Runtime,
    key: u64,
    slot: Handle,
    offsets: Vec<u64>,
    hit: bool,
}

impl CachePin<'_> {
    /// The slot's block: use it with [`Operand::handle`].
    pub fn slot(&self) -> Handle {
        self.slot
    }
    /// Where each piece lies in the slot.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }
    /// True when no fetch was needed.
    pub fn hit(&self) -> bool {
        self.hit
    }
}

impl Drop for CachePin<'_> {
    fn drop(&mut self) {
        if let Ok(rt) = self.rt.rt("cache_release") {
            unsafe { sys::ferry_cache_release(rt, self.key) };
        }
    }
}

// ---------------------------------------------------------------- reports

pub type PoolStats = sys::ferry_pool_stats;
pub type IntegrityStats = sys::ferry_integrity_stats;
pub type CacheStats = sys::ferry_cache_stats;

/// One side of a [`Race`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaceSide {
    /// The device whose operation this side is (a peer copy reads its source on
    /// the destination's device).
    pub device: u32,
    pub stream: u32,
    pub ticket: u64,
    /// The operation: "fill", "copy_to_device", "user", ...
    pub kind: String,
    pub tag: String,
    pub access: Access,
    /// The pool block the bytes were when this side touched them (null: none).
    pub block: Handle,
    /// Its [`Allocation::set_tag`] name; "" when unnamed.
    pub block_tag: String,
}

/// Two accesses to overlapping device bytes from different streams, at least one a
/// write, with no happens-before between them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Race {
    pub earlier: RaceSide,
    pub later: RaceSide,
    pub addr: u64,
    pub bytes: u64,
    /// The sides' blocks differ: the bytes were freed and handed out again while
    /// the earlier side's work could still run.
    pub reuse: bool,
}

/// [`Runtime::races`]: the races kept (the first 64) and how many were found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Races {
    pub races: Vec<Race>,
    pub total: u64,
}
