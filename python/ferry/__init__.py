"""ferry from Python: the C ABI (include/ferry/ferry.h) through ctypes, no build step.

    import ferry
    with ferry.Runtime(profile="tiny", capacity=8 << 20) as rt:
        h = rt.alloc(1 << 20)
        rt.upload(h, b"\\x01" * (1 << 20))        # verified: returns once the device hash matched
        rt.launch(0, [(h, "rw")], lambda ctx: ctx.views[0].__setitem__(0, 7))
        assert rt.download(h, 1) == b"\\x07"

libferry.so is found through $FERRY_LIBRARY (a full path), else next to this
package's install (<prefix>/lib, lib/<multiarch>), else in the source checkout's
build tree (build/<preset>/src), else by ctypes.util.find_library("ferry").

Errors are exceptions, one per ferry status, all subclasses of ferry.Error, with
ferry's message (ferry_last_error) and the status as `.status`. Thread safety:
a Runtime may be used from any thread at once, except close(), which must not race
with any other call on it (as ferry_runtime_destroy). ctypes releases the GIL
during every ferry call.
"""
import collections
import ctypes
import dataclasses
import itertools
import os
import threading
import weakref

from . import _lib
from ._capture_gate import CaptureGate
from ._device_work import DeviceWork, release_buffers

# CMakeLists.txt's project(VERSION), the one source (tests/python checks the two agree).
__version__ = "0.1.0"

__all__ = [
    "Runtime", "Graph", "Handle", "LaunchContext", "CacheSlot", "Error", "OutOfMemoryError", "StaleHandleError",
    "InvalidArgumentError", "TransferCorruptError", "BackendError", "UnsupportedError", "FerryTimeoutError",
    "library_version", "status_name", "MultiCache", "MultiCacheSlot",
]


# ---- Errors ----------------------------------------------------------------------

class Error(Exception):
    """A ferry call failed. `.status` is the ferry_status (int), str() ferry's message."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message


class OutOfMemoryError(Error, MemoryError):
    """FERRY_ERROR_OUT_OF_MEMORY: did not fit after the reclaim; the message is the pool's diagnostic."""
    status = 1


class StaleHandleError(Error):
    """FERRY_ERROR_STALE_HANDLE: a freed, foreign or forged handle."""
    status = 2


class InvalidArgumentError(Error, ValueError):
    """FERRY_ERROR_INVALID_ARGUMENT: the caller's input is wrong."""
    status = 3


class TransferCorruptError(Error):
    """FERRY_ERROR_TRANSFER_CORRUPT: a transfer never verified, on every path."""
    status = 4


class BackendError(Error):
    """FERRY_ERROR_BACKEND: the device failed, or a launch callable did (see .callable_errors)."""
    status = 5


class UnsupportedError(Error):
    """FERRY_ERROR_UNSUPPORTED: this build or machine lacks it (cuda without a GPU)."""
    status = 6


class FerryTimeoutError(Error, TimeoutError):
    """FERRY_ERROR_TIMEOUT: a bounded wait ran out."""
    status = 7


_ERRORS = {cls.status: cls for cls in (OutOfMemoryError, StaleHandleError, InvalidArgumentError,
                                       TransferCorruptError, BackendError, UnsupportedError, FerryTimeoutError)}


def _error(status, message):
    cls = _ERRORS.get(status)
    if cls is None:
        return Error("%s (status %d)" % (message, status), status)
    return cls(message)


def _invalid(message):
    return InvalidArgumentError(message)


def library_version():
    """libferry.so's version ("MAJOR.MINOR.PATCH"; __version__ is this package's)."""
    return _lib.lib().ferry_version().decode()


def status_name(status):
    """The name of a ferry status ("ok", "out_of_memory", ...; "unknown" for another
    C int). InvalidArgumentError when status is not an int that fits a C int."""
    if isinstance(status, bool) or not isinstance(status, int) or not -(1 << 31) <= status < (1 << 31):
        raise _invalid("status_name: %r is not a ferry status (a C int)" % (status,))
    return _lib.lib().ferry_status_name(status).decode()


# ---- Values -----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Handle:
    """A block of the device pool: (pool, slot, generation), a value. Handle() is the
    null handle, which never resolves."""

    pool: int = 0
    slot: int = 0
    generation: int = 0

    def _as_c(self):
        return _lib.CHandle(self.pool, self.slot, self.generation)

    @classmethod
    def _from_c(cls, c):
        return cls(c.pool, c.slot, c.generation)

    def __bool__(self):
        return (self.pool, self.slot, self.generation) != (0, 0, 0)


CacheSlot = collections.namedtuple("CacheSlot", "handle offsets hit")
CacheSlot.__doc__ = "cache_acquire's answer: the slot's block, each piece's offset in it, whether it was a hit."


class LaunchContext:
    """What a launch callable gets, valid during the call only.

    views: one memoryview per operand on sim (writable where the operand is "w" or
        "rw", read-only where "r"); None on cuda. They view copies that Python owns:
        what a writable one holds when the call returns is written back, and a
        view (or slice) kept past the call sees only that copy, never ferry's memory.
    native_stream: the cudaStream_t (int) on cuda, None on sim.
    device_addresses, bytes: per operand.
    """

    __slots__ = ("views", "native_stream", "device_addresses", "bytes")

    def __init__(self, views, native_stream, device_addresses, nbytes):
        self.views = views
        self.native_stream = native_stream
        self.device_addresses = device_addresses
        self.bytes = nbytes


