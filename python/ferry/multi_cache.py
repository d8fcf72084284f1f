"""One offload cache across the devices of a ferry.Runtime (ferry.h:
ferry_multi_cache_*; include/ferry/multi_device_cache.hpp).

    with ferry.Runtime(profile="tiny", devices=2, links="0-1:nvlink") as rt:
        cache = ferry.MultiCache(rt, slots=4, placement="round_robin")
        cache.define(0, weights)
        slot = cache.acquire(0)             # on cache.placed(0): device 0
        cache.release(0, slot.device)
        moved = cache.acquire(0, device=1)  # filled from device 0 over the link
        assert moved.from_peer

Each device has `slots` slots. placement: the device an entry goes to when
acquire names none, "round_robin" (its definition index modulo the device count)
or "most_room" (the device with the most free slots, kept while it stays
resident). An acquire on a device that does not hold the entry fills it from a
device that does when the pair's link is modeled faster than the host link
(verified under the runtime's integrity policy), else from the host pieces.
The cache is the runtime's (one per Runtime, apart from cache_slots' device-0
cache) and lives as long as it; thread safety as the Runtime's.
"""
import collections
import ctypes

from . import _lib
from . import CacheSlot, Handle, Runtime, _int, _invalid, _text

MultiCacheSlot = collections.namedtuple("MultiCacheSlot", CacheSlot._fields + ("device", "from_peer"))
MultiCacheSlot.__doc__ = ("MultiCache.acquire's answer: CacheSlot's fields, the device whose block the slot is, "
                          "and whether this acquire filled it from another device's copy.")


class MultiCache:
    """ferry_multi_cache_create on `runtime`: `slots` slots of `slot_bytes` (0: the
    largest entry defined before the first fill) on each device. Errors:
    InvalidArgumentError (the runtime has one already, slots 0, an unknown
    placement; a runtime that is not a ferry.Runtime or is closed)."""

    def __init__(self, runtime, slots, slot_bytes=0, placement="round_robin"):
        if not isinstance(runtime, Runtime):
            raise _invalid("MultiCache: %r is not a ferry.Runtime" % (runtime,))
        self._runtime = runtime
        self._pieces = {}
        runtime._check(runtime._lib.ferry_multi_cache_create(
            runtime._live(), _int(slots, "MultiCache: slots", 32), _int(slot_bytes, "MultiCache: slot_bytes", 64),
            _text(placement, "MultiCache: placement")))

    @property
    def device_count(self):
        return self._runtime.device_count

    def define(self, key, pieces):
        """Declares entry `key` as host pieces (a buffer, or a list of buffers) for
        every device's slots; held (not resizable) until the runtime closes.
        InvalidArgumentError (duplicate key, no or empty piece)."""
        key = _int(key, "MultiCache.define: key", 64)
        rt = self._runtime
        self._pieces[key] = rt._define_pieces(rt._lib.ferry_multi_cache_define, key, pieces)

    def placed(self, key):
        """The device the placement gives `key` now. InvalidArgumentError (undefined key)."""
        rt = self._runtime
        out = ctypes.c_uint32()
        rt._check(rt._lib.ferry_multi_cache_placed(rt._live(), _int(key, "MultiCache.placed: key", 64),
                                                   ctypes.byref(out)))
        return out.value

    def acquire(self, key, stream=0, device=None):
        """Makes `key` resident on `device` (None: placed(key)), orders that device's
        `stream` after its fill and pins it: MultiCacheSlot(handle, offsets, hit,
        device, from_peer). InvalidArgumentError (undefined key, no such device),
        OutOfMemoryError (every slot of the device pinned), TransferCorruptError.
        Blocks."""
        rt = self._runtime
        key = _int(key, "MultiCache.acquire: key", 64)
        device = self.placed(key) if device is None else _int(device, "MultiCache.acquire: device", 32)
        count = self._pieces.get(key, 0)
        slot = _lib.CHandle()
        offsets = (ctypes.c_uint64 * max(1, count))()
        hit, from_peer = ctypes.c_int(), ctypes.c_int()
        rt._check(rt._lib.ferry_multi_cache_acquire(rt._live(), key, device,
                                                    _int(stream, "MultiCache.acquire: stream", 32),
                                                    ctypes.byref(slot), offsets if count else None,
                                                    ctypes.byref(hit), ctypes.byref(from_peer)))
        return MultiCacheSlot(Handle._from_c(slot), list(offsets[:count]), bool(hit.value), device,
                              bool(from_peer.value))

    def release(self, key, device):
        """Unpins one acquire of `key` on `device`. InvalidArgumentError (not pinned there)."""
        rt = self._runtime
        rt._check(rt._lib.ferry_multi_cache_release(rt._live(), _int(key, "MultiCache.release: key", 64),
                                                    _int(device, "MultiCache.release: device", 32)))

    def stats(self):
        """{"devices": [each device's cache_stats()-like dict], "peer_fills",
        "host_fills", "bytes_peer"}: misses filled from another device's copy, from
        the host pieces, and the bytes the peer fills moved (a peer fill counts as a
        miss of its device, not an upload)."""
        rt = self._runtime
        whole = _lib.MultiCacheStats()
        rt._check(rt._lib.ferry_get_multi_cache_stats_sized(rt._live(), ctypes.byref(whole), ctypes.sizeof(whole)))
        devices = []
        for d in range(self.device_count):
            one = _lib.CacheStats()
            rt._check(rt._lib.ferry_get_multi_cache_device_stats_sized(rt._live(), d, ctypes.byref(one),
                                                                       ctypes.sizeof(one)))
            devices.append(_lib.as_dict(one))
        return dict(devices=devices, **_lib.as_dict(whole))
