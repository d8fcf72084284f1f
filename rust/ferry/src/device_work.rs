//! ferry's own device work (ferry.h "ferry's own device work"): fill, compute and
//! the asynchronous copy to the host, and a launch whose `Fn` closure a graph
//! keeps and calls at every replay ([`Runtime::launch_replayable`]).

use std::any::Any;
use std::fmt;
use std::os::raw::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use ferry_sys as sys;

use crate::{call_closure, count, invalid, lock, read, Allocation, Error, LaunchContext, Operand, Result, Runtime, Shared};

/// A heap value ferry reaches through a raw pointer (a host buffer it writes, a
/// closure it calls): held as a pointer, never as a `Box` that a move would
/// reassert unique, and freed as the `Box` it came from when this drops.
pub(crate) struct Lent<T: ?Sized>(NonNull<T>);

impl<T: ?Sized> Lent<T> {
    fn new(value: Box<T>) -> Lent<T> {
        Lent(NonNull::from(Box::leak(value)))
    }
    fn as_ptr(&self) -> *mut T {
        self.0.as_ptr()
    }
}

impl<T: ?Sized> Drop for Lent<T> {
    fn drop(&mut self) {
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

// A Lent owns its value as a Box would; the values lent here are Send + Sync.
unsafe impl<T: ?Sized + Send> Send for Lent<T> {}
unsafe impl<T: ?Sized + Sync> Sync for Lent<T> {}

impl Lent<[u8]> {
    // Only while nothing writes it: its op completed (a synchronize returned).
    pub(crate) fn bytes(&self) -> &[u8] {
        unsafe { &*self.as_ptr() }
    }
}

type ReplayClosure = Box<dyn Fn(&mut LaunchContext<'_>) -> Result<()> + Send + Sync>;

/// A launch a graph replays: ferry's user data for [`run_replay`].
struct ReplayLaunch {
    shared: *const Shared,
    access: Vec<u32>,
    f: ReplayClosure,
}

// `shared` is the runtime's, which outlives every callback (ferry_runtime_destroy waits for them).
unsafe impl Send for ReplayLaunch {}
unsafe impl Sync for ReplayLaunch {}

static CAPTURES: AtomicU64 = AtomicU64::new(1);

/// What a capture's recorded calls use at every replay, from begin_capture until
/// the graph is gone: uploads' bytes (read), copy_to_host's buffers (written),
/// replayable launches (called).
#[derive(Default)]
pub(crate) struct Kept {
    pub(crate) serial: u64,
    pub(crate) uploads: Vec<Box<[u8]>>,
    pub(crate) outs: Vec<Lent<[u8]>>,
    launches: Vec<Lent<ReplayLaunch>>,
}

impl Kept {
    pub(crate) fn new() -> Kept {
        Kept { serial: CAPTURES.fetch_add(1, Ordering::Relaxed), ..Kept::default() }
    }
}

/// Values ferry may still touch after their owner went, by device, each with the
/// mark it was retired under.
#[derive(Default)]
pub(crate) struct Retired {
    next: u64,
    items: Vec<(u32, u64, Box<dyn Any + Send>)>,
}

impl Runtime {
    // Kept until a synchronize of `device` that began after this returns: the work
    // that may touch it was enqueued before.
    pub(crate) fn retire(&self, device: u32, value: Box<dyn Any + Send>) {
        let mut r = lock(&self.shared.retired);
        let mark = r.next;
        r.next += 1;
        r.items.push((device, mark, value));
    }

    pub(crate) fn retired_mark(&self) -> u64 {
        lock(&self.shared.retired).next
    }

    pub(crate) fn drop_retired(&self, device: u32, before: u64) {
        let done: Vec<Box<dyn Any + Send>> = {
            let mut r = lock(&self.shared.retired);
            let (done, keep) = std::mem::take(&mut r.items)
                .into_iter()
                .partition(|(d, mark, _)| *d == device && *mark < before);
            r.items = keep;
            done.into_iter().map(|(_, _, v)| v).collect()
        };
        drop(done); // outside the lock
    }

    /// Writes the deterministic pattern of `seed` (the replay format's `fill`) into
    /// the whole of `dst`, on `stream` of its device; recorded on a capturing
    /// stream ([`crate::Graph`]). Errors: `StaleHandle`, `InvalidArgument` (bad
    /// stream). Never blocks.
    pub fn fill(&self, stream: u32, dst: &Allocation<'_>, seed: u64) -> Result<()> {
        let rt = self.rt("fill")?;
        self.same_runtime(dst)?;
        self.check(unsafe {
            if dst.device == 0 {
                sys::ferry_fill(rt, stream, dst.handle.0, seed)
            } else {
                sys::ferry_device_fill(rt, dst.device, stream, dst.handle.0, seed)
            }
        })
    }

    /// A kernel that writes into the whole of `output` a value that depends on
    /// every byte of every input (the replay format's `compute`), on `stream` of
    /// `output`'s device; recorded on a capturing stream. Errors: `StaleHandle` (an
    /// input of another device or runtime), `InvalidArgument` (bad stream). Never
    /// blocks.
    pub fn compute(&self, stream: u32, inputs: &[&Allocation<'_>], output: &Allocation<'_>) -> Result<()> {
        self.compute_with_cost(stream, inputs, output, 0.0, 0)
    }

    /// [`Runtime::compute`] with its modeled cost on sim.
    pub fn compute_with_cost(&self, stream: u32, inputs: &[&Allocation<'_>], output: &Allocation<'_>, flops: f64,
                             mem_bytes: u64) -> Result<()> {
        let rt = self.rt("compute")?;
        self.same_runtime(output)?;
        for a in inputs {
            self.same_runtime(a)?;
        }
        let handles: Vec<sys::ferry_handle> = inputs.iter().map(|a| a.handle.0).collect();
        let n = count("compute: inputs", handles.len())?;
        let (device, out) = (output.device, output.handle.0);
        self.check(unsafe {
            if device == 0 {
                sys::ferry_compute(rt, stream, handles.as_ptr(), n, out, flops, mem_bytes)
            } else {
                sys::ferry_device_compute(rt, device, stream, handles.as_ptr(), n, out, flops, mem_bytes)
            }
        })
    }

    /// Device -> host without a host wait: a buffer of `src.len()` bytes that the op
    /// writes when it completes. [`HostCopy::wait`] returns them. On a capturing
    /// stream the copy is recorded, the buffer is the graph's, and every replay
    /// writes it again: [`crate::Graph::read_copy`] reads it. Errors: `StaleHandle`,
    /// `InvalidArgument` (bad stream). Never blocks.
    ///
    /// ```
    /// let rt = ferry::Runtime::builder().profile("tiny").build()?;
    /// let a = rt.alloc(64, 0)?;
    /// rt.fill(0, &a, 7)?;
    /// let copy = rt.copy_to_host(0, &a)?;
    /// let bytes = copy.wait()?; // synchronizes
    /// let mut again = vec![0u8; 64];
    /// rt.download(0, &a, 0, &mut again)?;
    /// assert_eq!(bytes, again);
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn copy_to_host(&self, stream: u32, src: &Allocation<'_>) -> Result<HostCopy<'_>> {
        let rt = self.rt("copy_to_host")?;
        self.same_runtime(src)?;
        let len = usize::try_from(src.len).map_err(|_| invalid(format!("copy_to_host: {} bytes", src.len)))?;
        let buf = Lent::new(vec![0u8; len].into_boxed_slice());
        let (dst, bytes) = (buf.as_ptr() as *mut u8 as *mut c_void, len as u64);
        let (device, h) = (src.device, src.handle.0);
        let _gate = read(&self.shared.capture_gate);
        let mut capturing = lock(&self.shared.capturing);
        if device == 0 {
            if let Some(kept) = capturing.get_mut(&stream) {
                self.check(unsafe { sys::ferry_copy_to_host(rt, stream, h, dst, bytes) })?;
                kept.outs.push(buf);
                let at = Captured { serial: kept.serial, index: kept.outs.len() - 1 };
                return Ok(HostCopy { rt: self, device, state: State::Captured(at) });
            }
        }
        drop(capturing);
        self.check(unsafe {
            if device == 0 {
                sys::ferry_copy_to_host(rt, stream, h, dst, bytes)
            } else {
                sys::ferry_device_copy_to_host(rt, device, stream, h, dst, bytes)
            }
        })?;
        Ok(HostCopy { rt: self, device, state: State::Pending(Some(buf)) })
    }

    /// [`Runtime::launch`] with a closure a graph can keep: on a capturing stream of
    /// device 0 the launch is recorded and the graph calls `f` at every replay
    /// (it keeps `f` until it is destroyed and a [`Runtime::synchronize`] returned
    /// after that); elsewhere it runs once, as [`Runtime::launch`]. Errors: those
    /// of [`Runtime::launch`]. Never blocks.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// let rt = ferry::Runtime::builder().profile("tiny").build()?;
    /// let a = rt.alloc(16, 0)?;
    /// let runs = Arc::new(AtomicU32::new(0));
    /// let seen = runs.clone();
    /// rt.begin_capture(1, None)?;
    /// rt.launch_replayable(1, &[ferry::Operand::read_write(&a)], move |_| {
    ///     seen.fetch_add(1, Ordering::Relaxed);
    ///     Ok(())
    /// })?;
    /// let graph = rt.end_capture(1)?;
    /// for _ in 0..3 {
    ///     graph.launch(1)?;
    /// }
    /// rt.synchronize()?;
    /// assert_eq!(runs.load(Ordering::Relaxed), 3);
    /// # Ok::<(), ferry::Error>(())
    /// ```
    pub fn launch_replayable<F>(&self, stream: u32, operands: &[Operand<'_>], f: F) -> Result<()>
    where
        F: Fn(&mut LaunchContext<'_>) -> Result<()> + Send + Sync + 'static,
    {
        self.launch_replayable_with_cost(stream, operands, 0.0, 0, f)
    }

    /// [`Runtime::launch_replayable`] with the op's modeled cost on sim.
    pub fn launch_replayable_with_cost<F>(&self, stream: u32, operands: &[Operand<'_>], flops: f64, mem_bytes: u64,
                                          f: F) -> Result<()>
    where
        F: Fn(&mut LaunchContext<'_>) -> Result<()> + Send + Sync + 'static,
    {
        let rt = self.rt("launch_replayable")?;
        let _gate = read(&self.shared.capture_gate);
        let mut capturing = lock(&self.shared.capturing);
        let kept = match capturing.get_mut(&stream) {
            Some(kept) => kept,
            None => {
                drop(capturing);
                return self.launch_gated(rt, 0, stream, operands, flops, mem_bytes, move |c| f(c));
            }
        };
        let raw = self.operands_of("launch_replayable", operands)?;
        let n = count("launch_replayable: operands", raw.len())?;
        let launch = Lent::new(Box::new(ReplayLaunch {
            shared: &*self.shared,
            access: raw.iter().map(|o| o.access).collect(),
            f: Box::new(f),
        }));
        let user = launch.as_ptr() as *mut c_void;
        // Recorded, not run: ferry calls it back at each replay, never for a refused call.
        self.check(unsafe {
            sys::ferry_launch(rt, stream, raw.as_ptr(), n, Some(run_replay), user, flops, mem_bytes)
        })?;
        kept.launches.push(launch);
        Ok(())
    }
}

unsafe extern "C" fn run_replay(ctx: *const sys::ferry_launch_context, user_data: *mut c_void) -> sys::ferry_status {
    // The graph (or, once destroyed, the runtime's retired list) keeps it until no
    // replay can still call it.
    let launch = &*(user_data as *const ReplayLaunch);
    call_closure(&*launch.shared, ctx, &launch.access, |c| (launch.f)(c))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Captured {
    serial: u64,
    index: usize,
}

enum State {
    // Written by the op when it completes; None once taken.
    Pending(Option<Lent<[u8]>>),
    // Recorded in a capture: the graph holds the buffer.
    Captured(Captured),
}

/// The destination of a [`Runtime::copy_to_host`]. Uncaptured, it owns the buffer
/// the op writes: [`HostCopy::wait`] returns it, and dropping it unread leaves the
/// buffer to the runtime until the copy's device is synchronized. Captured, it
/// names the graph's buffer for [`crate::Graph::read_copy`].
pub struct HostCopy<'rt> {
    rt: &'rt Runtime,
    device: u32,
    state: State,
}

impl HostCopy<'_> {
    /// Whether the copy was recorded in a capture.
    pub fn is_captured(&self) -> bool {
        matches!(self.state, State::Captured(_))
    }

    /// Waits for the copy's device ([`Runtime::synchronize`], or
    /// [`Runtime::synchronize_device`] for another device), then returns the bytes.
    /// Errors: `InvalidArgument` (a captured copy: [`crate::Graph::read_copy`] reads
    /// it), those of the synchronize (a failed launch ordered before the copy:
    /// the bytes are not returned). Blocks.
    pub fn wait(mut self) -> Result<Vec<u8>> {
        if self.is_captured() {
            return Err(invalid("HostCopy::wait: the copy was captured; Graph::read_copy reads it".to_string()));
        }
        if self.device == 0 {
            self.rt.synchronize()?;
        } else {
            self.rt.synchronize_device(self.device)?;
        }
        let buf = match &mut self.state {
            State::Pending(buf) => buf.take(),
            State::Captured(_) => None,
        };
        // The synchronize returned: the op that wrote it completed.
        buf.map(|b| b.bytes().to_vec()).ok_or_else(|| Error::Backend("HostCopy::wait: no buffer".to_string()))
    }

    pub(crate) fn captured_in(&self, serial: u64) -> Option<usize> {
        match self.state {
            State::Captured(c) if c.serial == serial => Some(c.index),
            _ => None,
        }
    }
}

impl Drop for HostCopy<'_> {
    fn drop(&mut self) {
        if let State::Pending(Some(buf)) = std::mem::replace(&mut self.state, State::Pending(None)) {
            self.rt.retire(self.device, Box::new(buf)); // the op may not have written it yet
        }
    }
}

impl fmt::Debug for HostCopy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostCopy").field("device", &self.device).field("captured", &self.is_captured()).finish()
    }
}