_ACCESS = {"r": _lib.READ, "read": _lib.READ, "w": _lib.WRITE, "write": _lib.WRITE,
           "rw": _lib.READ_WRITE, "wr": _lib.READ_WRITE, "read_write": _lib.READ_WRITE}


def _int(value, what, bits):
    """value as an unsigned C integer of `bits`, else InvalidArgumentError (ctypes
    would wrap a negative number silently; True is not a size)."""
    if isinstance(value, bool):
        raise _invalid("%s: %r is a bool, not an integer" % (what, value))
    if not isinstance(value, int):
        try:
            value = value.__index__()
        except (AttributeError, TypeError):
            raise _invalid("%s: %r is not an integer" % (what, value)) from None
    if value < 0 or value >= 1 << bits:
        raise _invalid("%s: %d is out of range (0..2^%d-1)" % (what, value, bits))
    return value


def _handle(h, what):
    if isinstance(h, Handle):
        return h._as_c()
    try:
        return _lib.CHandle(_int(h.pool, what, 32), _int(h.slot, what, 32), _int(h.generation, what, 32))
    except AttributeError:
        raise _invalid("%s: %r is not a ferry.Handle" % (what, h)) from None


def _links_text(links):
    """Runtime(links=): a string as it is, or (a, b, kind) tuples joined as ferry.h's text."""
    if links is None or isinstance(links, str):
        return links
    try:
        pairs = [(a, b, kind) for a, b, kind in links]
    except (TypeError, ValueError):
        raise _invalid("links: %r is neither a string nor (a, b, kind) tuples" % (links,)) from None
    return ",".join("%d-%d:%s" % (_int(a, "links: device", 32), _int(b, "links: device", 32), kind)
                    for a, b, kind in pairs)


def _text(value, what, optional=True):
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _invalid("%s: %r is not a string" % (what, value))
    if "\0" in value:  # C would read it only up to the NUL
        raise _invalid("%s: %r holds a NUL character" % (what, value))
    return value.encode()


# The thread running a launch callable: ferry must not be called from it.
_inside = threading.local()


def _refuse_inside_callable(what):
    if getattr(_inside, "depth", 0):
        raise _invalid("%s: called from inside a launch callable; a callable must not call ferry (it runs "
                       "under ferry's lock: the call would deadlock)" % what)


# ---- The runtime ------------------------------------------------------------------

class Graph:
    """ferry_graph: a stream's calls captured once (Runtime.begin_capture /
    end_capture) and replayed by launch(); the blocks allocated in the capture are
    its private pool's until its pool's last graph is destroyed. A context manager:
    leaving the `with` destroys it; so does dropping it, and Runtime.close() destroys
    the graphs still alive first. What its replays run (the launch callables, the
    copies of uploaded bytes, the buffers its copy_to_host calls write) outlives
    destroy() until the replays launched before it completed: until the runtime's
    next synchronize() that returns, or close().
    Thread safety: as the runtime's, but one Graph must not be destroyed while
    another thread launches it."""

    def __init__(self, runtime, ptr, keys, kept):
        self._runtime = runtime
        self._ptr = ptr
        self._keys = keys  # the launch callables it replays
        self._kept = kept  # the bytes its recorded uploads read

    def _live(self):
        if not self._ptr:
            raise _invalid("the ferry.Graph is destroyed")
        return self._ptr

    def launch(self, stream=0):
        """ferry_graph_launch: the recorded calls again, in order, on `stream`; every
        block the graph touches is leased until this replay completes.
        StaleHandleError (a block it touches was freed outside it: nothing is
        enqueued), InvalidArgumentError (destroyed, a bad or capturing stream).
        Never blocks."""
        rt = self._runtime
        rt._check(rt._lib.ferry_graph_launch(rt._live(), self._live(), _int(stream, "launch: stream", 32)))

    def destroy(self):
        """ferry_graph_destroy; idempotent. When it was its pool's last graph, the
        pool frees the blocks the program freed, stream-ordered after the last
        replay. Replays launched before keep running: their callables stay until
        the runtime's next synchronize() returns (or close()). StaleHandleError
        (the graph is gone all the same). Never blocks."""
        _refuse_inside_callable("Graph.destroy")
        ptr, self._ptr = self._ptr, None
        if not ptr:
            return
        rt = self._runtime
        if not rt._forget_graph(ptr):
            # Its runtime's close() destroyed it (and ferry with it): never twice.
            release_buffers(self._kept)
            self._keys, self._kept = [], []
            return
        status = rt._lib.ferry_graph_destroy(ptr)
        # Replays in flight still call back (ferry_graph_destroy does not wait for them).
        rt._retire(self._keys, self._kept)
        self._keys, self._kept = [], []
        rt._graphs.discard(self)
        rt._check(status)

    def _destroy_quietly(self):
        try:
            self.destroy()
        except Error:
            pass

    @property
    def destroyed(self):
        return not self._ptr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __del__(self):
        try:
            self.destroy()
        except Exception:  # inside a callable, or interpreter teardown
            pass


