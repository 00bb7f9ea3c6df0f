"""Memory history with Python stacks: the entries, their frames, the ring and its settings
(simulated GPU; no torch needed). Snapshots and the reports on them: test_snapshot.py.
"""

import ctypes
import os
import shutil
import subprocess
import threading

import pytest

import cudamem
from cudamem import _cudamem

from history_common import ACTIONS, MiB, _block_at, _entries, _names, _one, history_off  # noqa: F401 (autouse)

THIS_FILE = os.path.basename(__file__)


def _allocate_here(dev, size):
    return cudamem.malloc(size, dev)  # the line the alloc entry's frame must name


# ------------------------------------------------------------------------------------------
# History entries and their Python frames
# ------------------------------------------------------------------------------------------


def test_alloc_and_free_entries_carry_the_python_frames_of_the_caller(dev):
    cudamem.record_memory_history(device=dev)  # enabled="all", context="all"
    assert _cudamem._stack_mode(dev) == 2
    p = _allocate_here(dev, 3 * MiB)
    cudamem.free(p, dev)
    ev = _entries(dev)
    assert {e["action"] for e in ev} <= ACTIONS
    assert ev[-1]["action"] == "snapshot"

    alloc = _one(ev, "alloc", p)
    assert alloc["size"] == 3 * MiB and alloc["stream"] == 0
    frames = alloc["frames"]
    names = _names(frames)
    me = "test_alloc_and_free_entries_carry_the_python_frames_of_the_caller"
    # Innermost first: cudamem's wrapper, the helper, this test, then pytest's frames.
    assert names[0] == "malloc" and frames[0]["filename"].endswith(os.path.join("cudamem", "__init__.py"))
    assert names.index("_allocate_here") < names.index(me)
    helper = frames[names.index("_allocate_here")]
    assert os.path.basename(helper["filename"]) == THIS_FILE
    assert helper["line"] == _allocate_here.__code__.co_firstlineno + 1
    assert set(helper) == {"name", "filename", "line"}

    # context="all": the free carries the stack of the code that freed (here: this test).
    freed = _one(ev, "free_requested", p)
    fnames = _names(freed["frames"])
    assert fnames[0] == "free" and me in fnames and "_allocate_here" not in fnames
    assert _one(ev, "free_completed", p)["size"] == 3 * MiB
    for e in ev:
        assert {"action", "size", "stream", "time_us", "compile_context", "user_metadata"} <= set(e)
    times = [e["time_us"] for e in ev]
    assert times == sorted(times)


def test_live_blocks_and_segments_carry_the_allocating_stack(dev):
    cudamem.record_memory_history(device=dev)
    p = _allocate_here(dev, 5 * MiB)
    snap = cudamem.snapshot(dev)
    b = _block_at(snap, p)
    assert b["state"] == "active_allocated" and b["requested_size"] == 5 * MiB
    assert "_allocate_here" in _names(b["frames"])
    seg = next(s for s in snap["segments"] if s["address"] <= p < s["address"] + s["total_size"])
    assert "_allocate_here" in _names(seg["frames"])
    cudamem.free(p, dev)
    b = _block_at(cudamem.snapshot(dev), p)
    assert b["state"] == "inactive" and b["frames"] == []


def _worker(dev, out):
    out.append(cudamem.malloc(MiB, dev))


def test_an_allocation_from_another_thread_carries_that_threads_stack(dev):
    cudamem.record_memory_history(device=dev)
    out = []
    t = threading.Thread(target=_worker, args=(dev, out))
    t.start()
    t.join()
    names = _names(_one(_entries(dev), "alloc", out[0])["frames"])
    assert "_worker" in names and "run" in names
    assert "test_an_allocation_from_another_thread_carries_that_threads_stack" not in names
    cudamem.free(out[0], dev)


def _c_abi(pydll=False):
    lib = (ctypes.PyDLL if pydll else ctypes.CDLL)(cudamem.library_path())
    lib.cudamem_malloc.restype = ctypes.c_void_p
    lib.cudamem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cudamem_free.restype = None
    lib.cudamem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return lib


def _alloc_through_c(lib, dev):
    return lib.cudamem_malloc(2 * MiB, dev, None)


