"""libferry.so through ctypes: where it is found, and the C ABI's types and
prototypes (include/ferry/ferry.h, mirrored field for field). When it loads the
library, each mirror's size is checked against the library's own
(ferry_struct_size): a library built from another header is refused, naming the
struct, rather than read or written past its end.

The library is loaded on first use, not at import, so that `import ferry` (and
ferry.torch, which needs only libferry_torch.so) works where libferry.so is not
built; the first Runtime then says where it looked.
"""
import ctypes
import ctypes.util
import glob
import os
import threading

# ---- Finding a shared library of ferry's -------------------------------------

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# The build tree's presets, best first: release before the sanitized dev build,
# which a plain python can load only with the ASan runtime preloaded.
_PRESETS = ("release", "cpu-only", "dev")


def candidates(filename, env, build_subdirs):
    """The paths tried for `filename` (e.g. "libferry.so"), in order: $env; next to
    an install (<prefix>/lib/python3.X/site-packages/ferry -> <prefix>/lib, lib64,
    lib/<multiarch>); a build tree of the source checkout (build/<preset>/<subdir>)."""
    found = []
    override = os.environ.get(env)
    if override:
        found.append(override)
    prefix_lib = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", ".."))
    prefix = os.path.dirname(prefix_lib)
    for libdir in (prefix_lib, os.path.join(prefix, "lib64")):
        found.append(os.path.join(libdir, filename))
        found.extend(sorted(glob.glob(os.path.join(libdir, "*-linux-*", filename))))
    source = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", ".."))
    builds = sorted(glob.glob(os.path.join(source, "build", "*")),
                    key=lambda d: (_PRESETS.index(os.path.basename(d)) if os.path.basename(d) in _PRESETS
                                   else len(_PRESETS), d))
    for build in builds:
        for sub in build_subdirs:
            found.append(os.path.join(build, sub, filename))
    return found


def load(name, env, build_subdirs):
    """ctypes.CDLL of lib<name>.so: $env when set (and only it), else the first
    candidate that exists, else ctypes.util.find_library(name). OSError, naming
    every place tried, when none loads."""
    filename = "lib%s.so" % name
    override = os.environ.get(env)
    if override:
        try:
            return ctypes.CDLL(override)
        except OSError as e:
            raise OSError("ferry: %s=%s does not load: %s" % (env, override, e)) from None
    tried = []
    for path in candidates(filename, env, build_subdirs):
        if os.path.exists(path):
            try:
                return ctypes.CDLL(path)
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
        else:
            tried.append(path)
    system = ctypes.util.find_library(name)
    if system:
        try:
            return ctypes.CDLL(system)
        except OSError as e:
            tried.append("%s (%s)" % (system, e))
    raise OSError("ferry: %s not found; set %s to its full path. Tried: %s" % (filename, env, ", ".join(tried)))


# ---- The C ABI's types ----------------------------------------------------------

OK = 0
READ, WRITE, READ_WRITE = 1, 2, 3


class CHandle(ctypes.Structure):
    _fields_ = [("pool", ctypes.c_uint32), ("slot", ctypes.c_uint32), ("generation", ctypes.c_uint32)]


