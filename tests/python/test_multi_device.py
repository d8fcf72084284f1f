"""ferry.Runtime over two sim devices beyond device 0's calls: a program's own
stream adopted on device 1, and ferry.MultiCache, one offload cache across the
devices (placement, a fill over a link and from the host, its figures)."""
import pytest

import ferry

N = 96 * 1024


def pattern(n, seed=0):
    return bytes((i * 31 + seed) & 0xFF for i in range(n))


def test_a_stream_adopted_on_device_1_orders_its_work_and_the_other_device_refuses_it():
    with ferry.Runtime(profile="tiny", devices=2) as rt:
        mine = 0x5EED0000
        s = rt.adopt_stream(mine, device=1)
        assert s >= 32
        assert rt.native_stream(s, device=1) == mine
        h = rt.alloc(64, s, device=1)
        rt.upload(h, b"\x03" * 64, stream=s)
        rt.launch(s, [(h, "rw")], lambda ctx: ctx.views[0].__setitem__(0, 4), device=1)
        assert rt.download(h, 2, stream=s) == b"\x04\x03"
        with pytest.raises(ferry.InvalidArgumentError, match="adopted already on device 1"):
            rt.adopt_stream(mine)
        with pytest.raises(ferry.InvalidArgumentError, match="device 1's"):
            rt.release_stream(s)
        with pytest.raises(ferry.InvalidArgumentError, match="no device 2"):
            rt.release_stream(s, device=2)
        rt.free(h)
        rt.release_stream(s, timeout_ms=5000, device=1)
        with pytest.raises(ferry.InvalidArgumentError):
            rt.release_stream(s, device=1)
        assert rt.adopt_stream(mine) >= 32  # released: device 0 may have it now


def _cache(links, placement="round_robin"):
    rt = ferry.Runtime(profile="tiny", devices=2, links=links)
    cache = ferry.MultiCache(rt, slots=2, placement=placement)
    entries = [pattern(N, k) for k in range(4)]
    for k, data in enumerate(entries):
        cache.define(k, data)
    return rt, cache, entries


def _acquire_checked(rt, cache, entries, key, device=None):
    slot = cache.acquire(key, device=device)
    assert rt.device_of(slot.handle) == slot.device
    assert slot.offsets == [0] and not slot.hit
    assert rt.download(slot.handle, N) == entries[key]
    cache.release(key, slot.device)
    return slot


def test_multi_cache_places_round_robin_and_fills_the_other_device_over_the_link():
    rt, cache, entries = _cache("0-1:nvlink")
    with rt:
        assert [cache.placed(k) for k in range(4)] == [0, 1, 0, 1]
        first = _acquire_checked(rt, cache, entries, 0)
        assert first.device == 0 and not first.from_peer
        moved = _acquire_checked(rt, cache, entries, 0, device=1)
        assert moved.device == 1 and moved.from_peer
        s = cache.stats()
        assert (s["peer_fills"], s["host_fills"], s["bytes_peer"]) == (1, 1, N)
        assert [d["misses"] for d in s["devices"]] == [1, 1]
        assert [d["uploads"] for d in s["devices"]] == [1, 0]
        assert s["devices"][0]["bytes_uploaded"] == N
        with pytest.raises(ferry.InvalidArgumentError):
            cache.release(0, 1)  # not pinned
        with pytest.raises(ferry.InvalidArgumentError):
            cache.acquire(0, device=2)
        with pytest.raises(ferry.InvalidArgumentError, match="already"):
            ferry.MultiCache(rt, slots=2)


def test_multi_cache_without_a_link_fills_from_the_host_and_most_room_spreads_entries():
    rt, cache, entries = _cache(None)
    with rt:
        assert not _acquire_checked(rt, cache, entries, 1).from_peer
        assert not _acquire_checked(rt, cache, entries, 1, device=0).from_peer
        s = cache.stats()
        assert (s["peer_fills"], s["host_fills"], s["bytes_peer"]) == (0, 2, 0)
    rt, cache, entries = _cache(None, placement="most_room")
    with rt:
        held = cache.acquire(0)
        assert held.device == 0
        assert cache.placed(1) == 1  # device 0 has one slot pinned, device 1 none
        cache.release(0, 0)
    with ferry.Runtime(profile="tiny", devices=2) as rt:
        with pytest.raises(ferry.InvalidArgumentError, match="placement"):
            ferry.MultiCache(rt, slots=2, placement="nearest")
        with pytest.raises(ferry.InvalidArgumentError):
            ferry.MultiCache(rt, slots=0)
