"""ferry under PyTorch: ferry's device pool as PyTorch's CUDA allocator, and
host -> device tensor copies under ferry's integrity policy.

    import ferry.torch
    ferry.torch.use_ferry_allocator()      # before the first CUDA allocation
    x = torch.randn(1024, 1024, device="cuda")
    print(ferry.torch.memory_stats())
    ferry.torch.verified_copy_(weights_gpu, weights_cpu)

PyTorch is imported lazily: importing this module works without it, and each
function that needs it raises ImportError saying so. libferry_torch.so
(include/ferry/ferry_torch.h) is found like libferry.so: $FERRY_TORCH_LIBRARY (a
full path), next to an install, in the build tree (build/<preset>/src/torch), then
ctypes.util.find_library("ferry_torch").
"""
import ctypes
import ctypes.util
import os
import threading

from . import _lib
import ferry as _ferry

__all__ = ["use_ferry_allocator", "memory_stats", "verified_copy_", "verify_stats", "library_path",
           "import_snapshot"]

_ENV = "FERRY_TORCH_LIBRARY"
_lock = threading.Lock()
_loaded = None
# verified_copy_'s counters (this process): copies, mismatches, retries, corrupt.
_verify_stats = {"copies": 0, "mismatches": 0, "retries": 0, "corrupt": 0}


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("ferry.torch needs PyTorch, which is not installed here (%s); "
                          "install it (e.g. pip install torch) to use ferry as its allocator" % e) from None
    return torch


def library_path():
    """The path of libferry_torch.so that use_ferry_allocator gives PyTorch.
    OSError, naming the places tried, when there is none."""
    override = os.environ.get(_ENV)
    if override:
        if not os.path.exists(override):
            raise OSError("ferry.torch: %s=%s does not exist" % (_ENV, override))
        return override
    paths = _lib.candidates("libferry_torch.so", _ENV, ("src/torch", "src"))
    for path in paths:
        if os.path.exists(path):
            return path
    system = ctypes.util.find_library("ferry_torch")
    if system:
        return system
    raise OSError("ferry.torch: libferry_torch.so not found; set %s to its full path. Tried: %s"
                  % (_ENV, ", ".join(paths)))


def _library():
    """libferry_torch.so, the same loaded instance PyTorch uses (dlopen of one path
    gives one handle), with its prototypes."""
    global _loaded
    with _lock:
        if _loaded is None:
            loaded = ctypes.CDLL(library_path())
            loaded.ferry_torch_malloc.restype = ctypes.c_void_p
            loaded.ferry_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            loaded.ferry_torch_free.restype = None
            loaded.ferry_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            loaded.ferry_torch_last_error.restype = ctypes.c_char_p
            loaded.ferry_torch_last_error.argtypes = []
            loaded.ferry_torch_get_stats.restype = ctypes.c_int
            loaded.ferry_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_lib.PoolStats)]
            loaded.ferry_torch_get_stats_sized.restype = ctypes.c_int
            loaded.ferry_torch_get_stats_sized.argtypes = [ctypes.c_int, ctypes.POINTER(_lib.PoolStats), ctypes.c_size_t]
            _loaded = loaded
        return _loaded


def use_ferry_allocator():
    """Makes ferry's pool PyTorch's CUDA allocator for this process
    (torch.cuda.memory.change_current_allocator). Call it before anything allocates
    on the GPU: PyTorch refuses to change the allocator after first use (its
    RuntimeError is passed on). Returns the library's path. ImportError without
    PyTorch; OSError without libferry_torch.so."""
    torch = _torch()
    path = library_path()
    _library()  # the same instance PyTorch is about to dlopen; memory_stats reads it
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "ferry_torch_malloc", "ferry_torch_free")
    torch.cuda.memory.change_current_allocator(allocator)
    return path


def memory_stats(device=None):
    """ferry's pool statistics for `device` (default: torch.cuda.current_device()) as a
    dict with ferry_pool_stats's field names; zeros before the first allocation there.
    Errors: the ferry error (e.g. ferry.UnsupportedError without a GPU) that made the
    device's runtime fail."""
    if device is None:
        device = _torch().cuda.current_device()
    elif not isinstance(device, int):
        device = getattr(device, "index", None)
        device = 0 if device is None else device
    lib = _library()
    out = _lib.PoolStats()
    status = lib.ferry_torch_get_stats_sized(int(device), ctypes.byref(out), ctypes.sizeof(out))
    if status != _lib.OK:
        raise _ferry._error(status, lib.ferry_torch_last_error().decode(errors="replace"))
    return _lib.as_dict(out)


