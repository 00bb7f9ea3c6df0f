"""Steps (b) and (c) of scripts/gpu/torch/run.sh: PyTorch with cudamem installed.

(b) the basic examples — a small tensor, `del`, `torch.cuda.empty_cache()`, a Linear(1000, 1000)
    forward under `torch.no_grad()` and with grad — printing cudamem's statistics after each
    step: what `del` returns to the cache, what empty_cache releases, the lower peak under
    no_grad;
(c) out of memory provoked through torch, caught as torch.OutOfMemoryError, then training goes
    on; and the hooks: memory fraction, record_stream on a side stream, torch's stats functions
    (patched to cudamem's), install() after CUDA was initialised (subprocess), the fallback
    without the C++ shim (subprocess).
Every check prints PASS or FAIL; the exit status is 1 if any failed.
"""

import os
import subprocess
import sys
import time

import cudamem
import cudamem.torch

t0 = time.perf_counter()
cudamem.torch.install()
print(f"cudamem.torch.install(): mode={cudamem.torch.install_mode()!r} in {time.perf_counter() - t0:.2f} s; {cudamem.info()}")

import torch  # noqa: E402

failures = []


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def mib(n):
    return f"{n / 2**20:9.2f} MiB"


def show(label):
    print(
        f"  {label:<58} allocated {mib(cudamem.memory_allocated())}  reserved {mib(cudamem.memory_reserved())}"
        f"  peak allocated {mib(cudamem.max_memory_allocated())}"
    )


print("\n--- (b) basic examples")
show("start")
x = torch.tensor([1.0, 2.0, 3.0]).cuda()
show("x = torch.tensor([1., 2., 3.]).cuda()")
check(x.data_ptr() != 0 and x.tolist() == [1.0, 2.0, 3.0] and (x * 2).sum().item() == 12.0, "small tensor round-trips")
check(cudamem.memory_allocated() == 512, f"a 12-byte tensor takes one 512-byte block ({cudamem.memory_allocated()})")
reserved_before = cudamem.memory_reserved()
del x
show("del x")
check(cudamem.memory_allocated() == 0 and cudamem.memory_reserved() == reserved_before,
      "del returns the block to cudamem's cache (allocated 0, reserved unchanged)")
torch.cuda.empty_cache()
show("torch.cuda.empty_cache()")
check(cudamem.memory_reserved() == 0, f"empty_cache released {mib(reserved_before)} of cache to the driver")

torch.manual_seed(0)
lin = torch.nn.Linear(1000, 1000).cuda()
inp = torch.randn(4096, 1000, device="cuda")
show("lin = Linear(1000, 1000).cuda(); inp = randn(4096, 1000)")
base = cudamem.memory_allocated()


def forward(h):
    for _ in range(4):
        h = lin(h).relu()
    return h


cudamem.reset_peak_memory_stats()
with torch.no_grad():
    out = forward(inp)
show("4 x relu(lin(h)) under torch.no_grad()")
peak_nograd = cudamem.max_memory_allocated() - base
del out
cudamem.reset_peak_memory_stats()
out = forward(inp)
show("4 x relu(lin(h)) with grad (activations kept)")
peak_grad_fwd = cudamem.max_memory_allocated() - base
loss = out.square().mean()
loss.backward()
show("loss.backward()")
peak_grad = cudamem.max_memory_allocated() - base
print(f"  peak above inputs: no_grad {mib(peak_nograd)}; with grad {mib(peak_grad_fwd)} forward, {mib(peak_grad)} with backward")
check(peak_nograd < peak_grad_fwd, "the peak is lower under no_grad")
del out, loss
check(torch.cuda.memory_allocated() == cudamem.memory_allocated(), "torch.cuda.memory_allocated() answers with cudamem's figure")
check(len(torch.cuda.memory_stats()) == 122, "torch.cuda.memory_stats() has the 122 keys")
print(torch.cuda.memory_summary(abbreviated=True))

print("--- (c) out of memory through torch")
opt = torch.optim.SGD(lin.parameters(), lr=0.1)
try:
    torch.empty(10**13, device="cuda")
    check(False, "torch.empty(10**13) raised")
except torch.OutOfMemoryError as e:
    print(f"  caught {type(e).__module__}.{type(e).__name__}: {e}")
    check(isinstance(e, RuntimeError) and "CUDA out of memory. Tried to allocate" in str(e),
          "torch.empty(10**13, device='cuda') raised torch.OutOfMemoryError with cudamem's message")
except RuntimeError as e:
    print(f"  caught {type(e).__name__}: {e}")
    check(cudamem.torch.install_mode() == "c", "OOM raised RuntimeError (expected only in the no-shim fallback)")
check(cudamem.memory_stats()["num_ooms"] == 1, "num_ooms counts it")
losses = []
for _ in range(5):
    opt.zero_grad()
    loss = forward(inp).square().mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())
