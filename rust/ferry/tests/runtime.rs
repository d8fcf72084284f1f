// Every safe call of the ferry crate on sim, its error paths, threads, launch
// closures that fail or panic, and a race found by the race checker.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use ferry::{Access, Allocation, Error, Handle, Integrity, Operand, Runtime};

fn tiny() -> Runtime {
    Runtime::builder().profile("tiny").capacity(8 << 20).build().expect("a tiny sim runtime")
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn plus_one(rt: &Runtime, stream: u32, src: &Allocation<'_>, dst: &Allocation<'_>) -> ferry::Result<()> {
    rt.launch(stream, &[Operand::read(src), Operand::write(dst)], |ctx| {
        let (input, output) = ctx.input_output(0, 1)?;
        for (o, i) in output.iter_mut().zip(input) {
            *o = i.wrapping_add(1);
        }
        Ok(())
    })
}

#[test]
fn builder_takes_every_option() {
    let rt = Runtime::builder()
        .backend(ferry::Backend::Sim)
        .profile("rtx4090")
        .capacity(64 << 20)
        .seed(7)
        .integrity(Integrity::Probe)
        .cache(2, 4096)
        .race_check(true)
        .build()
        .unwrap();
    assert_eq!(rt.backend(), ferry::Backend::Sim);
    assert!(rt.races().unwrap().races.is_empty());
    for integrity in [Integrity::Off, Integrity::Probe, Integrity::Verify] {
        let rt = Runtime::builder().profile("tiny").integrity(integrity).build().unwrap();
        let a = rt.alloc(64, 0).unwrap();
        rt.upload(0, &a, 0, &[9; 64]).unwrap();
    }
    assert!(format!("{:?}", rt).contains("Sim"));
}

#[test]
fn builder_refuses_bad_options() {
    let err = Runtime::builder().profile("no-such-gpu").build().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{}", err);
    assert!(err.message().contains("no-such-gpu"), "{}", err);
    let err = Runtime::builder().profile("ti\0ny").build().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{}", err);
    let err = Runtime::builder().profile("tiny").inject("not a fault spec").build().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{}", err);
    let err = Runtime::builder().backend(ferry::Backend::Cuda).inject("pinned-noop").build().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_) | Error::Unsupported(_)), "{}", err);
}

#[test]
fn upload_launch_download_round_trip() {
    let rt = tiny();
    let data = pattern(4096, 3);
    let a = rt.alloc(4096, 0).unwrap();
    let b = rt.alloc(4096, 0).unwrap();
    assert_eq!(a.len(), 4096);
    assert!(!a.is_empty());
    assert_ne!(a.device_address(), b.device_address());
    a.set_tag("input").unwrap();
    a.set_tag("").unwrap();
    rt.upload(1, &a, 0, &data).unwrap();
    rt.stream_wait(0, 1).unwrap();
    plus_one(&rt, 0, &a, &b).unwrap();
    drop(a); // stream-ordered: the launch holds the block
    let mut out = vec![0u8; 4096];
    rt.download(0, &b, 0, &mut out).unwrap();
    let want: Vec<u8> = data.iter().map(|x| x.wrapping_add(1)).collect();
    assert_eq!(out, want);
    // A partial range, both ways.
    rt.upload(0, &b, 100, &[0xAB; 10]).unwrap();
    let mut part = [0u8; 12];
    rt.download(0, &b, 99, &mut part).unwrap();
    assert_eq!(part[0], want[99]);
    assert_eq!(&part[1..11], &[0xAB; 10]);
    assert_eq!(part[11], want[110]);
    rt.synchronize().unwrap();
    rt.trim().unwrap();
}

