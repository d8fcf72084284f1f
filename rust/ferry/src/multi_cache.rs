//! One offload cache across the devices of a runtime (ferry.h "Several devices:
//! adopted streams on any device, and one offload cache across the devices";
//! `include/ferry/multi_device_cache.hpp`): each device has its slots, a placement
//! picks the device an entry goes to, and an acquire on a device that does not
//! hold the entry fills it from a device that does when the pair's link is
//! modeled faster than the host link (verified under the runtime's policy), else
//! from the host pieces.

use std::os::raw::{c_int, c_void};

use ferry_sys as sys;

use crate::{c_string, count, lock, CacheStats, Handle, Result, Runtime};

/// Where an entry goes when an acquire names no device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// The entry's definition index modulo the device count.
    RoundRobin,
    /// The device with the most free slots when it is placed, kept while it stays resident.
    MostRoom,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::RoundRobin => "round_robin",
            Placement::MostRoom => "most_room",
        }
    }
}

/// The cache across devices as a whole: misses filled from another device's copy
/// (`peer_fills`), from the host pieces (`host_fills`), and the bytes the peer
/// fills moved.
pub type MultiCacheStats = sys::ferry_multi_cache_stats;

/// The runtime's cache across devices ([`Runtime::multi_cache`]); it borrows the
/// runtime, whose cache it is (one per runtime, living as long as the runtime).
///
/// ```
/// let rt = ferry::Runtime::builder().profile("tiny").devices(2).links("0-1:nvlink").build()?;
/// let cache = rt.multi_cache(2, 0, ferry::Placement::RoundRobin)?;
/// cache.define(0, vec![vec![7; 64 << 10]])?;
/// let first = cache.acquire(0, 0)?; // placed on device 0, uploaded from the host
/// assert_eq!((first.device(), first.from_peer()), (0, false));
/// drop(first);
/// assert!(cache.acquire_on(1, 0, 0)?.from_peer()); // over the link
/// # Ok::<(), ferry::Error>(())
/// ```
#[derive(Debug)]
pub struct MultiCache<'rt> {
    rt: &'rt Runtime,
}

impl Runtime {
    /// Makes the runtime's cache across devices: `slots` slots of `slot_bytes` (0:
    /// the largest entry defined before the first fill) on every device. Errors:
    /// `InvalidArgument` (the runtime has one already, `slots` 0). Never blocks.
    pub fn multi_cache(&self, slots: u32, slot_bytes: u64, placement: Placement) -> Result<MultiCache<'_>> {
        let rt = self.rt("multi_cache")?;
        let name = c_string("multi_cache", placement.name())?;
        self.check(unsafe { sys::ferry_multi_cache_create(rt, slots, slot_bytes, name.as_ptr()) })?;
        Ok(MultiCache { rt: self })
    }
}

impl<'rt> MultiCache<'rt> {
    /// Declares entry `key` as `pieces` for every device's slots; the runtime keeps
    /// the bytes. Errors: `InvalidArgument` (duplicate key, no or empty piece).
    pub fn define(&self, key: u64, pieces: Vec<Vec<u8>>) -> Result<()> {
        let rt = self.rt.rt("MultiCache::define")?;
        let ptrs: Vec<*const c_void> = pieces.iter().map(|p| p.as_ptr() as *const c_void).collect();
        let sizes: Vec<u64> = pieces.iter().map(|p| p.len() as u64).collect();
        let n = count("MultiCache::define", pieces.len())?;
        let mut kept = lock(&self.rt.shared.multi_cache_pieces);
        self.rt.check(unsafe { sys::ferry_multi_cache_define(rt, key, ptrs.as_ptr(), sizes.as_ptr(), n) })?;
        // The Vecs' heap buffers do not move with them.
        kept.insert(key, pieces);
        Ok(())
    }