class _Sized(ctypes.Structure):
    """A struct that grows (ferry.h: "Structs that grow carry their size"): it
    starts with struct_size, set here to this mirror's size."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(self)


class RuntimeOptions(_Sized):
    _fields_ = [("struct_size", ctypes.c_size_t), ("backend", ctypes.c_char_p), ("profile", ctypes.c_char_p), ("capacity", ctypes.c_uint64),
                ("seed", ctypes.c_uint64), ("integrity", ctypes.c_char_p), ("inject", ctypes.c_char_p),
                ("cache_slots", ctypes.c_uint32), ("cache_slot_bytes", ctypes.c_uint64),
                ("race_check", ctypes.c_int), ("device_count", ctypes.c_uint64),
                ("links", ctypes.c_char_p)]


class Operand(ctypes.Structure):
    _fields_ = [("handle", CHandle), ("offset", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("access", ctypes.c_uint32)]


class LaunchContext(ctypes.Structure):
    _fields_ = [("native_stream", ctypes.c_void_p), ("operand_count", ctypes.c_uint32),
                ("device_addresses", ctypes.POINTER(ctypes.c_uint64)), ("bytes", ctypes.POINTER(ctypes.c_uint64)),
                ("host_views", ctypes.POINTER(ctypes.c_void_p))]


def _stats(*names):
    return [("struct_size", ctypes.c_size_t)] + [(n, ctypes.c_uint64) for n in names]


class PoolStats(_Sized):
    _fields_ = _stats("allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
                      "pending_free_bytes", "allocs", "frees", "ooms", "reclaims", "internal_allocs",
                      "internal_frees")


class IntegrityStats(_Sized):
    _fields_ = _stats("bytes_moved", "bytes_verified", "mismatches", "retries", "fallbacks")


class CacheStats(_Sized):
    _fields_ = _stats("hits", "misses", "evictions", "uploads", "bytes_uploaded", "prefetches")


class RaceSide(ctypes.Structure):
    _fields_ = [("stream", ctypes.c_uint32), ("ticket", ctypes.c_uint64), ("kind", ctypes.c_char_p),
                ("tag", ctypes.c_char_p), ("access", ctypes.c_uint32), ("block", CHandle),
                ("block_tag", ctypes.c_char_p)]


class Race(ctypes.Structure):
    _fields_ = [("earlier", RaceSide), ("later", RaceSide), ("addr", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("reuse", ctypes.c_int), ("earlier_device", ctypes.c_uint32), ("later_device", ctypes.c_uint32)]


def as_dict(struct):
    """The fields a caller reads, by name (struct_size is the ABI's, not a figure)."""
    return {name: getattr(struct, name) for name, _ in struct._fields_ if name != "struct_size"}


# Every struct of ferry.h and its mirror here.
MIRRORS = {"ferry_handle": CHandle, "ferry_runtime_options": RuntimeOptions, "ferry_operand": Operand,
           "ferry_launch_context": LaunchContext, "ferry_pool_stats": PoolStats,
           "ferry_integrity_stats": IntegrityStats, "ferry_race_side": RaceSide, "ferry_race": Race,
           "ferry_cache_stats": CacheStats}


def check_mirrors(loaded, mirrors=None):
    """OSError naming the first struct whose mirror's size differs from the size
    `loaded` (a libferry.so) was built with, or that the library does not know."""
    size_of = getattr(loaded, "ferry_struct_size", None)
    if size_of is None:
        raise OSError("ferry: %s has no ferry_struct_size: it is older than this package (%s); use the "
                      "libferry.so this package came with" % (getattr(loaded, "_name", "libferry.so"),
                                                                   _package_version()))
    size_of.restype = ctypes.c_size_t
    size_of.argtypes = [ctypes.c_char_p]
    for name, mirror in (MIRRORS if mirrors is None else mirrors).items():
        theirs, ours = size_of(name.encode()), ctypes.sizeof(mirror)
        if theirs != ours:
            raise OSError("ferry: %s lays out %s in %d bytes, this package's mirror (%s) in %d: the library "
                          "(%s) and the package (%s) are from different versions of ferry.h"
                          % (getattr(loaded, "_name", "libferry.so"), name, theirs, mirror.__name__, ours,
                             _library_version(loaded), _package_version()))


def _package_version():
    from . import __version__
    return __version__


def _library_version(loaded):
    fn = loaded.ferry_version
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn().decode(errors="replace")


LAUNCH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(LaunchContext), ctypes.c_void_p)

_rt = ctypes.c_void_p
_status = ctypes.c_int
_u32, _u64, _p = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p