#[test]
fn launch_ranges_and_context_accessors() {
    let rt = tiny();
    let a = rt.alloc(256, 0).unwrap();
    rt.upload(0, &a, 0, &pattern(256, 1)).unwrap();
    let (tx, rx) = mpsc::channel();
    let addr = a.device_address();
    rt.launch_with_cost(0, &[Operand::read_write(&a).range(16, 32), Operand::read(&a)], 1e6, 64, move |ctx| {
        tx.send((
            ctx.operand_count(),
            ctx.device_address(0).unwrap(),
            ctx.bytes(0).unwrap(),
            ctx.bytes(1).unwrap(),
            ctx.native_stream().is_null(),
            ctx.has_host_views(),
            ctx.view(1).unwrap().len(),
            ctx.device_address(2).is_err(),
            ctx.view_mut(1).is_err(),       // read-only
            ctx.input_output(0, 0).is_err(), // the same operand twice
        ))
        .unwrap();
        ctx.view_mut(0)?.iter_mut().for_each(|b| *b = 0);
        Ok(())
    })
    .unwrap();
    rt.synchronize().unwrap();
    let got = rx.recv().unwrap();
    assert_eq!(got, (2, addr + 16, 32, 256, true, true, 256, true, true, true));
    let mut out = vec![0u8; 256];
    rt.download(0, &a, 0, &mut out).unwrap();
    let mut want = pattern(256, 1);
    want[16..48].iter_mut().for_each(|b| *b = 0);
    assert_eq!(out, want);
}

#[test]
fn handles_round_trip_and_stale_ones_are_errors() {
    let rt = tiny();
    let other = tiny();
    let a = rt.alloc(1024, 0).unwrap();
    let addr = a.device_address();
    let h = a.into_handle();
    assert!(!h.is_null());
    assert!(h.to_string().starts_with("{pool "), "{}", h);
    let a = Allocation::from_handle(&rt, h).unwrap();
    assert_eq!((a.device_address(), a.len()), (addr, 1024));
    a.free().unwrap();
    // Freed: stale everywhere, never another block.
    assert!(matches!(Allocation::from_handle(&rt, h), Err(Error::StaleHandle(_))));
    assert!(matches!(rt.free(h), Err(Error::StaleHandle(_))));
    let err = rt.launch(0, &[Operand::handle(h, Access::Read)], |_| Ok(())).unwrap_err();
    assert!(matches!(err, Error::StaleHandle(_)), "{}", err);
    // A new block in the same place: the old handle still names nothing.
    let b = rt.alloc(1024, 0).unwrap();
    assert!(matches!(Allocation::from_handle(&rt, h), Err(Error::StaleHandle(_))));
    // Forged and null handles.
    let mut forged = b.handle();
    forged.0.generation += 7;
    assert!(matches!(Allocation::from_handle(&rt, forged), Err(Error::StaleHandle(_))));
    assert!(matches!(Allocation::from_handle(&rt, Handle::NULL), Err(Error::StaleHandle(_))));
    // Another runtime's block.
    let c = other.alloc(1024, 0).unwrap();
    assert!(matches!(rt.upload(0, &c, 0, &[1]), Err(Error::StaleHandle(_))));
    assert!(matches!(rt.download(0, &c, 0, &mut [0]), Err(Error::StaleHandle(_))));
    assert!(matches!(rt.record_use(0, &[&c]), Err(Error::StaleHandle(_))));
    assert!(matches!(rt.launch(0, &[Operand::read(&c)], |_| Ok(())), Err(Error::StaleHandle(_))));
    assert!(matches!(Allocation::from_handle(&rt, c.handle()), Err(Error::StaleHandle(_))));
}

