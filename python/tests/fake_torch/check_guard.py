"""Run by test_torch_install.py: on the pluggable path every way into a CUDA graph capture or a
private pool raises an error naming the cause and the fix, in Python and in C++ (the shim's
begin_allocate_to_pool hook), and nothing is captured.

    python check_guard.py EXPECTED_MODE HARNESS_SO
"""

import ctypes
import sys

import torch

import cudamem.torch as ct

expected_mode, harness_path = sys.argv[1], sys.argv[2]
ct.install(native=False)
assert ct.install_mode() == expected_mode, ct.install_mode()


def refused(fn, what):
    try:
        fn()
    except RuntimeError as e:
        text = str(e)
        assert what in text and "pluggable path" in text and "wrong results" in text, text
        assert "torch 2.9 to 2.15" in text and "native=False" in text, text
        print("refused:", what)
        return
    raise AssertionError(f"{what} was not refused")


refused(lambda: torch.cuda.graph(torch.cuda.CUDAGraph()).__enter__(), "CUDA graph capture")
refused(lambda: torch.cuda.CUDAGraph().capture_begin(), "CUDA graph capture")
assert torch.cuda.graphs.captures == [], "nothing was captured"
refused(lambda: torch.cuda.MemPool(), "torch.cuda.MemPool")
refused(lambda: torch.compile(lambda x: x, mode="reduce-overhead"), 'mode="reduce-overhead"')
refused(lambda: torch.compile(mode="max-autotune"), 'mode="max-autotune"')
refused(lambda: torch.compile(lambda x: x, options={"triton.cudagraphs": True}), "triton.cudagraphs")
refused(lambda: torch.compile(lambda x: x, backend="cudagraphs"), 'backend="cudagraphs"')
assert torch.compiled == [], "refused before torch.compile ran"
# What does not capture graphs goes through.
f = lambda x: x  # noqa: E731
assert torch.compile(f) is f and torch.compile(f, mode="max-autotune-no-cudagraphs") is f
assert len(torch.compiled) == 2

hooks = torch.cuda.memory.current.allocator()
if expected_mode == "shim":
    # torch's beginAllocateToPool, from C++: the shim's hook throws c10::Error.
    h = ctypes.CDLL(harness_path)
    h.harness_begin_pool.restype = ctypes.c_int
    h.harness_begin_pool.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    msg = ctypes.create_string_buffer(4096)
    assert hooks.begin_pool, "the shim's pool hook is set"
    rc = h.harness_begin_pool(hooks.begin_pool, msg, len(msg))
    assert rc == 2 and b"pluggable path" in msg.value, (rc, msg.value)
else:
    assert hooks.begin_pool is None
ct.install(native=False)  # again: a no-op, still guarded
refused(lambda: torch.cuda.CUDAGraph().capture_begin(), "CUDA graph capture")
print("OK")