class Runtime(DeviceWork):
    """ferry_runtime: backend, stream order, device pool, pinned arena, transfer
    engine and (cache_slots > 0) an offload cache. A context manager: leaving the
    `with` closes it. devices > 1 makes one stack per device (sim: the profile
    with seed + i; cuda: ordinal i): alloc(device=i) allocates on device i, and
    free, upload, download and copy_peer act on the device a handle names; the
    other calls act on device 0 (docs/scale.md). links (sim) joins pairs of devices,
    "A-B:KIND" pairs separated by commas (KIND pcie or nvlink, e.g. "0-1:nvlink") or
    an iterable of (a, b, kind); a linked pair's copy_peer goes over its link, any
    other pair's through pinned host memory.
    Errors of the constructor: InvalidArgumentError (an unknown
    backend, profile, integrity policy or fault spec; faults asked of cuda; bad links),
    UnsupportedError (cuda without a device), BackendError."""

    def __init__(self, backend="sim", profile="h200", capacity=0, seed=1, integrity="verify", inject=None,
                 cache_slots=0, cache_slot_bytes=0, race_check=False, devices=1, links=None):
        self._rt = None
        self._lib = _lib.lib()
        options = _lib.RuntimeOptions()
        self._check(self._lib.ferry_runtime_options_init_sized(ctypes.byref(options), ctypes.sizeof(options)))
        # The encoded strings stay referenced (locals) until create returns.
        texts = [_text(backend, "backend"), _text(profile, "profile"), _text(integrity, "integrity"),
                 _text(inject, "inject"), _text(_links_text(links), "links")]
        options.backend, options.profile, options.integrity, options.inject, options.links = texts
        options.capacity = _int(capacity, "capacity", 64)
        options.seed = _int(seed, "seed", 64)
        options.cache_slots = _int(cache_slots, "cache_slots", 32)
        options.cache_slot_bytes = _int(cache_slot_bytes, "cache_slot_bytes", 64)
        options.race_check = 1 if race_check else 0
        options.device_count = _int(devices, "devices", 64)
        rt = ctypes.c_void_p()
        self._check(self._lib.ferry_runtime_create(ctypes.byref(options), ctypes.byref(rt)))
        self._rt = rt
        self.backend = backend or "sim"
        count = ctypes.c_uint32()
        self._check(self._lib.ferry_device_count(rt, ctypes.byref(count)))
        self._devices = count.value
        # Launch callables by key until they ran. One ctypes callback per runtime,
        # alive until after ferry_runtime_destroy, which may still run queued ops.
        self._pending = {}
        self._keys = itertools.count(1)
        # Through a weak reference: no cycle, so a dropped Runtime is destroyed at
        # once (by refcount), never later by the cyclic GC, which could run inside
        # another runtime's callable, where ferry must not be called.
        this = weakref.ref(self)
        self._trampoline = _lib.LAUNCH_FN(
            lambda ctx, key: this()._run_callable(ctx, key) if this() is not None else BackendError.status)
        # What launch callables raised: (status, exception), attached to the errors
        # of later waits (ferry's fault is sticky, so is this record). Bounded.
        self._callable_errors = []
        # cache_define's pieces: ferry reads them while the runtime lives.
        self._cache_buffers = []
        self._cache_pieces = {}
        # Graph capture: what each capturing stream recorded ([launch keys], [kept
        # upload bytes]), the callables of every graph (run at each replay, never
        # popped by a run), and those of destroyed graphs whose replays may still
        # run: (keys, kept bytes) pairs, dropped by the next synchronize() that
        # returns after them, or close().
        self._capturing = {}
        self._capture_gate = CaptureGate()
        self._graph_callables = {}
        self._graphs = weakref.WeakSet()
        # The addresses of the graphs not yet destroyed: close() destroys those left
        # even when the collector cleared the WeakSet's references before it ran (a
        # graph and its runtime dropped together, as at interpreter exit).
        self._live_graphs = set()
        self._graphs_lock = threading.Lock()
        self._retired = []
        self._retired_lock = threading.Lock()
        # copy_to_host's destinations outside a capture, (device, held buffer), until
        # a synchronize() of their device returns.
        self._host_outs = []

    # -- lifetime
    def close(self):
        """ferry_runtime_destroy: waits for the runtime's work, then frees everything.
        Idempotent. Handles of this runtime are dead afterwards. InvalidArgumentError
        from inside a launch callable (nothing is closed)."""
        _refuse_inside_callable("close")
        # A graph must go before its runtime (ferry.h).
        for graph in list(getattr(self, "_graphs", ())):
            graph._destroy_quietly()
        if getattr(self, "_graphs_lock", None) is not None:
            with self._graphs_lock:
                left, self._live_graphs = self._live_graphs, set()
            for ptr in left:
                self._lib.ferry_graph_destroy(ctypes.c_void_p(ptr))
        rt, self._rt = self._rt, None
        if rt:
            self._lib.ferry_runtime_destroy(rt)
        # Only now: destroy may still have run queued launch callables and replays.
        self._pending = {}
        self._graph_callables = {}
        for _, kept in getattr(self, "_retired", ()):
            release_buffers(kept)
        self._retired = []
        release_buffers(buf for _, buf in getattr(self, "_host_outs", ()))
        self._host_outs = []
        for buf in getattr(self, "_cache_buffers", ()):
            buf.release()
        self._cache_buffers = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # inside a callable, or  # interpreter teardown: the library may be gone already
            pass

    @property
    def closed(self):
        return not self._rt

    def _forget_graph(self, ptr):
        # True when `ptr` was live: the caller destroys it then, and only then.
        with self._graphs_lock:
            if ptr.value not in self._live_graphs:
                return False
            self._live_graphs.discard(ptr.value)
            return True

    # -- errors
    def _check(self, status, what=None):
        if status == _lib.OK:
            return
        message = self._lib.ferry_last_error().decode(errors="replace")
        if what:
            message = "%s: %s" % (what, message) if message else what
        err = _error(status, message)
        related = [e for s, e in getattr(self, "_callable_errors", ()) if s == status]
        if related:
            err.callable_errors = related
            err.message = message + "; the launch callable raised: " + "; ".join(
                "%s: %s" % (type(e).__name__, e) for e in related)
            err.args = (err.message,)
            err.__cause__ = related[0]
        raise err

    def _live(self):
        if not self._rt:
            raise _invalid("the ferry.Runtime is closed")
        return self._rt

    # -- devices
    @property
    def device_count(self):
        """How many devices the runtime drives (Runtime(devices=N))."""
        return self._devices

    def device_link(self, a, b):
        """The link between devices a and b: "none", "pcie" or "nvlink" (Runtime(links=)
        on the sim; on cuda what the driver reports). InvalidArgumentError (a device
        beyond the count)."""
        out = ctypes.c_char_p()
        self._check(self._lib.ferry_device_link(self._live(), _int(a, "device_link: a", 32),
                                                _int(b, "device_link: b", 32), ctypes.byref(out)))
        return out.value.decode()

    def device_of(self, h):
        """The device whose pool the live handle h names. StaleHandleError."""
        out = ctypes.c_uint32()
        self._check(self._lib.ferry_device_of(self._live(), _handle(h, "device_of"), ctypes.byref(out)))
        return out.value

    def copy_peer(self, dst, src, nbytes, stream=0, dst_offset=0, src_offset=0):
        """Copies nbytes of src (from src_offset) into dst (at dst_offset), whichever
        devices they name (ferry_copy_peer). True when verify checked it. Errors:
        InvalidArgumentError, StaleHandleError, OutOfMemoryError,
        TransferCorruptError, FerryTimeoutError, BackendError. Blocks (bounded)."""
        verified = ctypes.c_int()
        self._check(self._lib.ferry_copy_peer(
            self._live(), _handle(dst, "copy_peer: dst"), _int(dst_offset, "copy_peer: dst_offset", 64),
            _handle(src, "copy_peer: src"), _int(src_offset, "copy_peer: src_offset", 64),
            _int(nbytes, "copy_peer: nbytes", 64), _int(stream, "copy_peer: stream", 32), ctypes.byref(verified)))
        return verified.value == 1

    # -- device memory
    def alloc(self, nbytes, stream=0, device=0):
        """A block of nbytes on `device`, stream-ordered on that device's `stream`.
        OutOfMemoryError (after the reclaim; the message is the pool's diagnostic),
        InvalidArgumentError (also: no such device). May block (bounded) in the reclaim."""
        out = _lib.CHandle()
        nbytes = _int(nbytes, "alloc: nbytes", 64)
        stream = _int(stream, "alloc: stream", 32)
        device = _int(device, "alloc: device", 32)
        if device == 0:
            self._check(self._lib.ferry_alloc(self._live(), nbytes, stream, ctypes.byref(out)))
        else:
            self._check(self._lib.ferry_device_alloc(self._live(), device, nbytes, stream, ctypes.byref(out)))
        return Handle._from_c(out)

    def free(self, h):
        """Stream-ordered free, on the device h names; legal with work in flight.
        StaleHandleError."""
        free = self._lib.ferry_free if self._devices == 1 else self._lib.ferry_device_free
        self._check(free(self._live(), _handle(h, "free")))

    def device_address(self, h):
        """(device address, requested bytes) of the block. StaleHandleError."""
        addr, nbytes = ctypes.c_uint64(), ctypes.c_uint64()
        self._check(self._lib.ferry_device_address(self._live(), _handle(h, "device_address"),
                                                   ctypes.byref(addr), ctypes.byref(nbytes)))
        return addr.value, nbytes.value

    def set_tag(self, h, tag):
        """Names the block for diagnostics: races() names it by `tag` (a str).
        StaleHandleError."""
        if not isinstance(tag, str):
            raise TypeError(f"set_tag: tag must be a str, got {type(tag).__name__}")
        if "\0" in tag:
            raise ValueError("set_tag: tag must not contain a NUL character")
        self._check(self._lib.ferry_set_tag(self._live(), _handle(h, "set_tag"), tag.encode()))

    def trim(self):
        """Releases cached device memory and completed frees."""
        self._check(self._lib.ferry_trim(self._live()))

    # -- transfers
    def upload(self, h, data, stream=0, offset=0):
        """Host -> device: data's bytes (any buffer: bytes, bytearray, memoryview, a
        numpy array; no copy unless it is not contiguous) into h at `offset`. Under
        integrity "verify", returns once the device hash matched. Errors:
        InvalidArgumentError, StaleHandleError, TransferCorruptError, FerryTimeoutError,
        BackendError. Blocks."""
        rt = self._live()
        dst = _handle(h, "upload")
        stream = _int(stream, "upload: stream", 32)
        offset = _int(offset, "upload: offset", 64)
        with self._capture_gate.shared("upload"):
            capture = self._capturing.get(stream)
            if capture is not None:
                # A recorded upload reads its host bytes at every replay, and `data` is
                # lent for this call only: the graph reads a copy it keeps.
                with _lib.Buffer(data) as lent:
                    data = ctypes.create_string_buffer(ctypes.string_at(lent.address, lent.nbytes), lent.nbytes)
                capture[1].append(data)
            with _lib.Buffer(data) as buf:
                upload = self._lib.ferry_upload if self._devices == 1 else self._lib.ferry_device_upload
                self._check(upload(rt, stream, dst, offset, buf.address, buf.nbytes))

    def download(self, h, nbytes=None, stream=0, offset=0):
        """Device -> host: `nbytes` of h from `offset` as bytes (None: the rest of the
        block, which only a device-0 handle can say). Errors as upload. Blocks."""
        if nbytes is None:
            _, size = self.device_address(h)
            offset = _int(offset, "download: offset", 64)
            if offset > size:
                raise _invalid("download: offset %d is past the block's %d bytes" % (offset, size))
            nbytes = size - offset
        out = bytearray(_int(nbytes, "download: nbytes", 64))
        self.download_into(h, out, stream, offset)
        return bytes(out)

    def download_into(self, h, out, stream=0, offset=0):
        """Device -> host into a writable buffer (len(out) bytes, no copy). Errors as upload."""
        rt = self._live()
        src = _handle(h, "download")
        stream = _int(stream, "download: stream", 32)
        offset = _int(offset, "download: offset", 64)
        with _lib.Buffer(out, writable=True) as buf:
            download = self._lib.ferry_download if self._devices == 1 else self._lib.ferry_device_download
            self._check(download(rt, stream, src, offset, buf.address, buf.nbytes))

    # -- the program's own kernels
    def launch(self, stream, operands, fn, flops=0, mem_bytes=0, device=0):
        """Enqueues fn(ctx) over `operands` on `stream` of `device`, leasing them until it ran.

        operands: [(handle, "r" | "w" | "rw"), ...] or (handle, mode, offset, nbytes)
        (nbytes 0: to the end of the block). fn gets a LaunchContext: on sim it runs
        when the op completes, on the operands' bytes; on cuda at dispatch, to
        enqueue kernels on ctx.native_stream. It runs under ferry's lock: it must
        not call ferry. If it raises (or returns a nonzero ferry status), the op
        fails: the error of the later wait (synchronize, download, ...) is a
        BackendError whose message carries the exception, kept in
        .callable_errors. flops, mem_bytes: the modeled cost on sim. The operands are
        blocks of `device` (another device's is a StaleHandleError naming both).
        Errors, before anything is enqueued: StaleHandleError, InvalidArgumentError
        (also: no such device). Never blocks."""
        rt = self._live()
        stream = _int(stream, "launch: stream", 32)
        device = _int(device, "launch: device", 32)
        if not callable(fn):
            raise _invalid("launch: fn %r is not callable" % (fn,))
        try:
            flops = float(flops)
        except (TypeError, ValueError):
            raise _invalid("launch: flops %r is not a number" % (flops,)) from None
        mem_bytes = _int(mem_bytes, "launch: mem_bytes", 64)
        operands = list(operands)
        array = (_lib.Operand * max(1, len(operands)))()
        writable = []
        for i, op in enumerate(operands):
            what = "launch: operand %d" % i
            if not isinstance(op, (tuple, list)) or len(op) not in (2, 4):
                raise _invalid("%s: %r is not (handle, mode) or (handle, mode, offset, nbytes)" % (what, op))
            access = _ACCESS.get(op[1]) if isinstance(op[1], str) else None
            if access is None:
                raise _invalid("%s: mode %r is not 'r', 'w' or 'rw'" % (what, op[1]))
            array[i].handle = _handle(op[0], what)
            array[i].access = access
            if len(op) == 4:
                array[i].offset = _int(op[2], what + ": offset", 64)
                array[i].bytes = _int(op[3], what + ": nbytes", 64)
            writable.append(access != _lib.READ)
        key = next(self._keys)
        with self._capture_gate.shared("launch"):
            if device == 0 and stream in self._capturing:
                # Recorded, not run: the callable runs at each replay of the graph.
                self._graph_callables[key] = (fn, writable)
                self._capturing[stream][0].append(key)
            else:
                self._pending[key] = (fn, writable)
            try:
                if device == 0:
                    self._check(self._lib.ferry_launch(rt, stream, array, len(operands), self._trampoline, key, flops,
                                                       mem_bytes))
                else:
                    self._check(self._lib.ferry_device_launch(rt, device, stream, array, len(operands),
                                                              self._trampoline, key, flops, mem_bytes))
            except BaseException:
                self._pending.pop(key, None)
                self._graph_callables.pop(key, None)
                raise

    def _run_callable(self, ctx_ptr, key):
        # Called by ferry (any thread, the GIL taken by ctypes). Nothing may escape:
        # an exception through ctypes would read as success.
        entry = self._pending.pop(key, None) or self._graph_callables.get(key)
        if entry is None:  # ferry called back twice, or for a launch it refused: our bug
            return BackendError.status
        fn, writable = entry
        _inside.depth = getattr(_inside, "depth", 0) + 1
        views = None
        try:
            ctx = ctx_ptr.contents
            n = ctx.operand_count
            nbytes = [ctx.bytes[i] for i in range(n)] if n else []
            addresses = [ctx.device_addresses[i] for i in range(n)] if n else []
            copies = None
            if ctx.host_views:
                # Copies, never views of ferry's memory: a view can outlive the call.
                copies = [_lib.copy_in(ctx.host_views[i], nbytes[i], writable[i] if i < len(writable) else False)
                          for i in range(n)]
            views = [memoryview(c) for c in copies] if copies is not None else None
            result = fn(LaunchContext(views, ctx.native_stream, addresses, nbytes))
            if result is not None and (isinstance(result, bool) or not isinstance(result, int)
                                       or (result != _lib.OK and result not in _ERRORS)):
                raise TypeError("the launch callable returned %r: return None, 0 (ok) or a ferry status" % (result,))
            for i, c in enumerate(copies or ()):
                if isinstance(c, bytearray):
                    _lib.copy_out(ctx.host_views[i], c)
            return result if result else _lib.OK
        except BaseException as e:  # noqa: B902 — KeyboardInterrupt included: never across C
            if len(self._callable_errors) < 16:
                self._callable_errors.append((BackendError.status, e))
            return BackendError.status
        finally:
            _inside.depth -= 1
            for v in views or ():  # a view kept past the call is released (its slices see only the copy)
                try:
                    v.release()
                except BufferError:  # exported (numpy.frombuffer): harmless, it views a copy
                    pass

    def record_use(self, stream, handles, device=0):
        """PyTorch's record_stream, checked: the blocks (of `device`) stay leased until
        everything enqueued on `stream` of `device` so far completed. StaleHandleError
        (nothing recorded), InvalidArgumentError (no such device)."""
        rt = self._live()
        handles = list(handles)
        array = (_lib.CHandle * max(1, len(handles)))(*[_handle(h, "record_use") for h in handles])
        stream = _int(stream, "record_use: stream", 32)
        device = _int(device, "record_use: device", 32)
        if device == 0:
            self._check(self._lib.ferry_record_use(rt, stream, array, len(handles)))
        else:
            self._check(self._lib.ferry_device_record_use(rt, device, stream, array, len(handles)))

    # -- streams
    def stream_wait(self, stream, for_stream, device=0, for_device=None):
        """Stream `stream` of `device` waits for everything enqueued on `for_stream` of
        `for_device` (None: `device`) so far: an event recorded there, waited on by
        `stream`, without the host (recorded as the trace's `wait` on device 0; across
        devices ferry_device_stream_wait, which the race checker sees too).
        InvalidArgumentError (bad stream, no such device). Never blocks."""
        rt = self._live()
        stream = _int(stream, "stream_wait: stream", 32)
        for_stream = _int(for_stream, "stream_wait: for_stream", 32)
        device = _int(device, "stream_wait: device", 32)
        for_device = device if for_device is None else _int(for_device, "stream_wait: for_device", 32)
        if device == 0 and for_device == 0:
            self._check(self._lib.ferry_stream_wait(rt, stream, for_stream))
        else:
            self._check(self._lib.ferry_device_stream_wait(rt, device, stream, for_device, for_stream))

    def _hold(self, what, stream, device, hold):
        rt = self._live()
        stream = _int(stream, what + ": stream", 32)
        device = _int(device, what + ": device", 32)
        if device == 0:
            self._check(self._lib.ferry_hold(rt, stream, hold))
        else:
            self._check(self._lib.ferry_device_hold(rt, device, stream, hold))

    def hold(self, stream, device=0):
        """New work on `stream` of `device` waits in a host-side queue until release(stream, device)."""
        self._hold("hold", stream, device, 1)

    def release(self, stream, device=0):
        """Ends hold(stream, device) and dispatches what it queued."""
        self._hold("release", stream, device, 0)

    def synchronize(self, device=None):
        """Dispatches held work and waits for every stream of `device` (None: of every
        device). Errors: the first sticky stream fault (a failed launch: BackendError
        with the callable's exception), BackendError, FerryTimeoutError,
        InvalidArgumentError (no such device). Blocks."""
        # Each launch's callable is dropped as it runs (_run_callable), not here:
        # another thread may be launching meanwhile. Destroyed graphs' callables
        # retired before the wait began go once device 0's wait returned (graphs
        # are device 0's): their replays were enqueued before it, so none can call back after.
        rt = self._live()
        devices = range(self._devices) if device is None else [_int(device, "synchronize: device", 32)]
        with self._retired_lock:
            before = {id(entry) for entry in self._retired}
            outs_before = {id(entry) for entry in self._host_outs}
        for d in devices:
            if d == 0:
                self._check(self._lib.ferry_synchronize(rt))
            else:
                self._check(self._lib.ferry_device_synchronize(rt, d))
        # copy_to_host's destinations enqueued before the wait, on a device it waited for, are written.
        with self._retired_lock:
            written = [e for e in self._host_outs if id(e) in outs_before and e[0] in devices]
            self._host_outs = [e for e in self._host_outs if not (id(e) in outs_before and e[0] in devices)]
        release_buffers(buf for _, buf in written)
        if 0 not in devices:
            return
        with self._retired_lock:
            done = [entry for entry in self._retired if id(entry) in before]
            self._retired = [entry for entry in self._retired if id(entry) not in before]
        for keys, kept in done:
            for key in keys:
                self._graph_callables.pop(key, None)
            release_buffers(kept)

    def _retire(self, keys, kept):
        with self._retired_lock:
            self._retired.append((keys, kept))

    def native_stream(self, stream, device=0):
        """The native stream behind ferry stream `stream` of `device` (a cudaStream_t as
        int on cuda, an opaque token on sim)."""
        out = ctypes.c_void_p()
        stream = _int(stream, "native_stream: stream", 32)
        device = _int(device, "native_stream: device", 32)
        if device == 0:
            self._check(self._lib.ferry_native_stream(self._live(), stream, ctypes.byref(out)))
        else:
            self._check(self._lib.ferry_device_native_stream(self._live(), device, stream, ctypes.byref(out)))
        return out.value or 0

    def adopt_stream(self, native, device=0):
        """A ferry stream id of `device` for the program's own native stream (an int,
        e.g. torch.cuda.current_stream().cuda_stream when that is not the default
        stream, which is 0: adopt cudaStreamLegacy, 0x1, for it); the stream calls
        and the handle calls take it with that device. A native stream adopted on
        one device is refused on every other until released.
        InvalidArgumentError (0, adopted already on this or another device, one of
        ferry's own, no such device)."""
        out = ctypes.c_uint32()
        native = _int(native, "adopt_stream: native", 64) or None
        device = _int(device, "adopt_stream: device", 32)
        if device == 0:
            self._check(self._lib.ferry_adopt_stream(self._live(), native, ctypes.byref(out)))
        else:
            self._check(self._lib.ferry_device_adopt_stream(self._live(), device, native, ctypes.byref(out)))
        return out.value

    def release_stream(self, stream, timeout_ms=10000, device=0):
        """Waits (up to timeout_ms) for the adopted stream's work, then forgets it.
        InvalidArgumentError (not adopted on `device`, no such device), FerryTimeoutError."""
        stream = _int(stream, "release_stream: stream", 32)
        timeout_ms = _int(timeout_ms, "release_stream: timeout_ms", 64)
        device = _int(device, "release_stream: device", 32)
        if device == 0:
            self._check(self._lib.ferry_release_stream(self._live(), stream, timeout_ms))
        else:
            self._check(self._lib.ferry_device_release_stream(self._live(), device, stream, timeout_ms))

    # -- statistics
    def pool_stats(self, device=0):
        """ferry_pool_stats of `device`'s pool as a dict (allocated_bytes,
        peak_allocated_bytes, reserved_bytes, peak_reserved_bytes,
        pending_free_bytes, allocs, frees, ooms, reclaims, internal_allocs,
        internal_frees). allocs and frees are the program's blocks; internal_allocs
        and internal_frees ferry's own buffers (the transfer engine's probe and
        canary scratch). InvalidArgumentError (no such device)."""
        out = _lib.PoolStats()
        device = _int(device, "pool_stats: device", 32)
        if device == 0:
            self._check(self._lib.ferry_get_pool_stats_sized(self._live(), ctypes.byref(out), ctypes.sizeof(out)))
        else:
            self._check(self._lib.ferry_device_get_pool_stats_sized(self._live(), device, ctypes.byref(out),
                                                                    ctypes.sizeof(out)))
        return _lib.as_dict(out)

    def races(self):
        """The stream races found (Runtime(race_check=True), sim): {"count": every race,
        "list": [{"earlier": side, "later": side, "addr", "bytes", "reuse"}]} with each
        side {"device", "stream", "ticket", "kind", "tag", "access": "r"|"w"|"rw", "block": Handle
        (Handle() when none), "block_tag"} ("device": the device whose operation it
        is; a peer copy reads its source on the destination's); "reuse" is True when the sides' blocks
        differ (the bytes were handed out again too early). UnsupportedError when the
        runtime does not check races."""
        rt = self._live()
        out = (_lib.Race * 64)()
        kept = ctypes.c_uint32()
        total = ctypes.c_uint64()
        self._check(self._lib.ferry_get_races_sized(rt, out, 64, ctypes.sizeof(_lib.Race), ctypes.byref(kept),
                                                    ctypes.byref(total)))
        marks = {1: "r", 2: "w", 3: "rw"}

        def side(s, device):
            return {"device": device, "stream": s.stream, "ticket": s.ticket, "kind": s.kind.decode(),
                    "tag": s.tag.decode(), "access": marks.get(s.access, "?"), "block": Handle._from_c(s.block),
                    "block_tag": s.block_tag.decode(errors="replace")}

        return {"count": total.value,
                "list": [{"earlier": side(r.earlier, r.earlier_device), "later": side(r.later, r.later_device),
                          "addr": r.addr, "bytes": r.bytes, "reuse": bool(r.reuse)} for r in out[:kept.value]]}

    def integrity_stats(self, device=0):
        """ferry_integrity_stats of `device`'s transfer engine as a dict (bytes_moved,
        bytes_verified, mismatches, retries, fallbacks). InvalidArgumentError (no such device)."""
        out = _lib.IntegrityStats()
        device = _int(device, "integrity_stats: device", 32)
        if device == 0:
            self._check(self._lib.ferry_get_integrity_stats_sized(self._live(), ctypes.byref(out),
                                                                  ctypes.sizeof(out)))
        else:
            self._check(self._lib.ferry_device_get_integrity_stats_sized(self._live(), device, ctypes.byref(out),
                                                                         ctypes.sizeof(out)))
        return _lib.as_dict(out)

    def memory_summary(self):
        """The pool as a table, in the manner of torch.cuda.memory_summary()."""
        rt = self._live()
        length = ctypes.c_size_t()
        self._check(self._lib.ferry_memory_summary(rt, None, 0, ctypes.byref(length)))
        while True:
            buf = ctypes.create_string_buffer(length.value + 1)
            needed = ctypes.c_size_t()
            self._check(self._lib.ferry_memory_summary(rt, buf, len(buf), ctypes.byref(needed)))
            if needed.value < len(buf):  # the pool may have grown between the two calls
                return buf.value.decode(errors="replace")
            length = needed

    # -- the offload cache (cache_slots > 0)
    def cache_define(self, key, pieces):
        """Declares entry `key` as host pieces (a buffer, or a list of buffers)
        uploaded back to back into one slot. ferry reads them while the runtime
        lives: they are held (not resizable) until close(). InvalidArgumentError
        (no cache, duplicate key, no or empty piece)."""
        key = _int(key, "cache_define: key", 64)
        self._cache_pieces[key] = self._define_pieces(self._lib.ferry_cache_define, key, pieces)

    def _define_pieces(self, define, key, pieces):
        """define(rt, key, addresses, sizes, count) over the pieces, held until close();
        their count."""
        rt = self._live()
        if isinstance(pieces, (bytes, bytearray, memoryview)) or hasattr(pieces, "__array_interface__"):
            pieces = [pieces]
        bufs = [_lib.Buffer(p) for p in pieces]
        try:
            addresses = (ctypes.c_void_p * max(1, len(bufs)))(*[b.address for b in bufs])
            sizes = (ctypes.c_uint64 * max(1, len(bufs)))(*[b.nbytes for b in bufs])
            self._check(define(rt, key, addresses, sizes, len(bufs)))
        except BaseException:
            for b in bufs:
                b.release()
            raise
        self._cache_buffers.extend(bufs)
        return len(bufs)

    def cache_acquire(self, key, stream=0):
        """Makes `key` resident, orders `stream` after its upload and pins it:
        CacheSlot(handle, offsets, hit). InvalidArgumentError, OutOfMemoryError
        (every slot pinned), TransferCorruptError. Blocks."""
        rt = self._live()
        key = _int(key, "cache_acquire: key", 64)
        count = self._cache_pieces.get(key, 0)
        slot = _lib.CHandle()
        offsets = (ctypes.c_uint64 * max(1, count))()
        hit = ctypes.c_int()
        self._check(self._lib.ferry_cache_acquire(rt, key, _int(stream, "cache_acquire: stream", 32),
                                                  ctypes.byref(slot), offsets if count else None, ctypes.byref(hit)))
        return CacheSlot(Handle._from_c(slot), list(offsets[:count]), bool(hit.value))

    def cache_release(self, key):
        """Unpins one acquire of `key`."""
        self._check(self._lib.ferry_cache_release(self._live(), _int(key, "cache_release: key", 64)))

    def cache_stats(self):
        """ferry_cache_stats as a dict (hits, misses, evictions, uploads,
        bytes_uploaded, prefetches)."""
        out = _lib.CacheStats()
        self._check(self._lib.ferry_get_cache_stats_sized(self._live(), ctypes.byref(out), ctypes.sizeof(out)))
        return _lib.as_dict(out)

    # -- trace recording
    # -- graph capture (include/ferry/graph.hpp)
    def begin_capture(self, stream=0, pool=None):
        """Records the calls on `stream` (alloc, free, launch, record_use, copy_peer
        within device 0, fill, compute, copy_to_host, and upload under integrity
        "off") until end_capture; a launch's callable then runs at each replay, an
        upload's bytes are copied once, the graph keeping the copy, and a
        copy_to_host's buffer is written at each replay, the graph holding it.
        pool: a Graph whose private pool the capture shares (PyTorch's pool=), or
        None. InvalidArgumentError (a bad or capturing stream, a pool in use by
        another capture, a destroyed graph). Never blocks."""
        stream = _int(stream, "begin_capture: stream", 32)
        if pool is not None and not isinstance(pool, Graph):
            raise _invalid("begin_capture: pool %r is not a ferry.Graph" % (pool,))
        share = pool._live() if pool is not None else None
        with self._capture_gate.alone("begin_capture"):
            self._check(self._lib.ferry_begin_capture(self._live(), stream, share))
            self._capturing[stream] = ([], [])

    def end_capture(self, stream=0):
        """The Graph of what `stream` recorded. InvalidArgumentError (not capturing;
        the capture's first refused call, which spoiled it: a download, synchronize,
        hold, a verified upload, ...). Never blocks."""
        stream = _int(stream, "end_capture: stream", 32)
        out = ctypes.c_void_p()
        with self._capture_gate.alone("end_capture"):
            status = self._lib.ferry_end_capture(self._live(), stream, ctypes.byref(out))
            keys, kept = self._capturing.pop(stream, ([], []))
        if status != _lib.OK:
            for key in keys:
                self._graph_callables.pop(key, None)
            release_buffers(kept)  # a spoiled capture's calls never run
            self._check(status)
        with self._graphs_lock:
            self._live_graphs.add(out.value)
        graph = Graph(self, out, keys, kept)
        self._graphs.add(graph)
        return graph

    def trace_start(self, path):
        """Records the pool calls to `path` (a str or path object) in the replay format
        (`ferry replay PATH`). InvalidArgumentError (None, already recording, a stream
        capturing: a capture begun before recording cannot be written; a path that is
        not a writable regular file: a FIFO, a device), UnsupportedError (a runtime of
        several devices: the recorder writes device 0's calls only). Never blocks."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        self._check(self._lib.ferry_trace_start(self._live(), _text(path, "trace_start: path", optional=False)))

    def trace_stop(self):
        """Flushes and closes the trace. InvalidArgumentError (not recording), BackendError."""
        self._check(self._lib.ferry_trace_stop(self._live()))


from .multi_cache import MultiCache, MultiCacheSlot  # noqa: E402 (it builds on Runtime, above)