#[test]
fn zero_size_out_of_range_and_bad_streams_are_errors() {
    let rt = tiny();
    let is_invalid = |r: ferry::Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(matches!(rt.alloc(0, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(rt.alloc(64, 64), Err(Error::InvalidArgument(_))));
    let a = rt.alloc(64, 0).unwrap();
    assert!(is_invalid(rt.upload(0, &a, 0, &[])));
    assert!(is_invalid(rt.upload(0, &a, 60, &[0; 8])));
    assert!(is_invalid(rt.download(0, &a, 64, &mut [0; 1])));
    assert!(is_invalid(rt.download(0, &a, 0, &mut [])));
    assert!(is_invalid(rt.upload(64, &a, 0, &[1])));
    assert!(is_invalid(rt.launch(0, &[Operand::read(&a).range(32, 64)], |_| Ok(()))));
    assert!(is_invalid(rt.launch(64, &[Operand::read(&a)], |_| Ok(()))));
    assert!(is_invalid(rt.stream_wait(64, 0)));
    assert!(is_invalid(rt.stream_wait(0, 64)));
    assert!(is_invalid(rt.hold(64).map(|_| ())));
    assert!(rt.native_stream(64).is_err());
    assert!(is_invalid(rt.record_use(64, &[&a])));
    let err = a.set_tag("a\0b").unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    // Out of memory: the message is the pool's diagnostic.
    let err = rt.alloc(1 << 40, 0).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{}", err);
    assert!(err.to_string().starts_with("out_of_memory: "), "{}", err);
    assert!(rt.pool_stats().unwrap().ooms >= 1);
    rt.synchronize().unwrap();
}

#[test]
fn errors_map_every_status_both_ways() {
    let codes = [
        (ferry_sys::FERRY_ERROR_OUT_OF_MEMORY, "out_of_memory"),
        (ferry_sys::FERRY_ERROR_STALE_HANDLE, "stale_handle"),
        (ferry_sys::FERRY_ERROR_INVALID_ARGUMENT, "invalid_argument"),
        (ferry_sys::FERRY_ERROR_TRANSFER_CORRUPT, "transfer_corrupt"),
        (ferry_sys::FERRY_ERROR_BACKEND, "backend_error"),
        (ferry_sys::FERRY_ERROR_UNSUPPORTED, "unsupported"),
        (ferry_sys::FERRY_ERROR_TIMEOUT, "timeout"),
    ];
    for (status, name) in codes {
        let e = Error::from_status(status, "why".to_string());
        assert_eq!(e.status(), status);
        assert_eq!(e.name(), name);
        assert_eq!(e.message(), "why");
        assert_eq!(e.to_string(), format!("{}: why", name));
    }
    assert!(matches!(Error::from_status(99, String::new()), Error::Backend(_)));
    let boxed: Box<dyn std::error::Error> = Box::new(Error::Timeout("t".into()));
    assert_eq!(boxed.to_string(), "timeout: t");
}

#[test]
fn a_failing_closure_is_the_ops_error_with_its_message() {
    let rt = tiny();
    let a = rt.alloc(64, 0).unwrap();
    rt.launch(2, &[Operand::write(&a)], |_| Err(Error::InvalidArgument("input shape 3x5 is not 4x4".into())))
        .unwrap();
    let err = rt.synchronize().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{}", err);
    assert!(err.message().contains("input shape 3x5 is not 4x4"), "{}", err);
    // Sticky: every later wait says so.
    assert!(rt.synchronize().is_err());
}

#[test]
fn a_panicking_closure_is_caught_and_becomes_the_ops_error() {
    let rt = tiny();
    let a = rt.alloc(64, 0).unwrap();
    let b = rt.alloc(64, 0).unwrap();
    rt.upload(0, &b, 0, &[5; 64]).unwrap();
    rt.launch(3, &[Operand::read_write(&a)], |_| panic!("boom at row {}", 12)).unwrap();
    let err = rt.synchronize().unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{}", err);
    assert!(err.message().contains("the launch closure panicked: boom at row 12"), "{}", err);
    // The process and the other streams go on.
    let mut out = [0u8; 64];
    rt.download(0, &b, 0, &mut out).unwrap();
    assert_eq!(out, [5; 64]);
}

#[test]
fn a_closure_that_calls_ferry_gets_an_error() {
    let rt = Arc::new(tiny());
    let a = rt.alloc(64, 0).unwrap().into_handle();
    let inner = Arc::clone(&rt);
    let (tx, rx) = mpsc::channel();
    rt.launch(0, &[Operand::handle(a, Access::Write)], move |_| {
        tx.send(inner.trim()).unwrap();
        Ok(())
    })
    .unwrap();
    rt.synchronize().unwrap();
    let err = rx.recv().unwrap().unwrap_err();
    assert!(err.message().contains("inside a launch closure"), "{}", err);
    rt.free(a).unwrap();
}

#[test]
fn hold_queues_work_until_the_guard_drops() {
    let rt = tiny();
    let a = rt.alloc(64, 0).unwrap();
    let b = rt.alloc(64, 0).unwrap();
    let ran = Arc::new(AtomicBool::new(false));
    let guard = rt.hold(1).unwrap();
    let flag = Arc::clone(&ran);
    rt.launch(1, &[Operand::write(&a)], move |_| {
        flag.store(true, Ordering::SeqCst);
        Ok(())
    })
    .unwrap();
    let mut out = [0u8; 64];
    rt.upload(0, &b, 0, &[1; 64]).unwrap();
    rt.download(0, &b, 0, &mut out).unwrap(); // waits for stream 0 only
    assert!(!ran.load(Ordering::SeqCst), "a held stream's launch ran");
    drop(guard);
    rt.synchronize().unwrap();
    assert!(ran.load(Ordering::SeqCst));
    let guard = rt.hold(1).unwrap();
    guard.release().unwrap();
}

#[test]
fn record_use_and_adopted_streams() {
    let rt = tiny();
    let a = rt.alloc(4096, 0).unwrap();
    rt.upload(0, &a, 0, &pattern(4096, 9)).unwrap();
    rt.record_use(1, &[&a]).unwrap();
    rt.record_use(1, &[]).unwrap();
    drop(a);
    rt.synchronize().unwrap();
    assert!(!rt.native_stream(0).unwrap().is_null());

    let token = Box::new(0u64); // the sim runs no native work: any unique address
    let native = &*token as *const u64 as *mut std::os::raw::c_void;
    let s = unsafe { rt.adopt_stream(native) }.unwrap();
    assert!(matches!(unsafe { rt.adopt_stream(native) }, Err(Error::InvalidArgument(_))));
    assert!(matches!(unsafe { rt.adopt_stream(std::ptr::null_mut()) }, Err(Error::InvalidArgument(_))));
    let own = rt.native_stream(0).unwrap();
    assert!(matches!(unsafe { rt.adopt_stream(own) }, Err(Error::InvalidArgument(_))));
    let b = rt.alloc(64, s).unwrap();
    rt.upload(s, &b, 0, &[3; 64]).unwrap();
    drop(b);
    rt.release_stream(s, Duration::from_secs(10)).unwrap();
    assert!(matches!(rt.release_stream(s, Duration::from_secs(1)), Err(Error::InvalidArgument(_))));
}

#[test]
fn stats_and_memory_summary() {
    let rt = tiny();
    let before = rt.pool_stats().unwrap();
    let a = rt.alloc(1 << 20, 0).unwrap();
    rt.upload(0, &a, 0, &vec![1u8; 1 << 20]).unwrap();
    let s = rt.pool_stats().unwrap();
    assert_eq!(s.allocs, before.allocs + 1);
    assert!(s.allocated_bytes >= 1 << 20 && s.peak_allocated_bytes >= s.allocated_bytes);
    let i = rt.integrity_stats().unwrap();
    assert!(i.bytes_verified >= 1 << 20, "{:?}", i);
    // The library filled the whole of each struct (the sized getters got size_of).
    assert_eq!(s.struct_size, std::mem::size_of::<ferry::PoolStats>());
    assert_eq!(i.struct_size, std::mem::size_of::<ferry::IntegrityStats>());
    let summary = rt.memory_summary().unwrap();
    assert!(!summary.is_empty());
    drop(a);
    rt.synchronize().unwrap();
    assert_eq!(rt.pool_stats().unwrap().frees, before.frees + 1);
}

#[test]
fn the_cache_pins_and_hits() {
    let rt = Runtime::builder().profile("tiny").cache(2, 0).build().unwrap();
    for key in 0..3u64 {
        rt.cache_define(key, vec![vec![key as u8 + 1; 1024], vec![key as u8 + 10; 3072]]).unwrap();
    }
    assert!(matches!(rt.cache_define(0, vec![vec![1]]), Err(Error::InvalidArgument(_))));
    assert!(matches!(rt.cache_define(9, vec![]), Err(Error::InvalidArgument(_))));
    let out = rt.alloc(3072, 0).unwrap();
    {
        let pin = rt.cache_acquire(1, 0).unwrap();
        assert!(!pin.hit());
        assert_eq!(pin.offsets().len(), 2);
        let piece = Operand::handle(pin.slot(), Access::Read).range(pin.offsets()[1], 3072);
        rt.launch(0, &[piece, Operand::write(&out)], |ctx| {
            let (i, o) = ctx.input_output(0, 1)?;
            o.copy_from_slice(i);
            Ok(())
        })
        .unwrap();
    }
    let mut back = vec![0u8; 3072];
    rt.download(0, &out, 0, &mut back).unwrap();
    assert_eq!(back, vec![11u8; 3072]);
    assert!(rt.cache_acquire(1, 0).unwrap().hit());
    let stats = rt.cache_stats().unwrap();
    assert_eq!((stats.hits, stats.misses, stats.uploads), (1, 1, 1));
    assert!(matches!(tiny().cache_acquire(0, 0), Err(Error::InvalidArgument(_))));
}

#[test]
fn trace_records_the_pool_calls() {
    let rt = tiny();
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ferry-rust-trace.jsonl");
    rt.trace_start(&path).unwrap();
    assert!(matches!(rt.trace_start(&path), Err(Error::InvalidArgument(_))));
    let a = rt.alloc(4096, 0).unwrap();
    rt.upload(0, &a, 0, &[1; 4096]).unwrap();
    drop(a);
    rt.trace_stop().unwrap();
    assert!(matches!(rt.trace_stop(), Err(Error::InvalidArgument(_))));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().count() >= 4, "{}", text);
    assert!(text.contains("alloc") && text.contains("free"), "{}", text);
}

#[test]
fn four_threads_share_one_runtime() {
    let rt = tiny();
    let launches = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..4u32 {
            let (rt, launches) = (&rt, &launches);
            scope.spawn(move || {
                for round in 0..8u8 {
                    let data = pattern(2048, t as u8 * 50 + round);
                    let a = rt.alloc(2048, t).unwrap();
                    let b = rt.alloc(2048, t).unwrap();
                    rt.upload(t, &a, 0, &data).unwrap();
                    plus_one(rt, t, &a, &b).unwrap();
                    launches.fetch_add(1, Ordering::Relaxed);
                    drop(a);
                    let mut out = vec![0u8; 2048];
                    rt.download(t, &b, 0, &mut out).unwrap();
                    let want: Vec<u8> = data.iter().map(|x| x.wrapping_add(1)).collect();
                    assert_eq!(out, want, "thread {} round {}", t, round);
                }
            });
        }
    });
    rt.synchronize().unwrap();
    assert_eq!(launches.load(Ordering::Relaxed), 32);
    assert_eq!(rt.pool_stats().unwrap().allocated_bytes, 0);
}

