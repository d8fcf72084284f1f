// Graph capture through the safe crate on sim: replays, a block freed outside the
// graph, what is refused, uploads and copies recorded, two graphs sharing a
// private pool, and Drop.
use ferry::{Error, Integrity, Operand, Runtime};

fn sim() -> Runtime {
    Runtime::builder().profile("tiny").capacity(8 << 20).build().expect("a tiny sim runtime")
}

#[test]
fn a_graph_replays_and_its_pool_goes_with_it() {
    let rt = sim();
    let weights = rt.alloc(4096, 0).unwrap();
    rt.begin_capture(1, None).unwrap();
    let scratch = rt.alloc(1024, 1).unwrap();
    rt.record_use(1, &[&weights, &scratch]).unwrap();
    let graph = rt.end_capture(1).unwrap();
    for _ in 0..1000 {
        graph.launch(1).unwrap();
    }
    rt.synchronize().unwrap();
    let summary = rt.memory_summary().unwrap();
    assert!(summary.contains("graph pool 1: 1 block(s)"), "{}", summary);
    drop(scratch); // the pool's until the graph goes
    graph.destroy().unwrap();
    assert!(!rt.memory_summary().unwrap().contains("graph pool"));
}

#[test]
fn a_block_freed_outside_the_graph_refuses_the_replay() {
    let rt = sim();
    let a = rt.alloc(4096, 0).unwrap();
    rt.begin_capture(0, None).unwrap();
    rt.record_use(0, &[&a]).unwrap();
    let graph = rt.end_capture(0).unwrap();
    graph.launch(0).unwrap();
    drop(a);
    match graph.launch(0) {
        Err(Error::StaleHandle(m)) => assert!(m.contains("freed outside it"), "{}", m),
        other => panic!("expected StaleHandle, got {:?}", other),
    }
}

#[test]
fn what_cannot_be_captured_is_refused() {
    let rt = sim();
    let a = rt.alloc(4096, 0).unwrap();
    rt.begin_capture(0, None).unwrap();
    let launch = rt.launch(0, &[Operand::write(&a)], |_| Ok(()));
    assert!(matches!(&launch, Err(Error::InvalidArgument(m)) if m.contains("FnOnce")), "{:?}", launch);
    let upload = rt.upload(0, &a, 0, &[1, 2, 3, 4]); // ferry's refusal: its compare needs the host
    assert!(matches!(&upload, Err(Error::InvalidArgument(m)) if m.contains("integrity policy is verify")), "{:?}", upload);
    rt.upload(1, &a, 0, &[1, 2, 3, 4]).unwrap(); // another stream runs as before
    let mut out = [0u8; 4];
    assert!(matches!(rt.download(0, &a, 0, &mut out), Err(Error::InvalidArgument(_)))); // ferry's refusal
    match rt.end_capture(0) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("spoiled"), "{}", m),
        other => panic!("expected a spoiled capture, got {:?}", other),
    }
    rt.launch(0, &[Operand::write(&a)], |_| Ok(())).unwrap(); // no longer capturing
    rt.synchronize().unwrap();
}

#[test]
fn two_graphs_share_a_private_pool() {
    let rt = sim();
    rt.begin_capture(0, None).unwrap();
    let a = rt.alloc(1 << 20, 0).unwrap();
    rt.record_use(0, &[&a]).unwrap();
    let first_handle = a.handle();
    drop(a); // deferred: the pool keeps the block for its captures
    let first = rt.end_capture(0).unwrap();
    rt.begin_capture(0, Some(&first)).unwrap();
    let b = rt.alloc(1 << 20, 0).unwrap(); // the same block under a new handle
    rt.record_use(0, &[&b]).unwrap();
    let second = rt.end_capture(0).unwrap();
    assert_ne!(b.handle(), first_handle);
    let summary = rt.memory_summary().unwrap();
    assert!(summary.contains("graph pool 1: 1 block(s)") && summary.contains("2 graph(s)"), "{}", summary);
    first.launch(0).unwrap();
    second.launch(0).unwrap();
    drop(first);
    drop(second);
    drop(b);
    rt.synchronize().unwrap();
}

#[test]
fn uploads_copies_and_record_use_are_replayed() {
    let rt = Runtime::builder().profile("tiny").capacity(8 << 20).integrity(Integrity::Off).build().unwrap();
    let (src, dst) = (rt.alloc(4096, 0).unwrap(), rt.alloc(4096, 0).unwrap());
    rt.upload(0, &dst, 0, &[0u8; 4096]).unwrap();
    rt.begin_capture(0, None).unwrap();
    let mut data = vec![5u8; 4096];
    rt.upload(0, &src, 0, &data).unwrap(); // over a copy the graph owns
    data.fill(9);
    drop(data);
    rt.copy_peer(0, &dst, 0, &src, 0, 4096).unwrap();
    rt.record_use(0, &[&src, &dst]).unwrap();
    let graph = rt.end_capture(0).unwrap();
    let mut out = vec![1u8; 4096];
    rt.download(0, &dst, 0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 0), "recorded, not run");
    for _ in 0..3 {
        rt.upload(0, &src, 0, &[7u8; 4096]).unwrap(); // each replay uploads its bytes again
        graph.launch(0).unwrap();
    }
    graph.destroy().unwrap();
    rt.download(0, &dst, 0, &mut out).unwrap();
    assert!(out.iter().all(|&b| b == 5), "{:?}", &out[..8]);
}

#[test]
fn a_copy_across_devices_spoils_the_capture() {
    let rt = Runtime::builder().profile("tiny").capacity(8 << 20).devices(2).integrity(Integrity::Off).build().unwrap();
    let (a, b) = (rt.alloc_on(0, 4096, 0).unwrap(), rt.alloc_on(1, 4096, 0).unwrap());
    rt.begin_capture(0, None).unwrap();
    let copy = rt.copy_peer(0, &b, 0, &a, 0, 4096);
    assert!(matches!(&copy, Err(Error::InvalidArgument(m)) if m.contains("copy_peer across devices")), "{:?}", copy);
    assert!(matches!(rt.end_capture(0), Err(Error::InvalidArgument(m)) if m.contains("spoiled")));
    rt.copy_peer(0, &b, 0, &a, 0, 4096).unwrap(); // no longer capturing
}
