"""ferry.torch: what works without PyTorch (the library, its stats, the ImportError),
and, where PyTorch and a GPU are present, the allocator and verified_copy_.
tools/torch-check.py is the fuller GPU check (a transformer under each allocator)."""
import importlib.util
import os

import pytest

import ferry
import ferry.torch as ft

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _library_or_skip():
    try:
        return ft.library_path()
    except OSError as e:
        pytest.skip("libferry_torch.so is not built: %s" % e)


@pytest.mark.skipif(HAVE_TORCH, reason="PyTorch is installed")
def test_without_torch_each_call_says_so():
    for call in (ft.use_ferry_allocator, lambda: ft.verified_copy_(None, None), ft.memory_stats):
        with pytest.raises(ImportError, match="PyTorch"):
            call()


def test_the_library_override_is_honoured(monkeypatch, tmp_path):
    monkeypatch.setenv("FERRY_TORCH_LIBRARY", str(tmp_path / "nowhere.so"))
    with pytest.raises(OSError, match="FERRY_TORCH_LIBRARY"):
        ft.library_path()


def test_stats_of_an_untouched_device_are_zero():
    _library_or_skip()
    stats = ft.memory_stats(device=5)
    assert set(stats) == {"allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
                          "pending_free_bytes", "allocs", "frees", "ooms", "reclaims", "internal_allocs", "internal_frees"}
    assert all(v == 0 for v in stats.values())
    with pytest.raises(ferry.InvalidArgumentError):
        ft.memory_stats(device=-1)


def test_without_a_gpu_the_allocator_fails_politely():
    _library_or_skip()
    lib = ft._library()
    p = lib.ferry_torch_malloc(1 << 20, 0, None)
    if p:
        lib.ferry_torch_free(p, 1 << 20, 0, None)
        pytest.skip("this machine has a GPU")
    assert len(ft.last_error()) > 10
    with pytest.raises(ferry.Error):
        ft.memory_stats(device=0)  # the device's runtime could not be made
    lib.ferry_torch_free(None, 0, 0, None)


needs_gpu = pytest.mark.skipif(not HAVE_TORCH or not __import__("torch").cuda.is_available(),
                               reason="needs PyTorch with a GPU")


@needs_gpu
def test_verified_copy_passes_a_good_copy_and_catches_a_corrupt_one(monkeypatch):
    import torch
    src = torch.randn(1024)
    dst = torch.empty(1024, device="cuda")
    ft.verified_copy_(dst, src)
    assert torch.equal(dst.cpu(), src)

    def corrupt(d, s):
        d.copy_(s)
        d.view(-1)[7] = 1e9

    monkeypatch.setattr(ft, "_copy", corrupt)
    with pytest.raises(ferry.TransferCorruptError):
        ft.verified_copy_(dst, src)


@needs_gpu
def test_the_allocator_in_a_fresh_process():
    import subprocess
    import sys
    code = ("import torch, ferry.torch as ft\n"
            "ft.use_ferry_allocator()\n"
            "x = torch.randn(1 << 20, device='cuda'); y = (x * 2).sum().item()\n"
            "s = ft.memory_stats(); assert s['allocs'] > 0, s\n"
            "del x; torch.cuda.synchronize(); print('ok', s)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
