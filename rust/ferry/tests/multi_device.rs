// Two sim devices beyond device 0's calls: a program's own stream adopted on
// device 1, and one cache across the devices (placement, a fill over a link and
// from the host, the figures), every slot's bytes read back on its device.
use std::time::Duration;

use ferry::{Access, Error, MultiCache, Operand, Placement, Runtime};

const N: usize = 96 << 10;

fn two(links: &str) -> Runtime {
    let b = Runtime::builder().profile("tiny").devices(2);
    let b = if links.is_empty() { b } else { b.links(links) };
    b.build().expect("two tiny sims")
}

fn entry(key: u64) -> Vec<u8> {
    (0..N).map(|i| (i as u64 * (key + 3) + key) as u8).collect()
}

#[test]
fn a_stream_adopted_on_device_1_orders_its_work_and_device_0_refuses_it() {
    let rt = two("");
    let token = Box::new(0u64); // the sim runs no native work: any unique address
    let native = &*token as *const u64 as *mut std::os::raw::c_void;
    let s = unsafe { rt.adopt_stream_on(1, native) }.expect("adopted on device 1");
    assert!(s >= 32);
    assert_eq!(rt.native_stream_on(1, s).unwrap(), native);
    let a = rt.alloc_on(1, 64, s).unwrap();
    rt.upload(s, &a, 0, &[3; 64]).unwrap();
    rt.launch_on(1, s, &[Operand::read_write(&a)], |ctx| {
        ctx.view_mut(0)?[0] = 4;
        Ok(())
    })
    .unwrap();
    let mut back = [0u8; 2];
    rt.download(s, &a, 0, &mut back).unwrap();
    assert_eq!(back, [4, 3]);
    match unsafe { rt.adopt_stream(native) } {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("adopted already on device 1"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    match rt.release_stream(s, Duration::from_secs(1)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("device 1's"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(matches!(rt.release_stream_on(2, s, Duration::from_secs(1)), Err(Error::InvalidArgument(_))));
    drop(a);
    rt.release_stream_on(1, s, Duration::from_secs(10)).unwrap();
    assert!(matches!(rt.release_stream_on(1, s, Duration::from_secs(1)), Err(Error::InvalidArgument(_))));
    let again = unsafe { rt.adopt_stream(native) }.expect("released: device 0 may adopt it");
    rt.release_stream(again, Duration::from_secs(10)).unwrap();
}

fn define_four(cache: &MultiCache<'_>) {
    for key in 0..4 {
        cache.define(key, vec![entry(key)]).unwrap();
    }
}

// Acquires `key` (on `device`, or where it is placed), checks the slot's bytes on
// its device and returns (device, from_peer).
fn acquire_checked(rt: &Runtime, cache: &MultiCache<'_>, key: u64, device: Option<u32>) -> (u32, bool) {
    let pin = match device {
        Some(d) => cache.acquire_on(d, key, 0),
        None => cache.acquire(key, 0),
    }
    .expect("acquired");
    assert!(!pin.hit());
    assert_eq!(pin.offsets(), &[0]);
    let out = rt.alloc_on(pin.device(), N as u64, 0).unwrap();
    rt.launch_on(pin.device(), 0, &[Operand::handle(pin.slot(), Access::Read), Operand::write(&out)], |ctx| {
        let (i, o) = ctx.input_output(0, 1)?;
        o.copy_from_slice(&i[..o.len()]);
        Ok(())
    })
    .unwrap();
    let mut back = vec![0u8; N];
    rt.download(0, &out, 0, &mut back).unwrap();
    assert_eq!(back, entry(key), "entry {key} on device {}", pin.device());
    (pin.device(), pin.from_peer())
}

#[test]
fn one_cache_places_round_robin_and_fills_the_other_device_over_the_link() {
    let rt = two("0-1:nvlink");
    let cache = rt.multi_cache(2, 0, Placement::RoundRobin).unwrap();
    define_four(&cache);
    assert_eq!((0..4).map(|k| cache.placed(k).unwrap()).collect::<Vec<_>>(), vec![0, 1, 0, 1]);
    assert_eq!(acquire_checked(&rt, &cache, 0, None), (0, false));
    assert_eq!(acquire_checked(&rt, &cache, 0, Some(1)), (1, true));
    let s = cache.stats().unwrap();
    assert_eq!((s.peer_fills, s.host_fills, s.bytes_peer), (1, 1, N as u64));
    let (d0, d1) = (cache.stats_on(0).unwrap(), cache.stats_on(1).unwrap());
    assert_eq!((d0.misses, d0.uploads, d0.bytes_uploaded), (1, 1, N as u64));
    assert_eq!((d1.misses, d1.uploads), (1, 0));
    assert!(matches!(cache.stats_on(2), Err(Error::InvalidArgument(_))));
    assert!(matches!(cache.acquire_on(2, 0, 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(rt.multi_cache(2, 0, Placement::MostRoom), Err(Error::InvalidArgument(_))));
}

#[test]
fn without_a_link_the_host_fills_and_most_room_spreads_entries() {
    let rt = two("");
    let cache = rt.multi_cache(2, 0, Placement::RoundRobin).unwrap();
    define_four(&cache);
    assert_eq!(acquire_checked(&rt, &cache, 1, None), (1, false));
    assert_eq!(acquire_checked(&rt, &cache, 1, Some(0)), (0, false));
    let s = cache.stats().unwrap();
    assert_eq!((s.peer_fills, s.host_fills, s.bytes_peer), (0, 2, 0));

    let rt = two("");
    let cache = rt.multi_cache(2, 0, Placement::MostRoom).unwrap();
    define_four(&cache);
    let held = cache.acquire(0, 0).unwrap();
    assert_eq!(held.device(), 0);
    assert_eq!(cache.placed(1).unwrap(), 1, "device 0 has a slot pinned, device 1 none");
    assert!(matches!(one_device().multi_cache(0, 0, Placement::RoundRobin), Err(Error::InvalidArgument(_))));
}

fn one_device() -> Runtime {
    Runtime::builder().profile("tiny").build().unwrap()
}
