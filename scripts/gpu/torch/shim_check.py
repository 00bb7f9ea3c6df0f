"""Step (a) of scripts/gpu/torch/run.sh: compile cudamem's C++ shim against the installed torch
and load it, printing the compiler command, its errors if any, and the shim's path."""

import ctypes
import subprocess
import sys
import time

import torch

import cudamem
import cudamem.torch as ct

print("cudamem", cudamem.__version__, "from", cudamem.library_path())
print("torch", torch.__version__, "_GLIBCXX_USE_CXX11_ABI =", torch._C._GLIBCXX_USE_CXX11_ABI)
t0 = time.perf_counter()
try:
    path = ct.build_shim(verbose=True)
except ct.ShimBuildError as e:
    print("SHIM BUILD FAILED:\n", e)
    sys.exit(1)
print(f"shim: {path}  (built in {time.perf_counter() - t0:.1f} s)")
shim = ctypes.CDLL(path)
for name in ("cudamem_torch_malloc", "cudamem_torch_free", "cudamem_torch_shim_init"):
    print(f"  {name} at {ctypes.cast(getattr(shim, name), ctypes.c_void_p).value:#x}")
print(subprocess.run(["ldd", path], capture_output=True, text=True).stdout.strip())
t0 = time.perf_counter()
print("cached:", ct.build_shim() == path, f"({(time.perf_counter() - t0) * 1e3:.1f} ms)")