@pytest.mark.parametrize("gil", ["released", "held"])
def test_the_c_abi_records_the_python_stack_with_or_without_the_gil(dev, gil):
    # ctypes.CDLL releases the GIL around the call (as PyTorch's autograd and many ops do),
    # ctypes.PyDLL keeps it (as a tensor created from Python does): both must work, neither
    # may deadlock, and the frames are the calling thread's.
    lib = _c_abi(pydll=(gil == "held"))
    cudamem.record_memory_history(device=dev)
    p = _alloc_through_c(lib, dev)
    assert p
    lib.cudamem_free(p, 2 * MiB, dev, None)
    ev = _entries(dev)
    names = _names(_one(ev, "alloc", p)["frames"])
    assert names[0] == "_alloc_through_c"
    assert "test_the_c_abi_records_the_python_stack_with_or_without_the_gil" in names
    assert "test_the_c_abi_records_the_python_stack_with_or_without_the_gil" in _names(_one(ev, "free_requested", p)["frames"])


NATIVE_THREAD = r"""
#include <cstddef>
#include <thread>
typedef void* (*malloc_fn)(size_t, int, void*);
typedef void (*free_fn)(void*, size_t, int, void*);
// Allocates and frees on a new native thread, which has no Python thread state (like
// PyTorch's autograd engine threads), and returns the address.
extern "C" void* alloc_on_native_thread(void* m, void* f, size_t size, int device) {
    void* out = nullptr;
    std::thread t([&] {
        out = reinterpret_cast<malloc_fn>(m)(size, device, nullptr);
        reinterpret_cast<free_fn>(f)(out, size, device, nullptr);
    });
    t.join();
    return out;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_a_thread_without_python_records_no_frames_and_does_not_hang(dev, tmp_path):
    src = tmp_path / "native_thread.cpp"
    src.write_text(NATIVE_THREAD)
    so = tmp_path / "native_thread.so"
    r = subprocess.run(["g++", "-O1", "-shared", "-fPIC", "-std=c++17", "-pthread", str(src), "-o", str(so)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    h = ctypes.CDLL(str(so))  # CDLL: the GIL is released while the native thread runs
    h.alloc_on_native_thread.restype = ctypes.c_void_p
    h.alloc_on_native_thread.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib = _c_abi()
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    cudamem.record_memory_history(device=dev)
    p = h.alloc_on_native_thread(addr(lib.cudamem_malloc), addr(lib.cudamem_free), MiB, dev)
    assert p
    ev = _entries(dev)
    assert "frames" not in _one(ev, "alloc", p)
    assert "frames" not in _one(ev, "free_requested", p)


def test_out_of_memory_is_recorded_with_the_stack(dev):
    cudamem.record_memory_history(device=dev)
    with pytest.raises(cudamem.OutOfMemoryError):
        cudamem.malloc(1 << 50, dev)
    oom = [e for e in _entries(dev) if e["action"] == "oom"]
    assert len(oom) == 1
    assert oom[0]["size"] == 1 << 50 and "device_free" in oom[0] and "addr" not in oom[0]
    assert "test_out_of_memory_is_recorded_with_the_stack" in _names(oom[0]["frames"])


# ------------------------------------------------------------------------------------------
# Settings: ring, enabled, context, device
# ------------------------------------------------------------------------------------------


def test_the_ring_keeps_the_last_max_entries(dev):
    cudamem.record_memory_history(max_entries=5, device=dev)
    ptrs = [cudamem.malloc(MiB, dev) for _ in range(20)]
    ev = _entries(dev)
    assert len(ev) == 5
    assert ev[-1]["action"] == "snapshot"
    kept = [e["addr"] for e in ev if e["action"] == "alloc"]
    assert kept and kept == ptrs[len(ptrs) - len(kept):]  # the newest
    for p in ptrs:
        cudamem.free(p, dev)
    assert len(_entries(dev)) == 5


def test_enabled_state_keeps_one_entry_but_the_stacks_of_live_blocks(dev):
    cudamem.record_memory_history(enabled="state", max_entries=1000, device=dev)
    p = _allocate_here(dev, MiB)
    snap = cudamem.snapshot(dev)
    assert len(_entries(dev, snap)) <= 1
    assert "_allocate_here" in _names(_block_at(snap, p)["frames"])
    cudamem.free(p, dev)


def test_off_records_nothing_and_gathers_no_frames(dev):
    cudamem.record_memory_history(device=dev)
    cudamem.free(cudamem.malloc(MiB, dev), dev)
    assert _entries(dev)
    cudamem.record_memory_history(None, device=dev)
    assert _cudamem._stack_mode(dev) == 0
    assert _entries(dev) == []  # stopping clears the ring
    p = _allocate_here(dev, MiB)
    snap = cudamem.snapshot(dev)
    assert _entries(dev, snap) == []
    assert _block_at(snap, p)["frames"] == []
    cudamem.free(p, dev)


def test_context_none_records_entries_without_frames(dev):
    cudamem.record_memory_history(context=None, device=dev)
    assert _cudamem._stack_mode(dev) == 0
    p = _allocate_here(dev, MiB)
    snap = cudamem.snapshot(dev)
    assert "frames" not in _one(_entries(dev, snap), "alloc", p)
    assert _block_at(snap, p)["frames"] == []
    cudamem.free(p, dev)


def test_context_state_gives_frames_to_blocks_only(dev):
    cudamem.record_memory_history(context="state", device=dev)
    assert _cudamem._stack_mode(dev) == 1
    p = _allocate_here(dev, MiB)
    snap = cudamem.snapshot(dev)
    assert "frames" not in _one(_entries(dev, snap), "alloc", p)
    assert "_allocate_here" in _names(_block_at(snap, p)["frames"])
    cudamem.free(p, dev)


def test_context_alloc_gives_frames_to_allocs_and_gathers_none_at_free(dev):
    cudamem.record_memory_history(context="alloc", device=dev)
    assert _cudamem._stack_mode(dev) == 1
    p = _allocate_here(dev, MiB)
    cudamem.free(p, dev)
    ev = _entries(dev)
    assert "_allocate_here" in _names(_one(ev, "alloc", p)["frames"])
    # PyTorch gives a free without its own stack the stack of the allocation.
    assert "_allocate_here" in _names(_one(ev, "free_requested", p)["frames"])


def test_clear_history(dev):
    cudamem.record_memory_history(device=dev)
    cudamem.free(cudamem.malloc(MiB, dev), dev)
    cudamem.record_memory_history(device=dev, clear_history=True)
    assert [e["action"] for e in _entries(dev)] == ["snapshot"]


def test_device_none_covers_existing_and_later_devices(dev, new_dev):
    cudamem.free(cudamem.malloc(MiB, dev), dev)  # dev exists before
    cudamem.record_memory_history()
    later = new_dev()
    assert _cudamem._stack_mode(dev) == 2
    p, q = _allocate_here(dev, MiB), _allocate_here(later, MiB)
    assert _cudamem._stack_mode(later) == 2
    snap = cudamem.snapshot()  # every device, as torch.cuda.memory._snapshot()
    assert len(snap["device_traces"]) > later
    assert "_allocate_here" in _names(_one(snap["device_traces"][dev], "alloc", p)["frames"])
    assert "_allocate_here" in _names(_one(snap["device_traces"][later], "alloc", q)["frames"])
    assert {s["device"] for s in snap["segments"]} >= {dev, later}
    cudamem.record_memory_history(None)
    assert _cudamem._stack_mode(dev) == 0 and _cudamem._stack_mode(later) == 0
    cudamem.free(p, dev)
    cudamem.free(q, later)
    assert _entries(dev) == [] and _entries(later) == []


def test_one_device_leaves_the_others_alone(dev, new_dev):
    other = new_dev()
    cudamem.free(cudamem.malloc(MiB, other), other)
    cudamem.record_memory_history(device=dev)
    assert _cudamem._stack_mode(other) == 0
    cudamem.free(cudamem.malloc(MiB, other), other)
    assert _entries(other) == []


@pytest.mark.parametrize(
    "kwargs",
    [{"enabled": "yes"}, {"context": "everything"}, {"stacks": "cpp"}, {"max_entries": -1}, {"device": "cpu"}],
)  # fmt: skip
def test_bad_arguments_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        cudamem.record_memory_history(**kwargs)


@pytest.mark.parametrize("kwargs", [{"enabled": 3}, {"context": 3}, {"max_entries": 1.5}, {"device": 1.5}])
def test_arguments_of_another_type_raise_type_error(kwargs):
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        cudamem.record_memory_history(**kwargs)


def test_bool_enabled_and_stacks_all_are_accepted(dev):
    cudamem.record_memory_history(True, stacks="all", device=dev)
    assert _cudamem._stack_mode(dev) == 2
    cudamem.record_memory_history(False, device=dev)
    assert _cudamem._stack_mode(dev) == 0


def test_python_frames_helper_is_innermost_first():
    names = [n for n, _, _ in _cudamem._python_frames()]
    assert names[0] == "test_python_frames_helper_is_innermost_first"
    assert len(names) <= _cudamem.MAX_FRAMES


def test_frames_survive_a_pending_exception(dev):
    # An allocation while an exception propagates (an object freed during unwinding) must not
    # lose or replace that exception.
    cudamem.record_memory_history(device=dev)

    class Frees:
        def __del__(self):
            cudamem.free(cudamem.malloc(MiB, dev), dev)

    with pytest.raises(KeyError, match="kept"):
        x = Frees()  # noqa: F841
        raise KeyError("kept")
