// fill, compute, copy_to_host and launch_replayable through the safe crate on sim:
// their bytes, a graph capturing them replayed with the right bytes each time, and
// the lifetimes of what a graph keeps (its closures, its host buffers).
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use ferry::{Error, Operand, Runtime};

const N: u64 = 4096;

fn sim() -> Runtime {
    Runtime::builder().profile("tiny").capacity(8 << 20).build().expect("a tiny sim runtime")
}

fn download(rt: &Runtime, a: &ferry::Allocation<'_>) -> Vec<u8> {
    let mut out = vec![0u8; a.len() as usize];
    rt.download(0, a, 0, &mut out).unwrap();
    out
}

// compute([fill(seed)]) made uncaptured.
fn reference(rt: &Runtime, seed: u64) -> Vec<u8> {
    let a = rt.alloc(N, 0).unwrap();
    let b = rt.alloc(N, 0).unwrap();
    rt.fill(0, &a, seed).unwrap();
    rt.compute_with_cost(0, &[&a], &b, 1e6, N).unwrap();
    download(rt, &b)
}

#[test]
fn fill_is_deterministic_and_compute_reads_every_input() {
    let rt = sim();
    let (a, b, c) = (rt.alloc(N, 0).unwrap(), rt.alloc(N, 0).unwrap(), rt.alloc(N, 0).unwrap());
    rt.fill(0, &a, 7).unwrap();
    rt.fill(0, &b, 7).unwrap();
    rt.fill(0, &c, 8).unwrap();
    assert_eq!(download(&rt, &a), download(&rt, &b));
    assert_ne!(download(&rt, &a), download(&rt, &c));
    assert_eq!(reference(&rt, 7), reference(&rt, 7));
    assert_ne!(reference(&rt, 7), reference(&rt, 8));
    let (o1, o2) = (rt.alloc(N, 0).unwrap(), rt.alloc(N, 0).unwrap());
    rt.compute(0, &[&a, &c], &o1).unwrap();
    rt.compute(0, &[&a, &b], &o2).unwrap();
    assert_ne!(download(&rt, &o1), download(&rt, &o2));
}

#[test]
fn copy_to_host_returns_the_blocks_bytes_after_its_wait() {
    let rt = sim();
    let a = rt.alloc(N, 0).unwrap();
    rt.fill(0, &a, 3).unwrap();
    let copy = rt.copy_to_host(0, &a).unwrap();
    assert!(!copy.is_captured());
    let unread = rt.copy_to_host(0, &a).unwrap();
    drop(unread); // the runtime keeps its buffer until the copy completed
    assert_eq!(copy.wait().unwrap(), download(&rt, &a));
    rt.free(a.handle()).unwrap(); // `a` is stale now (its drop finds it so)
    assert!(matches!(rt.fill(0, &a, 1), Err(Error::StaleHandle(_))));
    assert!(matches!(rt.copy_to_host(0, &a), Err(Error::StaleHandle(_))));
    let b = rt.alloc(N, 0).unwrap();
    assert!(matches!(rt.compute(0, &[&a], &b), Err(Error::StaleHandle(_))));
    assert!(matches!(rt.compute(0, &[&b], &a), Err(Error::StaleHandle(_))));
    assert!(matches!(rt.fill(64, &b, 1), Err(Error::InvalidArgument(_))));
    assert!(matches!(rt.copy_to_host(64, &b), Err(Error::InvalidArgument(_))));
    assert!(matches!(rt.compute(64, &[&b], &b), Err(Error::InvalidArgument(_))));
}

