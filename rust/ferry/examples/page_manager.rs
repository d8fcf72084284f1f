//! A small cubecl-style memory manager on ferry: device pages by id, pages reused
//! (renumbered) after cleanup, and a deferred command queue flushed in order. A
//! command still bound to a page that cleanup freed and renumbered fails with an
//! `Err` at flush; a lookup of the old page is an `Err` too: never a panic, never
//! another page's memory.
//!
//!     cargo run --example page_manager
//!
//! Exit 0 when the command flushed before cleanup read the right bytes and both
//! stale uses were refused; 1 otherwise. Runs on sim.
use std::collections::HashMap;
use std::process::ExitCode;

use ferry::{Access, Allocation, Error, Handle, LaunchContext, Operand, Runtime};

/// A client's reference to a page: its id and the block it had when handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PageRef {
    id: u32,
    handle: Handle,
}

type Kernel = Box<dyn FnOnce(&mut LaunchContext<'_>) -> ferry::Result<()> + Send>;

struct Command {
    bindings: Vec<(PageRef, Access)>,
    kernel: Kernel,
}

struct PageManager<'rt> {
    rt: &'rt Runtime,
    page_bytes: u64,
    pages: HashMap<u32, Allocation<'rt>>,
    released: Vec<u32>,
    free_ids: Vec<u32>,
    next_id: u32,
    queue: Vec<Command>,
}

impl<'rt> PageManager<'rt> {
    fn new(rt: &'rt Runtime, page_bytes: u64) -> Self {
        PageManager {
            rt,
            page_bytes,
            pages: HashMap::new(),
            released: Vec::new(),
            free_ids: Vec::new(),
            next_id: 0,
            queue: Vec::new(),
        }
    }

    /// A page, reusing the lowest id cleanup gave back.
    fn reserve(&mut self) -> ferry::Result<PageRef> {
        let block = self.rt.alloc(self.page_bytes, 0)?;
        self.free_ids.sort_unstable_by(|a, b| b.cmp(a));
        let id = self.free_ids.pop().unwrap_or_else(|| {
            self.next_id += 1;
            self.next_id - 1
        });
        let page = PageRef { id, handle: block.handle() };
        self.pages.insert(id, block);
        Ok(page)
    }

    /// The page behind a reference: `StaleHandle` when its id was renumbered.
    fn page(&self, page: PageRef) -> ferry::Result<&Allocation<'rt>> {
        match self.pages.get(&page.id) {
            Some(block) if block.handle() == page.handle => Ok(block),
            _ => Err(Error::StaleHandle(format!("page {} ({}) was cleaned up", page.id, page.handle))),
        }
    }

    /// The client is done with the page; cleanup frees it.
    fn release(&mut self, page: PageRef) {
        self.released.push(page.id);
    }

    /// Frees released pages (stream-ordered: flushed commands keep their leases).
    fn cleanup(&mut self) {
        for id in self.released.drain(..) {
            if self.pages.remove(&id).is_some() {
                self.free_ids.push(id);
            }
        }
    }

    fn enqueue<F>(&mut self, bindings: &[(PageRef, Access)], kernel: F)
    where
        F: FnOnce(&mut LaunchContext<'_>) -> ferry::Result<()> + Send + 'static,
    {
        self.queue.push(Command { bindings: bindings.to_vec(), kernel: Box::new(kernel) });
    }

    /// Launches the queued commands in order, each with its pages' raw handles (as a
    /// lazy queue keeps them): ferry checks each at launch. One result per command.
    fn flush(&mut self, stream: u32) -> Vec<ferry::Result<()>> {
        let rt = self.rt;
        self.queue
            .drain(..)
            .map(|c| {
                let operands: Vec<Operand<'_>> =
                    c.bindings.iter().map(|(p, access)| Operand::handle(p.handle, *access)).collect();
                rt.launch(stream, &operands, c.kernel)
            })
            .collect()
    }
}

fn copy(ctx: &mut LaunchContext<'_>) -> ferry::Result<()> {
    let (src, dst) = ctx.input_output(0, 1)?;
    dst.copy_from_slice(src);
    Ok(())
}

fn run() -> ferry::Result<bool> {
    const PAGE: u64 = 1 << 20;
    let rt = Runtime::builder().profile("tiny").capacity(8 * PAGE).build()?;
    let mut pages = PageManager::new(&rt, PAGE);
    let a = pages.reserve()?;
    let b = pages.reserve()?;
    let data: Vec<u8> = (0..PAGE as usize).map(|i| (i % 251) as u8).collect();
    rt.upload(0, pages.page(a)?, 0, &data)?;

    // A command queued, flushed into a held stream, then its source page cleaned up
    // and its id handed out again before the stream runs.
    let held = rt.hold(0)?;
    pages.enqueue(&[(a, Access::Read), (b, Access::Write)], copy);
    let flushed = pages.flush(0);
    pages.release(a);
    pages.cleanup();
    let renumbered = pages.reserve()?;
    rt.upload(1, pages.page(renumbered)?, 0, &vec![0xEE; PAGE as usize])?;
    held.release()?;
    let mut got = vec![0u8; PAGE as usize];
    rt.download(0, pages.page(b)?, 0, &mut got)?;
    let right = flushed.iter().all(|r| r.is_ok()) && got == data;
    println!(
        "page_manager: page {} renumbered (was {}, now {}); the flushed command read {}",
        a.id,
        a.handle,
        renumbered.handle,
        if right { "the right bytes" } else { "WRONG BYTES" }
    );

    // The old reference, looked up and bound to a new command: both are errors.
    let lookup = pages.page(a).map(|_| ());
    println!("page_manager: lookup of the old page {}: {:?}", a.id, lookup);
    pages.enqueue(&[(a, Access::Read), (b, Access::Write)], copy);
    let stale = pages.flush(0).pop().expect("one command");
    println!("page_manager: a command bound to the old page: {:?}", stale);
    let refused = matches!(lookup, Err(Error::StaleHandle(_))) && matches!(stale, Err(Error::StaleHandle(_)));
    rt.synchronize()?;
    Ok(right && refused)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("page_manager: {}", e);
            ExitCode::FAILURE
        }
    }
}