# name: (restype, argtypes)
_PROTOTYPES = {
    "ferry_version": (ctypes.c_char_p, []),
    "ferry_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "ferry_last_error": (ctypes.c_char_p, []),
    "ferry_struct_size": (ctypes.c_size_t, [ctypes.c_char_p]),
    "ferry_runtime_options_init": (None, [ctypes.POINTER(RuntimeOptions)]),
    "ferry_runtime_options_init_sized": (_status, [ctypes.POINTER(RuntimeOptions), ctypes.c_size_t]),
    "ferry_runtime_create": (_status, [ctypes.POINTER(RuntimeOptions), ctypes.POINTER(_rt)]),
    "ferry_runtime_destroy": (None, [_rt]),
    "ferry_alloc": (_status, [_rt, _u64, _u32, ctypes.POINTER(CHandle)]),
    "ferry_free": (_status, [_rt, CHandle]),
    "ferry_device_address": (_status, [_rt, CHandle, ctypes.POINTER(_u64), ctypes.POINTER(_u64)]),
    "ferry_device_count": (_status, [_rt, ctypes.POINTER(_u32)]),
    "ferry_device_link": (_status, [_rt, _u32, _u32, ctypes.POINTER(ctypes.c_char_p)]),
    "ferry_device_of": (_status, [_rt, CHandle, ctypes.POINTER(_u32)]),
    "ferry_device_alloc": (_status, [_rt, _u32, _u64, _u32, ctypes.POINTER(CHandle)]),
    "ferry_device_free": (_status, [_rt, CHandle]),
    "ferry_device_upload": (_status, [_rt, _u32, CHandle, _u64, _p, _u64]),
    "ferry_device_download": (_status, [_rt, _u32, CHandle, _u64, _p, _u64]),
    "ferry_copy_peer": (_status, [_rt, CHandle, _u64, CHandle, _u64, _u64, _u32, ctypes.POINTER(ctypes.c_int)]),
    "ferry_device_stream_wait": (_status, [_rt, _u32, _u32, _u32, _u32]),
    "ferry_device_launch": (_status, [_rt, _u32, _u32, ctypes.POINTER(Operand), _u32, LAUNCH_FN, _p, ctypes.c_double,
                                      _u64]),
    "ferry_device_record_use": (_status, [_rt, _u32, _u32, ctypes.POINTER(CHandle), _u32]),
    "ferry_device_hold": (_status, [_rt, _u32, _u32, ctypes.c_int]),
    "ferry_device_synchronize": (_status, [_rt, _u32]),
    "ferry_device_native_stream": (_status, [_rt, _u32, _u32, ctypes.POINTER(_p)]),
    "ferry_device_get_pool_stats_sized": (_status, [_rt, _u32, ctypes.POINTER(PoolStats), ctypes.c_size_t]),
    "ferry_device_get_integrity_stats_sized": (_status, [_rt, _u32, ctypes.POINTER(IntegrityStats),
                                                         ctypes.c_size_t]),
    "ferry_set_tag": (_status, [_rt, CHandle, ctypes.c_char_p]),
    "ferry_trim": (_status, [_rt]),
    "ferry_upload": (_status, [_rt, _u32, CHandle, _u64, _p, _u64]),
    "ferry_download": (_status, [_rt, _u32, CHandle, _u64, _p, _u64]),
    "ferry_launch": (_status, [_rt, _u32, ctypes.POINTER(Operand), _u32, LAUNCH_FN, _p, ctypes.c_double, _u64]),
    "ferry_record_use": (_status, [_rt, _u32, ctypes.POINTER(CHandle), _u32]),
    "ferry_hold": (_status, [_rt, _u32, ctypes.c_int]),
    "ferry_stream_wait": (_status, [_rt, _u32, _u32]),
    "ferry_synchronize": (_status, [_rt]),
    "ferry_native_stream": (_status, [_rt, _u32, ctypes.POINTER(_p)]),
    "ferry_adopt_stream": (_status, [_rt, _p, ctypes.POINTER(_u32)]),
    "ferry_release_stream": (_status, [_rt, _u32, _u64]),
    "ferry_get_pool_stats": (_status, [_rt, ctypes.POINTER(PoolStats)]),
    "ferry_get_pool_stats_sized": (_status, [_rt, ctypes.POINTER(PoolStats), ctypes.c_size_t]),
    "ferry_get_integrity_stats": (_status, [_rt, ctypes.POINTER(IntegrityStats)]),
    "ferry_get_integrity_stats_sized": (_status, [_rt, ctypes.POINTER(IntegrityStats), ctypes.c_size_t]),
    "ferry_memory_summary": (_status, [_rt, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "ferry_import_torch_snapshot": (_status, [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_char_p,
                                              ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
    "ferry_cache_define": (_status, [_rt, _u64, ctypes.POINTER(_p), ctypes.POINTER(_u64), _u32]),
    "ferry_cache_acquire": (_status, [_rt, _u64, _u32, ctypes.POINTER(CHandle), ctypes.POINTER(_u64),
                                      ctypes.POINTER(ctypes.c_int)]),
    "ferry_cache_release": (_status, [_rt, _u64]),
    "ferry_get_cache_stats": (_status, [_rt, ctypes.POINTER(CacheStats)]),
    "ferry_get_cache_stats_sized": (_status, [_rt, ctypes.POINTER(CacheStats), ctypes.c_size_t]),
    "ferry_get_races": (_status, [_rt, ctypes.POINTER(Race), ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32),
                                  ctypes.POINTER(ctypes.c_uint64)]),
    "ferry_get_races_sized": (_status, [_rt, ctypes.POINTER(Race), ctypes.c_uint32, ctypes.c_size_t,
                                        ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)]),
    "ferry_trace_start": (_status, [_rt, ctypes.c_char_p]),
    "ferry_trace_stop": (_status, [_rt]),
    "ferry_begin_capture": (_status, [_rt, _u32, _p]),
    "ferry_end_capture": (_status, [_rt, _u32, ctypes.POINTER(_p)]),
    "ferry_graph_launch": (_status, [_rt, _p, _u32]),
    "ferry_graph_destroy": (_status, [_p]),
}
# ferry's own device work (ferry.h): fill, compute, the asynchronous copy to the host.
_PROTOTYPES.update({
    "ferry_fill": (_status, [_rt, _u32, CHandle, _u64]),
    "ferry_compute": (_status, [_rt, _u32, ctypes.POINTER(CHandle), _u32, CHandle, ctypes.c_double, _u64]),
    "ferry_copy_to_host": (_status, [_rt, _u32, CHandle, _p, _u64]),
    "ferry_device_fill": (_status, [_rt, _u32, _u32, CHandle, _u64]),
    "ferry_device_compute": (_status, [_rt, _u32, _u32, ctypes.POINTER(CHandle), _u32, CHandle, ctypes.c_double,
                                       _u64]),
    "ferry_device_copy_to_host": (_status, [_rt, _u32, _u32, CHandle, _p, _u64]),
})


# ---- Several devices: adopted streams on any device, one offload cache across
# the devices (ferry.h's section of that name).

class MultiCacheStats(_Sized):
    _fields_ = _stats("peer_fills", "host_fills", "bytes_peer")


MIRRORS["ferry_multi_cache_stats"] = MultiCacheStats

_PROTOTYPES.update({
    "ferry_device_adopt_stream": (_status, [_rt, _u32, _p, ctypes.POINTER(_u32)]),
    "ferry_device_release_stream": (_status, [_rt, _u32, _u32, _u64]),
    "ferry_multi_cache_create": (_status, [_rt, _u32, _u64, ctypes.c_char_p]),
    "ferry_multi_cache_define": (_status, [_rt, _u64, ctypes.POINTER(_p), ctypes.POINTER(_u64), _u32]),
    "ferry_multi_cache_placed": (_status, [_rt, _u64, ctypes.POINTER(_u32)]),
    "ferry_multi_cache_acquire": (_status, [_rt, _u64, _u32, _u32, ctypes.POINTER(CHandle), ctypes.POINTER(_u64),
                                            ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)]),
    "ferry_multi_cache_release": (_status, [_rt, _u64, _u32]),
    "ferry_get_multi_cache_stats_sized": (_status, [_rt, ctypes.POINTER(MultiCacheStats), ctypes.c_size_t]),
    "ferry_get_multi_cache_device_stats_sized": (_status, [_rt, _u32, ctypes.POINTER(CacheStats), ctypes.c_size_t]),
})

_lock = threading.Lock()
_lib = None


def lib():
    """libferry.so with every prototype declared (loaded once). OSError if absent."""
    global _lib
    with _lock:
        if _lib is None:
            loaded = load("ferry", "FERRY_LIBRARY", ("src", "src/capi"))
            check_mirrors(loaded)
            for name, (restype, argtypes) in _PROTOTYPES.items():
                fn = getattr(loaded, name)  # AttributeError: a libferry.so older than this package
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = loaded
        return _lib


# ---- Any Python buffer as a pointer, without a copy -----------------------------

class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer (stable since 3.3).
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_PyBUF_SIMPLE, _PyBUF_WRITABLE = 0, 1
_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


class Buffer:
    """The bytes of a Python object with the buffer protocol (bytes, bytearray,
    memoryview, array.array, a numpy array...), C-contiguous, as (address, nbytes),
    without a copy; a non-contiguous one is copied once. Held (the exporter cannot
    resize or free it) until release()."""

    def __init__(self, obj, writable=False):
        self._view = None
        self._keep = None
        view = _PyBuffer()
        try:
            _get_buffer(obj, ctypes.byref(view), _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE)
        except (BufferError, ValueError):  # numpy says ValueError for "not C-contiguous"
            if writable:
                raise
            # Not contiguous (a strided numpy slice): one copy, in C order.
            self._keep = memoryview(obj).tobytes()
            _get_buffer(self._keep, ctypes.byref(view), _PyBUF_SIMPLE)
        self._view = view
        self.address = view.buf or 0
        self.nbytes = view.len

    def release(self):
        if self._view is not None:
            _release_buffer(ctypes.byref(self._view))
            self._view = None
            self._keep = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def copy_in(address, nbytes, writable):
    """nbytes at address as a Python-owned copy: a bytearray when writable, else bytes."""
    data = ctypes.string_at(address, nbytes) if nbytes else b""
    return bytearray(data) if writable else data


def copy_out(address, data):
    """data's bytes (a bytearray) back to address."""
    if data:
        ctypes.memmove(address, (ctypes.c_char * len(data)).from_buffer(data), len(data))