#[test]
fn race_check_finds_two_unordered_writers() {
    let rt = Runtime::builder().profile("tiny").race_check(true).build().unwrap();
    let a = rt.alloc(4096, 0).unwrap();
    a.set_tag("kv").unwrap();
    rt.launch(0, &[Operand::write(&a)], |_| Ok(())).unwrap();
    rt.launch(1, &[Operand::write(&a)], |_| Ok(())).unwrap();
    rt.synchronize().unwrap();
    let found = rt.races().unwrap();
    assert_eq!(found.total, 1);
    let race = &found.races[0];
    assert_eq!((race.earlier.stream, race.later.stream), (0, 1));
    assert_eq!(race.later.kind, "user");
    assert_eq!(race.later.access, Access::Write);
    assert_eq!(race.earlier.block, a.handle());
    assert_eq!(race.earlier.block_tag, "kv");
    assert_eq!(race.bytes, 4096);
    assert!(!race.reuse);
    // Ordered by a stream wait: no new race.
    rt.launch(0, &[Operand::write(&a)], |_| Ok(())).unwrap();
    rt.stream_wait(1, 0).unwrap();
    rt.launch(1, &[Operand::write(&a)], |_| Ok(())).unwrap();
    rt.synchronize().unwrap();
    assert_eq!(rt.races().unwrap().total, 1);
    assert!(matches!(tiny().races(), Err(Error::Unsupported(_))));
}

