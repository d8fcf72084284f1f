// The threaded capture-versus-copy fuzzer (issue 41): one thread makes the calls a
// capture records over host memory (copy_to_host, upload, launch,
// launch_replayable) on a stream another thread keeps beginning and ending
// captures on. Whatever the interleaving, safe code must not reach freed memory: a
// call ferry recorded must be one the crate kept for the graph. After the race the
// host heap is refilled with zeroed buffers and every graph replayed; a replay
// writing into memory the crate freed shows as a non-zero buffer (and as
// heap-use-after-free under the ASan build). Bounded: a fixed seed and count.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ferry::{Integrity, Operand, Runtime};

const LEN: usize = 4000;
const CALLS: u32 = 3000;
const MAX_CAPTURES: u32 = 4000;
const REFILLS: usize = 2048;

// xorshift64: the call mix is the same every run (the threads' interleaving is not).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn calls_racing_a_capture_never_leave_a_graph_writing_freed_memory() {
    let rt = Runtime::builder().profile("tiny").capacity(64 << 20).integrity(Integrity::Off).build().unwrap();
    let a = rt.alloc(LEN as u64, 0).unwrap();
    rt.fill(0, &a, 7).unwrap();
    rt.synchronize().unwrap();
    let stop = AtomicBool::new(false);
    let graphs = std::thread::scope(|s| {
        let caller = s.spawn(|| {
            let mut mix = Mix(0x9e37_79b9_7f4a_7c15);
            let mut copies = Vec::new();
            for i in 0..CALLS {
                // Refusals (a launch on a capturing stream, a capture spoiled
                // meanwhile) are expected; only memory safety is under test.
                match mix.next() % 4 {
                    0 => {
                        if let Ok(copy) = rt.copy_to_host(1, &a) {
                            copies.push(copy);
                        }
                    }
                    1 => {
                        let bytes = vec![i as u8; LEN];
                        let _ = rt.upload(1, &a, 0, &bytes);
                    }
                    2 => {
                        let state = Arc::new(vec![1u8; 64]);
                        let _ = rt.launch(1, &[Operand::read(&a)], move |_| {
                            assert_eq!(state[63], 1);
                            Ok(())
                        });
                    }
                    _ => {
                        let state = Arc::new(vec![2u8; 64]);
                        let _ = rt.launch_replayable(1, &[Operand::read(&a)], move |_| {
                            assert_eq!(state[63], 2);
                            Ok(())
                        });
                    }
                }
                if copies.len() > 64 {
                    copies.clear(); // dropped one-shots: their buffers retire to the next synchronize
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        let mut graphs = Vec::new();
        for _ in 0..MAX_CAPTURES {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if rt.begin_capture(1, None).is_ok() {
                if let Ok(g) = rt.end_capture(1) {
                    graphs.push(g);
                }
            }
        }
        caller.join().unwrap();
        graphs
    });
    // Every one-shot buffer and closure the crate handed out is dropped here.
    rt.synchronize().unwrap();
    let refills: Vec<Vec<u8>> = std::thread::spawn(|| (0..REFILLS).map(|_| vec![0u8; LEN]).collect()).join().unwrap();
    for g in &graphs {
        g.launch(1).unwrap();
    }
    rt.synchronize().unwrap();
    let dirty = refills.iter().filter(|v| v.iter().any(|&b| b != 0)).count();
    assert_eq!(dirty, 0, "{} of {} fresh buffers were written by a replay ({} graphs)", dirty, REFILLS, graphs.len());
}
