"""Run by test_torch_install.py in a fresh process with the stand-in torch on sys.path:
cudamem.torch.install() end to end, then PyTorch's view of it (the alloc function as PyTorch
would call it, through a C++ harness that catches what it throws).

    python check_install.py EXPECTED_MODE HARNESS_SO
"""

import ctypes
import pickle
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
    ct.install(record_history={"max_entries": 1000})
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

# So are the history and snapshot functions, with torch's signatures (no allocator exists: no
# device is opened).
assert torch.cuda.memory._record_memory_history is ct._torch_record_memory_history
assert torch.cuda.memory_snapshot is ct._torch_memory_snapshot
snap = torch.cuda.memory._snapshot()
assert set(snap) == {"segments", "device_traces", "allocator_settings", "external_annotations"}, snap
assert torch.cuda.memory_snapshot() == [] and torch.cuda.memory.memory_snapshot() == []
torch.cuda.memory._record_memory_history(enabled=None)
torch.cuda.memory._record_memory_history("all", "alloc", "all", 100, None, True, compile_context=False)
torch.cuda.memory._record_memory_history(True, trace_alloc_max_entries=10, trace_alloc_record_context=True)
torch.cuda.memory._record_memory_history(False)
torch.cuda.memory._dump_snapshot("fake_snapshot.pickle")  # in the test's temporary cwd
with open("fake_snapshot.pickle", "rb") as f:
    assert pickle.load(f)["segments"] == []

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