#[test]
fn version_is_the_librarys() {
    assert_eq!(ferry::version(), env!("CARGO_PKG_VERSION"), "rust/ferry/Cargo.toml against the library");
}

#[test]
fn send_and_sync_where_the_header_allows_any_thread() {
    fn shared<T: Send + Sync>() {}
    shared::<Runtime>();
    shared::<Allocation<'static>>();
    shared::<ferry::HoldGuard<'static>>();
    shared::<ferry::CachePin<'static>>();
    shared::<Handle>();
    shared::<Error>();
}

#[test]
fn allocations_select_their_device_and_copy_between_two() {
    let rt = Runtime::builder()
        .profile("tiny")
        .devices(2)
        .integrity(Integrity::Verify)
        .build()
        .expect("two tiny sim devices");
    assert_eq!(rt.device_count(), 2);
    let data = pattern(8192, 5);
    let a = rt.alloc_on(1, data.len() as u64, 1).expect("a block on device 1");
    let b = rt.alloc(data.len() as u64, 0).expect("a block on device 0");
    assert_eq!((a.device(), b.device()), (1, 0));
    rt.upload(1, &a, 0, &data).expect("an upload on device 1");
    assert!(rt.copy_peer(0, &b, 0, &a, 0, data.len() as u64).expect("a peer copy"));
    let mut back = vec![0u8; data.len()];
    rt.download(0, &b, 0, &mut back).expect("a download on device 0");
    assert_eq!(back, data);
    match rt.alloc_on(2, 64, 0) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("no device 2"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
}

#[test]
fn linked_devices_copy_over_their_link() {
    let rt = Runtime::builder().profile("tiny").devices(3).links("0-1:nvlink, 2-1:pcie").build().expect("three linked sims");
    let links: Vec<String> = [(0, 1), (1, 2), (0, 2)].iter().map(|&(a, b)| rt.device_link(a, b).expect("a link")).collect();
    assert_eq!(links, ["nvlink", "pcie", "none"]);
    assert!(matches!(rt.device_link(0, 3), Err(Error::InvalidArgument(_))));
    // A swallowed peer copy passes unverified over the link and is caught under verify.
    let copied = |integrity| {
        let rt = Runtime::builder()
            .capacity(64 << 20)
            .devices(2)
            .links("0-1:nvlink")
            .inject("peer-noop")
            .integrity(integrity)
            .build()
            .expect("two linked h200s");
        let data = pattern(8192, 3);
        let a = rt.alloc(data.len() as u64, 0).expect("a block on device 0");
        let b = rt.alloc_on(1, data.len() as u64, 0).expect("a block on device 1");
        rt.upload(0, &a, 0, &data).expect("an upload");
        rt.upload(0, &b, 0, &vec![0u8; data.len()]).expect("zeroes");
        let verified = rt.copy_peer(0, &b, 0, &a, 0, data.len() as u64).expect("a peer copy");
        let mut back = vec![0u8; data.len()];
        rt.download(0, &b, 0, &mut back).expect("a download");
        (back == data, verified)
    };
    assert_eq!(copied(Integrity::Off), (false, false));
    assert_eq!(copied(Integrity::Verify), (true, true));
    for bad in ["0-1", "0-1:warp", "0-2:pcie"] {
        match Runtime::builder().profile("tiny").devices(2).links(bad).build() {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("link"), "{m}"),
            other => panic!("expected InvalidArgument for {bad}, got {:?}", other.map(|_| ())),
        }
    }
}