def last_error():
    """libferry_torch.so's message of this thread's last failed call ("" if none):
    why an allocation came back empty (the pool's out-of-memory diagnostic, ...)."""
    return _library().ferry_torch_last_error().decode(errors="replace")


def verify_stats():
    """verified_copy_'s counters in this process: copies, mismatches, retries, corrupt."""
    return dict(_verify_stats)


def _copy(dst, src):
    # The copy verified_copy_ checks (a seam: tools/torch-check.py corrupts it).
    dst.copy_(src)


def _host_bytes(t):
    return t.detach().contiguous().reshape(-1).view(_torch().uint8)


def _first_difference(a, b):
    torch = _torch()
    diff = torch.nonzero(a != b)
    return int(diff[0, 0]) if diff.numel() else -1


def verified_copy_(dst, src):
    """dst.copy_(src) for a host `src` and a device `dst` (same shape and dtype),
    checked as ferry checks its uploads: after the copy, dst's bytes are read back
    and compared with src's. On a mismatch the copy is redone once from a pageable
    (unpinned) copy of src, the path report 000's silent pinned-copy failure does not
    take; if dst is still wrong, ferry.TransferCorruptError names the first bad
    byte. Returns dst. Blocks until the copy (and its check) completed.
    InvalidArgumentError for mismatched tensors."""
    torch = _torch()
    if not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
        raise _ferry.InvalidArgumentError("verified_copy_: dst and src must be tensors")
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise _ferry.InvalidArgumentError("verified_copy_: dst %s %s and src %s %s differ in shape or dtype"
                                          % (tuple(dst.shape), dst.dtype, tuple(src.shape), src.dtype))
    if src.device.type != "cpu":
        raise _ferry.InvalidArgumentError("verified_copy_: src is on %s, not the host" % src.device)
    expected = _host_bytes(src)
    _verify_stats["copies"] += 1
    _copy(dst, src)
    got = _host_bytes(dst.cpu())  # .cpu() waits for the copy on dst's stream
    if torch.equal(got, expected):
        return dst
    _verify_stats["mismatches"] += 1
    first = _first_difference(got, expected)
    _verify_stats["retries"] += 1
    pageable = torch.empty(src.shape, dtype=src.dtype, pin_memory=False)
    pageable.copy_(src)
    _copy(dst, pageable)
    got = _host_bytes(dst.cpu())
    if torch.equal(got, expected):
        return dst
    _verify_stats["corrupt"] += 1
    again = _first_difference(got, expected)
    raise _ferry.TransferCorruptError(
        "verified_copy_: %d bytes host -> %s arrived wrong (first bad byte at %d) and again from a pageable "
        "copy (first bad byte at %d)" % (expected.numel(), dst.device, first, again))


def import_snapshot(path_or_dict, out, device=None):
    """Writes a PyTorch memory snapshot's history to `out` as a ferry trace
    (docs/spec.md §3) and returns what the history says (the replay report's
    `source`: peak_requested_bytes, peak_reserved_bytes, ...) as a dict.

    path_or_dict: the path of a file torch.cuda.memory._dump_snapshot wrote, or
    the dict torch.cuda.memory._snapshot() returns (pickled here, protocol 4).
    A file is read by ferry's restricted unpickler, which executes nothing: a
    pickle that names or calls a Python object raises InvalidArgumentError
    naming the opcode and its byte offset, as does a malformed snapshot (naming
    the entry and field). device: the device whose history to import (default:
    the one with the most entries). Needs libferry.so, not PyTorch; then
    `ferry replay OUT` or `ferry bench fragmentation OUT` answers how much memory
    the program needs with ferry.
    """
    import json
    import pickle
    if isinstance(path_or_dict, dict):
        data = pickle.dumps(path_or_dict, protocol=4)
    else:
        with open(os.fspath(path_or_dict), "rb") as f:
            data = f.read()
    lib = _lib.lib()
    length = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(1024)
    status = lib.ferry_import_torch_snapshot(data, len(data), -1 if device is None else int(device),
                                             os.fsencode(os.fspath(out)), buf, len(buf), ctypes.byref(length))
    if status != _lib.OK:
        raise _ferry._error(status, lib.ferry_last_error().decode(errors="replace"))
    return json.loads(buf.value.decode())
