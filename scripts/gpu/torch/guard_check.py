"""Failing closed, on a real torch and GPU: what install() does when the native class is unavailable.

Each case runs in a fresh process (install() must come before CUDA is used):

* ``unbuildable``: no C++ compiler (``CXX`` names none) and an empty build cache, so the native
  class cannot be built: ``install()`` must raise ``NativeBuildError`` naming the cause and the
  fix, and leave torch's own allocator in place (a CUDA graph then works, on torch's allocator).
* ``pluggable``: ``install(native=False)``: CUDA graph capture (``torch.cuda.graph``), a
  ``torch.cuda.MemPool`` and ``torch.compile(mode="reduce-overhead")`` must each raise
  RuntimeError naming the pluggable path, and no graph may be captured; plain tensors work.
* ``native``: ``install()``: the native class, and a CUDA graph whose replay computes what eager
  computes.

    python3 scripts/gpu/torch/guard_check.py            # all three; exit 1 on any failure
"""

import os
import subprocess
import sys
import tempfile

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def unbuildable():
    import torch

    import cudamem.torch
    from cudamem._torch_native import NativeBuildError

    try:
        cudamem.torch.install()
    except NativeBuildError as e:
        text = str(e)
        print("install() raised NativeBuildError:", text.splitlines()[0][:200])
        assert "no C++ compiler" in text and "native=False" in text and "torch 2.9 to 2.15" in text, text
    else:
        raise AssertionError(f"install() did not refuse (mode {cudamem.torch.install_mode()})")
    assert not cudamem.torch.is_installed()
    x = torch.ones(1024, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 2
    g.replay()
    torch.cuda.synchronize()
    assert y.sum().item() == 2048, "torch's own allocator, untouched, captures correctly"
    print("torch's own allocator stayed in place; its CUDA graph computed 2048 as eager does")


@case
def pluggable():
    import torch

    import cudamem.torch

    cudamem.torch.install(native=False)
    print("install(native=False): mode", cudamem.torch.install_mode())
    x = torch.ones(1 << 20, device="cuda")
    assert x.sum().item() == float(1 << 20)

    def refused(what, fn):
        try:
            fn()
        except RuntimeError as e:
            assert "pluggable path" in str(e) and "wrong results" in str(e), str(e)
            print(f"refused: {what}: {str(e)[:150]}...")
            return
        raise AssertionError(f"{what} was not refused")

    g = torch.cuda.CUDAGraph()

    def capture():
        with torch.cuda.graph(g):
            x.mul_(2)

    refused("torch.cuda.graph", capture)
    torch.cuda.synchronize()
    assert x.sum().item() == float(1 << 20), "nothing ran or was captured"
    refused("torch.cuda.MemPool", lambda: torch.cuda.MemPool())
    refused('torch.compile(mode="reduce-overhead")', lambda: torch.compile(lambda t: t * 2, mode="reduce-overhead"))
    f = torch.compile(lambda t: t + 1)  # no CUDA graphs: allowed
    assert f(x).sum().item() == 2.0 * (1 << 20)
    print("torch.compile without CUDA graphs ran")


@case
def native():
    import torch

    import cudamem.torch

    cudamem.torch.install()
    assert cudamem.torch.install_mode() == "native", cudamem.torch.install_mode()
    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = x * 3 + 1
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, x * 3 + 1)
    print("native class: a CUDA graph's replay equals eager")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--case":
        CASES[sys.argv[2]]()
        print("OK")
        return 0
    failed = []
    for name in CASES:
        env = dict(os.environ, CUDAMEM_CACHE_DIR=tempfile.mkdtemp(prefix="cudamem-guard-"))
        env.pop("CUDAMEM_TORCH_NATIVE", None)
        if name == "unbuildable":
            env["CXX"] = "/nonexistent/g++"
        r = subprocess.run([sys.executable, __file__, "--case", name], capture_output=True, text=True, env=env,
                           timeout=300)
        ok = r.returncode == 0 and r.stdout.rstrip().endswith("OK")
        print(f"== {name}: {'PASS' if ok else 'FAIL'}")
        print("   " + (r.stdout + ("" if ok else r.stderr[-2000:])).strip().replace("\n", "\n   "))
        if not ok:
            failed.append(name)
    print("guard checks:", "all passed" if not failed else f"FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