/// A block of device 0 written on its stream 1, pulled over the link by device 1 on
/// its stream 0 (copy_peer orders the pull after the block's writes itself), then
/// overwritten by a launch on device 0's stream 1: the race checker (one over both
/// sims) finds the overwrite unordered after the pull unless device 0's stream 1
/// waits for device 1's stream 0.
fn overwrite_after_pull(wait: bool) -> (u64, bool) {
    let rt = Runtime::builder()
        .profile("tiny")
        .devices(2)
        .links("0-1:nvlink")
        .race_check(true)
        .integrity(Integrity::Off)
        .build()
        .expect("two linked tiny sims");
    let data = pattern(4096, 9);
    let src = rt.alloc(4096, 1).expect("a block on device 0");
    let dst = rt.alloc_on(1, 4096, 0).expect("a block on device 1");
    rt.upload(1, &src, 0, &data).expect("the first contents");
    rt.copy_peer(0, &dst, 0, &src, 0, 4096).expect("the pull");
    if wait {
        rt.stream_wait_across(0, 1, 1, 0).expect("device 0's stream 1 waits for device 1's stream 0");
    }
    rt.launch_with_cost(1, &[Operand::write(&src)], 1e9, 0, move |ctx| {
        ctx.view_mut(0)?.fill(0);
        Ok(())
    })
    .expect("the overwrite");
    let mut back = vec![0u8; 4096];
    rt.download(0, &dst, 0, &mut back).expect("a download on device 1");
    rt.synchronize().expect("device 0");
    rt.synchronize_device(1).expect("device 1");
    (rt.races().expect("race_check").total, back == data)
}