print("  training after the OOM, losses:", [f"{v:.6f}" for v in losses])
check(all(v == v for v in losses) and losses[-1] < losses[0], "training goes on after the OOM (loss decreases)")

print("--- memory fraction hook")
free, total = torch.cuda.mem_get_info()
torch.cuda.set_per_process_memory_fraction(0.25)
try:
    torch.empty(int(0.3 * total), dtype=torch.uint8, device="cuda")
    check(False, "allocation beyond the fraction raised")
except torch.OutOfMemoryError as e:
    check("allowed;" in str(e), "torch.cuda.set_per_process_memory_fraction(0.25) limits cudamem")
torch.cuda.set_per_process_memory_fraction(1.0)
big = torch.empty(int(0.3 * total), dtype=torch.uint8, device="cuda")
check(big.data_ptr() != 0, "fraction 1.0 lifts the limit")
del big
torch.cuda.empty_cache()

print("--- streams and record_stream hook")
side = torch.cuda.Stream()
a = torch.randn(1 << 22, device="cuda")
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    b = a * 2  # allocated on the side stream
torch.cuda.current_stream().wait_stream(side)
b.record_stream(torch.cuda.current_stream())  # -> cudamem_record_stream
c = b + 1
del b  # reused only after the default stream's work on it is done
d = torch.empty(1 << 22, device="cuda")
d.fill_(7)
torch.cuda.synchronize()
check(torch.equal(c, a * 2 + 1) and d.eq(7).all().item(), "side-stream allocation + record_stream: results correct")
del a, c, d

print("--- torch.cuda.caching_allocator_alloc / delete")
p = torch.cuda.caching_allocator_alloc(1 << 20)
check(cudamem.memory_stats()["allocation.all.current"] >= 1 and p != 0, "caching_allocator_alloc goes through cudamem")
torch.cuda.caching_allocator_delete(p)

print("--- cuDNN convolution, and cudnn.benchmark (information only)")
conv = torch.nn.Conv2d(3, 16, 3).cuda()
img = torch.randn(8, 3, 64, 64, device="cuda")
check(conv(img).shape == (8, 16, 62, 62), "cuDNN convolution (cudnn.benchmark=False) works")
torch.backends.cudnn.benchmark = True
try:
    conv2 = torch.nn.Conv2d(3, 8, 5).cuda()
    conv2(img).sum().item()
    print("INFO cudnn.benchmark=True works with cudamem installed")
except RuntimeError as e:
    print(f"INFO cudnn.benchmark=True fails with the pluggable allocator: {str(e).splitlines()[0]}")
torch.backends.cudnn.benchmark = False
del conv, img

env = {k: v for k, v in os.environ.items() if k != "CUDAMEM_TORCH_SHIM"}

print("--- install() after CUDA was initialised (subprocess)")
late = subprocess.run(
    [sys.executable, "-c",
     "import torch\nx = torch.zeros(1, device='cuda')\nimport cudamem.torch\n"
     "try:\n    cudamem.torch.install()\n    print('installed?!')\n"
     "except RuntimeError as e:\n    print('RuntimeError:', e)\n"],
    capture_output=True, text=True, env=env, timeout=120)
print("  " + (late.stdout + late.stderr).strip().replace("\n", "\n  "))
check("RuntimeError: cudamem.torch.install() must run before the first CUDA tensor" in late.stdout,
      "install() after CUDA init raises a clear RuntimeError")

print("--- the fallback without the C++ shim (subprocess, CUDAMEM_TORCH_NATIVE=0 CUDAMEM_TORCH_SHIM=0)")
fallback = subprocess.run(
    [sys.executable, "-c",
     "import cudamem, cudamem.torch, torch\n"
     "cudamem.torch.install()\n"
     "print('mode', cudamem.torch.install_mode(), 'error_mode', cudamem.info()['error_mode'])\n"
     "x = torch.ones(10, device='cuda')\n"
     "try:\n    torch.empty(10**13, device='cuda')\n    print('no exception?!')\n"
     "except torch.OutOfMemoryError as e:\n    print('torch.OutOfMemoryError:', str(e)[:120])\n"
     "except RuntimeError as e:\n    print('RuntimeError:', str(e)[:160].replace(chr(10), ' '))\n"
     "y = torch.ones(1000, device='cuda')\n"
     "print('after', (x.sum() + y.sum()).item(), 'allocated', cudamem.memory_allocated())\n"],
    capture_output=True, text=True, env=dict(env, CUDAMEM_TORCH_SHIM="0", CUDAMEM_TORCH_NATIVE="0"), timeout=120)
print("  " + (fallback.stdout + fallback.stderr).strip().replace("\n", "\n  "))
check("mode c" in fallback.stdout and "RuntimeError: CUDA out of memory. Tried to allocate" in fallback.stdout
      and "after 1010.0" in fallback.stdout,
      "without the shim, OOM is a RuntimeError with the message and the process goes on")

print(f"\n{len(failures)} failed" + (": " + "; ".join(failures) if failures else ""))
sys.exit(1 if failures else 0)
