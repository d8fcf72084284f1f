//! Graph capture (`include/ferry/graph.hpp`, ferry.h "Graph capture"): a stream's
//! calls recorded once and replayed many times, over memory that stays the graph's
//! while it lives.

use std::fmt;
use std::ptr::{self, NonNull};

use ferry_sys as sys;

use crate::device_work::{HostCopy, Kept};
use crate::{invalid, lock, write, Result, Runtime};

/// A captured graph ([`Runtime::end_capture`]). It borrows its runtime, so it is
/// gone before the runtime is; `Drop` destroys it (`ferry_graph_destroy`, its error
/// ignored: [`Graph::destroy`] returns it).
///
/// What this crate lets a capture record: allocations on the capturing stream (the
/// graph's private pool: dropping one there defers its free until the pool's last
/// graph is gone, and a later allocation of a capture of that pool that fits gets
/// the block back, or a part of it when smaller), [`Runtime::record_use`], [`Runtime::copy_peer`] within
/// device 0 (a device-to-device copy) and [`Runtime::upload`] under
/// [`Integrity::Off`](crate::Integrity::Off), over a copy of its bytes that the graph owns
/// (the borrow ends with the call; each replay reads the copy),
/// [`Runtime::fill`], [`Runtime::compute`], [`Runtime::copy_to_host`] (each replay
/// writes the graph's host buffer again: [`Graph::read_copy`] reads it) and
/// [`Runtime::launch_replayable`] (the graph keeps its `Fn` closure and calls it at
/// every replay). [`Runtime::launch`] on a capturing stream is refused here: its
/// closure is `FnOnce`. What ferry cannot capture (a download, a
/// synchronize, a hold, a verified upload, a copy across devices) is refused by
/// ferry and spoils the capture.
///
/// ```
/// let rt = ferry::Runtime::builder().profile("tiny").build()?;
/// let weights = rt.alloc(4096, 0)?;
/// rt.begin_capture(1, None)?;
/// let scratch = rt.alloc(1024, 1)?; // the graph's private pool
/// rt.record_use(1, &[&weights, &scratch])?;
/// let graph = rt.end_capture(1)?;
/// for _ in 0..3 {
///     graph.launch(1)?;
/// }
/// drop(weights); // freed outside the graph: the next replay is refused
/// assert!(matches!(graph.launch(1), Err(ferry::Error::StaleHandle(_))));
/// # Ok::<(), ferry::Error>(())
/// ```
///
/// A graph cannot outlive its runtime (`ferry_graph_destroy` after
/// `ferry_runtime_destroy` is undefined in C): the borrow checker refuses it.
///
/// ```compile_fail
/// let graph = {
///     let rt = ferry::Runtime::builder().profile("tiny").build().unwrap();
///     rt.begin_capture(1, None).unwrap();
///     rt.end_capture(1).unwrap()
/// }; // error[E0597]: `rt` does not live long enough
/// graph.launch(1).unwrap();
/// ```
pub struct Graph<'rt> {
    rt: &'rt Runtime,
    raw: NonNull<sys::ferry_graph_s>,
    // What its replays read, write and call (uploads' bytes, copy_to_host's
    // buffers, replayable closures): retired to the runtime when the graph goes, and
    // dropped once a synchronize shows no replay of it still runs.
    kept: Kept,
}

impl Runtime {
    /// Records the calls on `stream` until [`Runtime::end_capture`]; `pool`: a graph
    /// whose private pool the capture shares (PyTorch's `pool=`), or `None` for a
    /// pool of its own. Errors: `InvalidArgument` (a bad or capturing stream, a pool
    /// another capture uses, a graph of another runtime). Never blocks.
    pub fn begin_capture(&self, stream: u32, pool: Option<&Graph<'_>>) -> Result<()> {
        let rt = self.rt("begin_capture")?;
        let share = match pool {
            Some(g) if !ptr::eq(g.rt, self) => {
                return Err(invalid("begin_capture: the pool's graph belongs to another runtime".to_string()))
            }
            Some(g) => g.raw.as_ptr(),
            None => ptr::null_mut(),
        };
        let _gate = write(&self.shared.capture_gate);
        self.check(unsafe { sys::ferry_begin_capture(rt, stream, share) })?;
        lock(&self.shared.capturing).insert(stream, Kept::new());
        Ok(())
    }

