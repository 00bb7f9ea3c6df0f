"""Run by test_torch_install.py in a fresh process with the stand-in torch on sys.path:
cudamem.torch.install() end to end, then PyTorch's view of it (the alloc function as PyTorch
would call it, through a C++ harness that catches what it throws).

    python check_install.py EXPECTED_MODE HARNESS_SO
"""

import ctypes
import sys
import warnings

import torch

import cudamem
import cudamem.torch as ct

expected_mode, harness_path = sys.argv[1], sys.argv[2]


def addr(f):
    return ctypes.cast(f, ctypes.c_void_p).value


with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ct.install()
print("mode", ct.install_mode(), "warnings", len(caught))
for w in caught:
    print("warning:", w.message)
assert ct.is_installed() and ct.install_mode() == expected_mode
ct.install()  # again: a no-op

hooks = torch.cuda.memory.current.allocator()
rust = ctypes.CDLL(cudamem.library_path())
assert hooks.reset == addr(rust.cudamem_empty_cache)
assert hooks.fraction == addr(rust.cudamem_set_memory_fraction)
assert hooks.record == addr(rust.cudamem_record_stream)
if expected_mode == "shim":
    assert torch.cuda.memory.current.path.endswith(".so") and "torch_shim" in torch.cuda.memory.current.path
    assert cudamem.info()["error_mode"] == 0
else:
    assert hooks.alloc == addr(rust.cudamem_malloc) and hooks.free == addr(rust.cudamem_free)
    assert cudamem.info()["error_mode"] == 1  # throw through torchCheckFail

# torch.cuda's stats functions are cudamem's now.
assert torch.cuda.memory_allocated is cudamem.memory_allocated
assert torch.cuda.memory.memory_stats is cudamem.memory_stats
assert torch.cuda.memory_allocated() == 0

# PyTorch calling the alloc function. No GPU here: opening cuda:0 fails, and that failure must
# reach PyTorch as a C++ exception (c10::Error -> RuntimeError), never as NULL.
h = ctypes.CDLL(harness_path)
h.harness_malloc.restype = ctypes.c_int
h.harness_malloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                             ctypes.c_char_p, ctypes.c_size_t]
out, msg = ctypes.c_void_p(), ctypes.create_string_buffer(4096)
rc = h.harness_malloc(hooks.alloc, 1 << 20, 0, ctypes.byref(out), msg, len(msg))
print("alloc without a GPU:", rc, msg.value.decode()[:200])
assert rc == 2 and b"cudamem: cannot open the device" in msg.value, (rc, msg.value)
# Size 0 needs no device.
assert h.harness_malloc(hooks.alloc, 0, 0, ctypes.byref(out), msg, len(msg)) == 0 and out.value is None
# The process is fine, and a second failure is reported the same way.
assert h.harness_malloc(hooks.alloc, 64, 0, ctypes.byref(out), msg, len(msg)) == 2

# The free function with a pointer cudamem never handed out: ignored.
free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(hooks.free)
free(0x1234000, 64, 0, None)
assert cudamem.info()["unknown_frees"] == 1
print("OK")