    /// The device the placement gives `key` now. Errors: `InvalidArgument` (undefined key).
    pub fn placed(&self, key: u64) -> Result<u32> {
        let rt = self.rt.rt("MultiCache::placed")?;
        let mut device = 0u32;
        self.rt.check(unsafe { sys::ferry_multi_cache_placed(rt, key, &mut device) })?;
        Ok(device)
    }

    /// [`MultiCache::acquire_on`] the device [`MultiCache::placed`] gives `key`.
    pub fn acquire(&self, key: u64, stream: u32) -> Result<MultiCachePin<'rt>> {
        self.acquire_on(self.placed(key)?, key, stream)
    }

    /// Makes `key` resident on `device`, orders that device's `stream` after its
    /// fill and pins it until the pin drops. Errors: `InvalidArgument` (undefined
    /// key, no such device), `OutOfMemory` (every slot of the device pinned),
    /// `TransferCorrupt`. Blocks.
    pub fn acquire_on(&self, device: u32, key: u64, stream: u32) -> Result<MultiCachePin<'rt>> {
        let rt = self.rt.rt("MultiCache::acquire_on")?;
        let pieces = lock(&self.rt.shared.multi_cache_pieces).get(&key).map_or(0, |p| p.len());
        let mut offsets = vec![0u64; pieces.max(1)];
        let mut slot = sys::ferry_handle::default();
        let (mut hit, mut from_peer): (c_int, c_int) = (0, 0);
        self.rt.check(unsafe {
            sys::ferry_multi_cache_acquire(rt, key, device, stream, &mut slot, offsets.as_mut_ptr(), &mut hit,
                                           &mut from_peer)
        })?;
        offsets.truncate(pieces);
        Ok(MultiCachePin { rt: self.rt, key, device, slot: Handle(slot), offsets, hit: hit != 0,
                           from_peer: from_peer != 0 })
    }

    /// The figures of the cache as a whole.
    pub fn stats(&self) -> Result<MultiCacheStats> {
        let rt = self.rt.rt("MultiCache::stats")?;
        let mut s = MultiCacheStats::default();
        let size = std::mem::size_of::<MultiCacheStats>();
        self.rt.check(unsafe { sys::ferry_get_multi_cache_stats_sized(rt, &mut s, size) })?;
        Ok(s)
    }

    /// Device `device`'s slots' figures (a peer fill there counts as a miss, not an
    /// upload). Errors: `InvalidArgument` (no such device).
    pub fn stats_on(&self, device: u32) -> Result<CacheStats> {
        let rt = self.rt.rt("MultiCache::stats_on")?;
        let mut s = CacheStats::default();
        let size = std::mem::size_of::<CacheStats>();
        self.rt.check(unsafe { sys::ferry_get_multi_cache_device_stats_sized(rt, device, &mut s, size) })?;
        Ok(s)
    }
}

/// A pinned entry on one device; dropping it unpins (work already enqueued keeps its lease).
#[derive(Debug)]
pub struct MultiCachePin<'rt> {
    rt: &'rt Runtime,
    key: u64,
    device: u32,
    slot: Handle,
    offsets: Vec<u64>,
    hit: bool,
    from_peer: bool,
}

impl MultiCachePin<'_> {
    /// The device whose block the slot is.
    pub fn device(&self) -> u32 {
        self.device
    }
    /// The slot's block: use it with [`Operand::handle`](crate::Operand::handle) on its device.
    pub fn slot(&self) -> Handle {
        self.slot
    }
    /// Where each piece lies in the slot.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }
    /// True when no fill was needed.
    pub fn hit(&self) -> bool {
        self.hit
    }
    /// True when this acquire filled the slot from another device's copy.
    pub fn from_peer(&self) -> bool {
        self.from_peer
    }
}

impl Drop for MultiCachePin<'_> {
    fn drop(&mut self) {
        if let Ok(rt) = self.rt.rt("MultiCache release") {
            unsafe { sys::ferry_multi_cache_release(rt, self.key, self.device) };
        }
    }
}
