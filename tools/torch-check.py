#!/usr/bin/env python3
"""ferry under PyTorch on a GPU machine: a small transformer's forward and backward
under PyTorch's native allocator, under expandable segments, and under ferry
(libferry_torch.so), each in a fresh process (an allocator can only be chosen
before the first CUDA allocation); their peak allocated / peak reserved bytes side
by side (on two GPUs the ferry run also frees a cuda:1 tensor from cuda:0 and checks
the thread stays on cuda:0); then a check that ferry.torch.verified_copy_ catches a
corrupted copy.

Usage: tools/torch-check.py [--layers N] [--steps N] [--batch N]
Without PyTorch or without a GPU it prints "SKIP: ..." and exits 0. Exit 1 when a
run fails or verified_copy_ misses the corruption. libferry_torch.so is found as
ferry.torch finds it (FERRY_TORCH_LIBRARY, the install, the build tree).
"""
import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

# One run, in its own process: argv[1] is the allocator, the rest the sizes.
CHILD = r"""
import json, sys
import torch
mode, layers, steps, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if mode == "ferry":
    import ferry.torch as ft
    ft.use_ferry_allocator()
torch.manual_seed(0)
d_model, seq = 512, 256
layer = torch.nn.TransformerEncoderLayer(d_model, nhead=8, dim_feedforward=2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=layers).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _ in range(steps):
    x = torch.randn(batch, seq, d_model, device="cuda")
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
out = {"mode": mode, "loss": float(loss)}
if mode == "ferry":
    s = ft.memory_stats()
    out.update(peak_allocated=s["peak_allocated_bytes"], peak_reserved=s["peak_reserved_bytes"],
               ooms=s["ooms"], reclaims=s["reclaims"])
    if torch.cuda.device_count() >= 2:
        # PyTorch frees a tensor with no device guard: ferry must leave cuda:0 current.
        torch.cuda.set_device(0)
        t = torch.empty(1 << 20, device="cuda:1")
        del t
        out["device_after_cuda1_free"] = torch.cuda.current_device()
else:
    out.update(peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved())
print("RESULT " + json.dumps(out))
"""

# verified_copy_ against a copy corrupted after it ran (a monkeypatched copy).
VERIFY = r"""
import sys
import torch
import ferry, ferry.torch as ft
src = torch.randn(1 << 20)
dst = torch.empty_like(src, device="cuda")
ft.verified_copy_(dst, src)
assert torch.equal(dst.cpu(), src), "a good copy must arrive"
good = ft._copy
calls = []
def corrupt_first(d, s):
    good(d, s)
    if not calls:
        d.view(-1)[12345] += 1.0
    calls.append(1)
ft._copy = corrupt_first
ft.verified_copy_(dst, src)  # caught, redone from a pageable copy
assert torch.equal(dst.cpu(), src) and ft.verify_stats()["retries"] == 1, ft.verify_stats()
def corrupt_always(d, s):
    good(d, s)
    d.view(-1)[0] = float("nan")
ft._copy = corrupt_always
try:
    ft.verified_copy_(dst, src)
except ferry.TransferCorruptError as e:
    print("caught: " + str(e))
else:
    sys.exit("verified_copy_ let a corrupted copy through")
print("RESULT verify ok " + str(ft.verify_stats()))
"""


def child_env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(REPO, "python"), env.get("PYTHONPATH")) if p)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.update(extra or {})
    return env


def run(code, args, env):
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900)
    lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
    return r, (lines[-1][len("RESULT "):] if lines else None)


def mib(n):
    return "%.1f MiB" % (n / (1 << 20))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("SKIP: PyTorch sees no GPU (torch %s)" % torch.__version__)
        return 0
    try:
        import ferry.torch as ft
        path = ft.library_path()
    except OSError as e:
        print("FAIL: %s" % e)
        return 1
    print("torch %s on %s; libferry_torch: %s" % (torch.__version__, torch.cuda.get_device_name(0), path))

    sizes = [str(args.layers), str(args.steps), str(args.batch)]
    runs = [("native", "native", {}), ("expandable", "native", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
            ("ferry", "ferry", {})]
    failed = False
    print("%-11s %16s %16s  %s" % ("allocator", "peak allocated", "peak reserved", "loss"))
    for name, mode, extra in runs:
        r, result = run(CHILD, [mode, *sizes], child_env(extra))
        if r.returncode != 0 or result is None:
            failed = True
            print("%-11s FAILED (exit %d)\n%s" % (name, r.returncode, (r.stdout + r.stderr)[-3000:]))
            continue
        out = json.loads(result)
        note = "  (ooms %d, reclaims %d)" % (out["ooms"], out["reclaims"]) if mode == "ferry" else ""
        if out.get("device_after_cuda1_free", 0) != 0:
            failed = True
            note += "  FAILED: freeing a cuda:1 tensor left the thread on cuda:%d" % out["device_after_cuda1_free"]
        print("%-11s %16s %16s  %.6f%s" % (name, mib(out["peak_allocated"]), mib(out["peak_reserved"]), out["loss"],
                                            note))

    r, result = run(VERIFY, [], child_env())
    if r.returncode != 0 or result is None:
        failed = True
        print("verified_copy_: FAILED (exit %d)\n%s" % (r.returncode, (r.stdout + r.stderr)[-3000:]))
    else:
        print("verified_copy_: %s" % result)
    print("torch-check:", "FAILED" if failed else "ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