#[test]
fn a_graph_of_fill_compute_launch_and_copy_replays_with_the_right_bytes() {
    let rt = sim();
    let want_b = reference(&rt, 7);
    let acc = rt.alloc(N, 0).unwrap();
    rt.upload(0, &acc, 0, &vec![0u8; N as usize]).unwrap();

    rt.begin_capture(1, None).unwrap();
    let a = rt.alloc(N, 1).unwrap(); // the graph's private pool
    let b = rt.alloc(N, 1).unwrap();
    rt.fill(1, &a, 7).unwrap();
    rt.compute_with_cost(1, &[&a], &b, 1e6, N).unwrap();
    rt.launch_replayable(1, &[Operand::read(&b), Operand::read_write(&acc)], |c| {
        let (src, acc) = c.input_output(0, 1)?;
        for (x, s) in acc.iter_mut().zip(src) {
            *x = x.wrapping_add(1).wrapping_add(*s);
        }
        Ok(())
    })
    .unwrap();
    let acc_copy = rt.copy_to_host(1, &acc).unwrap();
    let b_copy = rt.copy_to_host(1, &b).unwrap();
    assert!(acc_copy.is_captured());
    drop(a);
    drop(b);
    let graph = rt.end_capture(1).unwrap();
    assert_eq!(graph.read_copy(&acc_copy).unwrap(), vec![0u8; N as usize]); // recorded, not run

    for k in 1..=200u32 {
        graph.launch(1).unwrap();
        assert_eq!(graph.read_copy(&b_copy).unwrap(), want_b, "replay {}", k);
        let want: Vec<u8> = want_b.iter().map(|&s| (k * (1 + s as u32)) as u8).collect();
        assert_eq!(graph.read_copy(&acc_copy).unwrap(), want, "replay {}", k);
    }
    assert!(matches!(acc_copy.wait(), Err(Error::InvalidArgument(m)) if m.contains("read_copy")));

    // A copy of another capture is not this graph's.
    rt.begin_capture(2, None).unwrap();
    let other = rt.copy_to_host(2, &acc).unwrap();
    let second = rt.end_capture(2).unwrap();
    assert!(matches!(graph.read_copy(&other), Err(Error::InvalidArgument(_))));
    assert!(second.read_copy(&other).is_ok());
    assert!(matches!(second.read_copy(&b_copy), Err(Error::InvalidArgument(_))));
}

#[test]
fn a_graph_keeps_its_closure_until_destroyed_and_synchronized() {
    let rt = sim();
    let a = rt.alloc(16, 0).unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let seen = runs.clone();
    rt.begin_capture(0, None).unwrap();
    rt.launch_replayable(0, &[Operand::write(&a)], move |_| {
        seen.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
    .unwrap();
    let graph = rt.end_capture(0).unwrap();
    assert_eq!(Arc::strong_count(&runs), 2);
    for _ in 0..5 {
        graph.launch(0).unwrap();
    }
    graph.destroy().unwrap(); // the replays may still run: the closure stays
    assert_eq!(Arc::strong_count(&runs), 2);
    rt.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::Relaxed), 5);
    assert_eq!(Arc::strong_count(&runs), 1);

    // Uncaptured, it runs once, as launch.
    let once = runs.clone();
    rt.launch_replayable(0, &[Operand::write(&a)], move |_| {
        once.fetch_add(1, Ordering::Relaxed);
        Ok(())
    })
    .unwrap();
    rt.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::Relaxed), 6);
}

#[test]
fn an_fnonce_launch_is_still_refused_in_a_capture_and_names_the_replayable_form() {
    let rt = sim();
    let a = rt.alloc(16, 0).unwrap();
    rt.begin_capture(0, None).unwrap();
    let r = rt.launch(0, &[Operand::write(&a)], |_| Ok(()));
    assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("launch_replayable")), "{:?}", r);
    rt.end_capture(0).unwrap();
}

#[test]
fn a_replayed_closure_that_fails_is_the_streams_fault() {
    let rt = sim();
    let a = rt.alloc(16, 0).unwrap();
    rt.begin_capture(0, None).unwrap();
    rt.launch_replayable(0, &[Operand::write(&a)], |_| panic!("bad replay")).unwrap();
    let graph = rt.end_capture(0).unwrap();
    graph.launch(0).unwrap();
    let err = rt.synchronize().unwrap_err();
    assert!(err.message().contains("panicked: bad replay"), "{}", err);
}

#[test]
fn each_call_acts_on_the_device_of_its_block() {
    let rt = Runtime::builder().profile("tiny").capacity(8 << 20).devices(2).build().unwrap();
    let a = rt.alloc_on(1, N, 0).unwrap();
    let b = rt.alloc_on(1, N, 0).unwrap();
    rt.fill(0, &a, 5).unwrap();
    rt.compute(0, &[&a], &b).unwrap();
    let bytes = rt.copy_to_host(0, &b).unwrap().wait().unwrap();
    let mut again = vec![0u8; N as usize];
    rt.download(0, &b, 0, &mut again).unwrap();
    assert_eq!(bytes, again);
    let on0 = rt.alloc(N, 0).unwrap();
    assert!(matches!(rt.compute(0, &[&on0], &b), Err(Error::StaleHandle(_))));
}