    /// The graph of what `stream` recorded. Errors: `InvalidArgument` (not
    /// capturing; the capture's first refused call, which spoiled it: no graph
    /// then). Never blocks.
    pub fn end_capture(&self, stream: u32) -> Result<Graph<'_>> {
        let rt = self.rt("end_capture")?;
        let mut out: sys::ferry_graph = ptr::null_mut();
        let gate = write(&self.shared.capture_gate);
        let status = unsafe { sys::ferry_end_capture(rt, stream, &mut out) };
        let kept = lock(&self.shared.capturing).remove(&stream).unwrap_or_default();
        drop(gate);
        // A spoiled capture's calls never run: what they would have used goes now.
        self.check(status)?;
        let raw = NonNull::new(out).ok_or_else(|| invalid("end_capture: ferry returned no graph".to_string()))?;
        Ok(Graph { rt: self, raw, kept })
    }

    pub(crate) fn refuse_if_capturing(&self, call: &str, stream: u32, why: &str) -> Result<()> {
        if lock(&self.shared.capturing).contains_key(&stream) {
            return Err(invalid(format!("{} on capturing stream {} is refused: {}", call, stream, why)));
        }
        Ok(())
    }
}

impl Graph<'_> {
    /// Enqueues the recorded calls on `stream`, in order; every block the graph
    /// touches is leased until this replay completes. Errors: `StaleHandle` (a
    /// block it touches was freed outside it: nothing enqueued), `InvalidArgument`
    /// (a bad or capturing stream). Never blocks.
    pub fn launch(&self, stream: u32) -> Result<()> {
        let rt = self.rt.rt("Graph::launch")?;
        self.rt.check(unsafe { sys::ferry_graph_launch(rt, self.raw.as_ptr(), stream) })
    }

    /// Destroys it now; when it was its pool's last graph, the pool frees the blocks
    /// the program freed, stream-ordered after the last replay. Errors:
    /// `StaleHandle` (the graph is gone all the same). Never blocks.
    pub fn destroy(mut self) -> Result<()> {
        let raw = self.raw.as_ptr();
        let rt = self.rt;
        let kept = std::mem::take(&mut self.kept);
        std::mem::forget(self);
        let status = unsafe { sys::ferry_graph_destroy(raw) };
        // Replays launched before may still run (ferry_graph_destroy does not wait).
        rt.retire(0, Box::new(kept));
        rt.check(status)
    }

    /// The bytes the last completed replay's [`Runtime::copy_to_host`] `copy`
    /// (recorded in this graph's capture) wrote: waits for the runtime's work
    /// ([`Runtime::synchronize`]), then copies them out. Zeros before the first
    /// replay. Errors: `InvalidArgument` (a copy not recorded in this graph's
    /// capture), those of [`Runtime::synchronize`] (nothing read). Blocks.
    pub fn read_copy(&self, copy: &HostCopy<'_>) -> Result<Vec<u8>> {
        let index = copy
            .captured_in(self.kept.serial)
            .ok_or_else(|| invalid("Graph::read_copy: the copy was not recorded in this graph's capture".to_string()))?;
        // Only this graph's replays write the buffer, and a Graph is used from one
        // thread: once the runtime's work completed, none is writing it.
        self.rt.synchronize()?;
        Ok(self.kept.outs[index].bytes().to_vec())
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        unsafe { sys::ferry_graph_destroy(self.raw.as_ptr()) };
        self.rt.retire(0, Box::new(std::mem::take(&mut self.kept)));
    }
}

impl fmt::Debug for Graph<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph").finish_non_exhaustive()
    }
}