#[test]
fn a_wait_across_devices_orders_the_pull_and_the_race_checker_sees_it() {
    assert_eq!(overwrite_after_pull(true), (0, true));
    let (races, _) = overwrite_after_pull(false);
    assert!(races >= 1, "an overwrite unordered after the pull is a race");
    let rt = tiny();
    match rt.stream_wait_across(0, 0, 1, 0) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("no device 1"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn stream_calls_and_figures_take_a_device() {
    let rt = Runtime::builder().profile("tiny").devices(2).race_check(true).build().expect("two tiny sims");
    let data = pattern(4096, 4);
    let a = rt.alloc_on(1, 4096, 0).expect("a block on device 1");
    {
        let _held = rt.hold_on(1, 0).expect("device 1's stream 0 held");
        let fill = data.clone();
        rt.launch_on(1, 0, &[Operand::write(&a)], move |ctx| {
            ctx.view_mut(0)?.copy_from_slice(&fill);
            Ok(())
        })
        .expect("a launch on device 1");
        rt.record_use_on(1, 0, &[&a]).expect("a record_use on device 1");
    }
    rt.synchronize_device(1).expect("device 1");
    let mut back = vec![0u8; 4096];
    rt.download(0, &a, 0, &mut back).expect("a download on device 1");
    assert_eq!(back, data);
    assert_eq!(rt.races().unwrap().total, 0);
    assert_eq!(rt.pool_stats_on(1).unwrap().allocs, 1);
    assert_eq!(rt.pool_stats().unwrap().allocs, 0, "device 0 allocated nothing of the program's");
    let (moved0, moved1) = (rt.integrity_stats().unwrap().bytes_moved, rt.integrity_stats_on(1).unwrap().bytes_moved);
    rt.upload(0, &a, 0, &data).expect("an upload on device 1");
    assert!(rt.integrity_stats_on(1).unwrap().bytes_moved >= moved1 + 4096, "device 1's engine moved it");
    assert_eq!(rt.integrity_stats().unwrap().bytes_moved, moved0, "device 0's did not");
    rt.native_stream_on(1, 0).expect("device 1's native stream");
    match rt.launch_on(0, 0, &[Operand::read(&a)], |_| Ok(())) {
        Err(Error::StaleHandle(m)) => assert!(m.contains("device 1"), "{m}"),
        other => panic!("expected StaleHandle, got {other:?}"),
    }
    for bad in [rt.pool_stats_on(2).map(|_| ()), rt.native_stream_on(2, 0).map(|_| ()), rt.synchronize_device(2)] {
        assert!(matches!(bad, Err(Error::InvalidArgument(ref m)) if m.contains("no device 2")), "{bad:?}");
    }
}
