"""Memory history with Python stacks, snapshots in PyTorch's schema, and the reports (simulated
GPU; no torch needed).

What PyTorch's tools need from a snapshot (torch.cuda._memory_viz: `stats` asserts that the
blocks of a segment add up to its total_size, `trace` reads each entry's action, addr/size or
device_free) is checked here on the dict; scripts/gpu/torch/history_check.py runs the real
tools on the GPU machine.
"""

import ctypes
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import cudamem
from cudamem import _cudamem

MiB = 1 << 20
THIS_FILE = os.path.basename(__file__)

SEGMENT_KEYS = {
    "device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
    "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks",
}  # fmt: skip
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
SETTINGS_KEYS = {
    "PYTORCH_CUDA_ALLOC_CONF", "max_split_size", "garbage_collection_threshold", "expandable_segments",
    "pinned_num_register_threads", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "roundup_power2_divisions",
}  # fmt: skip
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
    "segment_unmap", "oom", "snapshot", "annotate",
}  # fmt: skip


@pytest.fixture(autouse=True)
def history_off():
    """Every test leaves history off on every device (the setting of device=None is global)."""
    yield
    cudamem.record_memory_history(None)


def _entries(dev, snap=None):
    snap = cudamem.snapshot(dev) if snap is None else snap
    return snap["device_traces"][dev]


def _names(frames):
    return [f["name"] for f in frames]


def _allocate_here(dev, size):
    return cudamem.malloc(size, dev)  # the line the alloc entry's frame must name


def _one(entries, action, addr):
    found = [e for e in entries if e["action"] == action and e.get("addr") == addr]
    assert len(found) == 1, (action, addr, entries)
    return found[0]


def _block_at(snap, addr):
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["address"] == addr:
                return b
    raise AssertionError(f"no block at {addr:#x}")


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


# ------------------------------------------------------------------------------------------
# Snapshots: schema, dump, the Rust reader
# ------------------------------------------------------------------------------------------


def test_snapshot_has_pytorchs_schema(dev):
    cudamem.record_memory_history(device=dev)
    ptrs = [cudamem.malloc(s, dev) for s in (100, 700 * 1024, 3 * MiB, 25 * MiB)]
    cudamem.free(ptrs[1], dev)
    cudamem.free(ptrs[3], dev)
    snap = cudamem.snapshot(dev)
    assert set(snap) == {"segments", "device_traces", "allocator_settings", "external_annotations"}
    assert len(snap["device_traces"]) == dev + 1 and all(t == [] for t in snap["device_traces"][:dev])
    assert SETTINGS_KEYS <= set(snap["allocator_settings"])
    states = set()
    for seg in snap["segments"]:
        assert set(seg) == SEGMENT_KEYS
        assert seg["device"] == dev and seg["segment_type"] in ("large", "small")
        assert isinstance(seg["segment_pool_id"], tuple) and len(seg["segment_pool_id"]) == 2
        # What torch.cuda._memory_viz's `stats` relies on.
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        addr = seg["address"]
        for b in seg["blocks"]:
            assert set(b) == BLOCK_KEYS and b["state"] in STATES
            assert b["address"] == addr and b["requested_size"] <= b["size"]
            addr += b["size"]
            states.add(b["state"])
    assert {"active_allocated", "inactive"} <= states
    live = {b["address"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    assert live == {ptrs[0], ptrs[2]}
    for p in (ptrs[0], ptrs[2]):
        cudamem.free(p, dev)


def test_snapshot_of_a_device_without_an_allocator(new_dev):
    d = new_dev()
    snap = cudamem.snapshot(d)
    assert snap["segments"] == [] and len(snap["device_traces"]) == d + 1
    assert snap["allocator_settings"]["max_split_size"] == -1
    assert d not in cudamem.info()["allocators"]  # a snapshot opens no device


def test_dump_snapshot_writes_a_pickle_with_the_same_content(dev, tmp_path):
    cudamem.record_memory_history(device=dev)
    p = _allocate_here(dev, 3 * MiB)
    path = tmp_path / "snap.pickle"
    cudamem.dump_snapshot(str(path), device=dev)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    now = cudamem.snapshot(dev)
    assert set(loaded) == set(now)
    assert loaded["segments"] == now["segments"]
    assert loaded["device_traces"][dev] == now["device_traces"][dev][:-1]  # now has one more "snapshot"
    # Identical stacks are one object, so the pickle stores each once.
    ev = loaded["device_traces"][dev]
    alloc = _one(ev, "alloc", p)
    assert alloc["frames"] is _block_at(loaded, p)["frames"]
    cudamem.free(p, dev)


def test_the_rust_reader_and_writer_round_trip_the_snapshot(dev):
    cudamem.record_memory_history(device=dev)
    ptrs = [_allocate_here(dev, s) for s in (512, 3 * MiB, 30 * MiB)]
    cudamem.free(ptrs[0], dev)
    with pytest.raises(cudamem.OutOfMemoryError):
        cudamem.malloc(1 << 50, dev)
    with cudamem.annotate_region("step", device=dev):
        cudamem.free(ptrs[1], dev)
    snap = cudamem.snapshot(dev)
    # Python's pickle (memoized, shared frames) -> cudamem_trace's reader -> its writer.
    back = pickle.loads(_cudamem._trace_roundtrip(pickle.dumps(snap)))
    assert back == snap
    # The Rust writer's own pickle has the same schema.
    written = pickle.loads(_cudamem._snapshot_pickle(dev))
    assert set(written) == set(snap) and written["segments"] == snap["segments"]
    cudamem.free(ptrs[2], dev)


def _allocate_there(dev, size):
    return cudamem.malloc(size, dev)  # another stack, with the same caller frames


def test_the_snapshot_dict_is_the_pickle_writers_schema_with_shared_frames(dev):
    cudamem.record_memory_history(device=dev)
    p = _allocate_here(dev, MiB)
    q = _allocate_there(dev, MiB)
    cudamem.free(p, dev)
    cudamem.annotate("mark", device=dev)
    snap = cudamem.snapshot(dev)
    written = pickle.loads(_cudamem._snapshot_pickle(dev))  # the one writer's bytes
    assert list(written) == list(snap)
    for key in ("segments", "allocator_settings", "external_annotations"):
        assert written[key] == snap[key], key
    traces = snap["device_traces"][dev]
    # The pickle was taken later: one more "snapshot" entry, the rest equal, in the same order.
    assert written["device_traces"][dev][: len(traces)] == traces
    assert [list(e) for e in written["device_traces"][dev][: len(traces)]] == [list(e) for e in traces]
    # One list per stack, one dict per distinct frame, across stacks.
    alloc_p, alloc_q = _one(traces, "alloc", p), _one(traces, "alloc", q)
    assert _one(traces, "free_requested", p)["frames"] is not alloc_p["frames"]
    assert alloc_q["frames"] is _block_at(snap, q)["frames"]
    assert _names(alloc_p["frames"])[1:2] == ["_allocate_here"] and _names(alloc_q["frames"])[1:2] == ["_allocate_there"]
    # cudamem.malloc's own frame (innermost) is the same in both stacks: one dict.
    assert alloc_p["frames"][0] == alloc_q["frames"][0] and alloc_p["frames"][0] is alloc_q["frames"][0]
    assert alloc_p["frames"][-1] is alloc_q["frames"][-1], "the outermost frame is one dict"
    cudamem.free(q, dev)


def test_with_the_native_class_the_snapshot_is_torchs_history_while_only_torch_records(dev, monkeypatch):
    """The native class keeps torch's history, the one record of torch's _record_memory_history;
    cudamem.snapshot() reads it through torch then (stand-ins for torch and the install here:
    the class itself needs a GPU, scripts/gpu/torch/native_check.py)."""
    import types

    import cudamem.torch as glue

    torchs = {
        "segments": [{"device": 0, "address": 1}, {"device": dev, "address": 2}],
        "device_traces": [[{"action": "alloc", "addr": 1}], [], [{"action": "alloc", "addr": 2}]],
        "allocator_settings": {},
        "external_annotations": [{"device": 0, "name": "a"}, {"device": dev, "name": "b"}],
    }
    recording = {"on": True}
    fake = types.SimpleNamespace(
        _C=types.SimpleNamespace(_cuda_isHistoryEnabled=lambda: recording["on"]),
        cuda=types.SimpleNamespace(memory=types.SimpleNamespace(_snapshot=lambda: pickle.loads(pickle.dumps(torchs)))),
    )
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(glue, "install_mode", lambda: "native")

    class Annotate:  # the class's cudamem_native_annotate, as ctypes calls it
        calls = []

        def __call__(self, *args):
            self.calls.append(args)
            return 1

    monkeypatch.setitem(glue._state, "native", types.SimpleNamespace(cudamem_native_annotate=Annotate()))
    assert cudamem.snapshot() == torchs
    cudamem.annotate("step", "START", device=dev)
    with cudamem.annotate_region("region"):
        pass
    assert Annotate.calls == [(b"step", b"START", dev), (b"region", b"START", -1), (b"region", b"END", -1)]
    mine = cudamem.snapshot(dev)
    assert mine["segments"] == [{"device": dev, "address": 2}]
    assert [len(t) for t in mine["device_traces"]] == [int(i == dev == 2) for i in range(3)]
    assert mine["external_annotations"] == [{"device": dev, "name": "b"}]
    # Torch not recording: cudamem's own (empty) history.
    recording["on"] = False
    assert "segments" in cudamem.snapshot(dev) and cudamem.snapshot(dev) != torchs
    # cudamem's own recording on: its own snapshot, whatever torch records.
    recording["on"] = True
    cudamem.record_memory_history(device=dev)
    p = cudamem.malloc(MiB, dev)
    cudamem.annotate("mine", device=dev)
    own = cudamem.snapshot(dev)
    assert own["device_traces"][dev] and own != torchs
    assert [a["name"] for a in own["external_annotations"]] == ["mine"] and len(Annotate.calls) == 3
    cudamem.free(p, dev)
    # Not the native class: cudamem's own.
    cudamem.record_memory_history(None)
    monkeypatch.setattr(glue, "install_mode", lambda: "shim")
    assert cudamem.snapshot() != torchs


def test_annotations(dev):
    cudamem.record_memory_history(device=dev)
    with cudamem.annotate_region("forward", device=dev):
        p = cudamem.malloc(MiB, dev)
    cudamem.annotate("optimizer", device=dev)
    snap = cudamem.snapshot(dev)
    ann = [(a["stage"], a["name"], a["device"]) for a in snap["external_annotations"]]
    assert ann == [("START", "forward", dev), ("END", "forward", dev), ("START", "optimizer", dev)]
    assert all(isinstance(a["time_us"], int) for a in snap["external_annotations"])
    cudamem.free(p, dev)
    with pytest.raises(TypeError, match="name must be a str, got int"):
        cudamem.annotate(3)


def test_interpreter_exit_while_threads_allocate_does_not_hang(tmp_path):
    script = tmp_path / "exit_while_allocating.py"
    script.write_text(textwrap.dedent(f"""
        import ctypes, threading, time
        import cudamem
        lib = ctypes.CDLL(cudamem.library_path())
        lib.cudamem_malloc.restype = ctypes.c_void_p
        lib.cudamem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.cudamem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        cudamem.record_memory_history()

        def spin():
            while True:  # the GIL is released in each call (ctypes.CDLL), as in torch
                p = lib.cudamem_malloc(4096, 0, None)
                lib.cudamem_free(p, 4096, 0, None)

        for _ in range(3):
            threading.Thread(target=spin, daemon=True).start()
        time.sleep(0.3)
        print("exiting", cudamem.memory_allocated(0) >= 0)
    """))
    env = dict(os.environ, CUDAMEM_DEVICE="sim")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and "exiting True" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------------------------------------
# Reports (crate cudamem-report)
# ------------------------------------------------------------------------------------------


def _leaky_helper(dev):
    return [cudamem.malloc(4 * MiB, dev) for _ in range(3)]


def test_report_leaks_names_the_allocating_function(dev, tmp_path):
    cudamem.record_memory_history(device=dev)
    leaked = _leaky_helper(dev)
    cudamem.free(cudamem.malloc(MiB, dev), dev)
    snap = cudamem.snapshot(dev)
    text = cudamem.report_leaks(snap)
    assert "_leaky_helper" in text and "3 live allocations" in text, text
    data = cudamem.report_leaks(snap, json=True)
    assert data["count"] == 3 and data["bytes"] == 12 * MiB
    path = tmp_path / "leaks.pickle"
    cudamem.dump_snapshot(path, device=dev)
    assert "_leaky_helper" in cudamem.report_leaks(str(path))
    assert "_leaky_helper" in cudamem.report_leaks(path.read_bytes())
    for p in leaked:
        cudamem.free(p, dev)


def test_report_why_and_summary(dev):
    cudamem.record_memory_history(device=dev)
    ptrs = [cudamem.malloc(s, dev) for s in (3 * MiB, 7 * MiB, 300)]
    cudamem.free(ptrs[0], dev)
    snap = cudamem.snapshot(dev)
    assert isinstance(cudamem.report_why(snap), str) and cudamem.report_why(snap)
    why = cudamem.report_why(snap, json=True)
    assert why["reserved"] == sum(s["total_size"] for s in snap["segments"])
    summary = cudamem.report_summary(snap)
    assert "PyTorch CUDA memory summary" in summary
    for p in ptrs[1:]:
        cudamem.free(p, dev)


def test_viz_writes_a_self_contained_html_page(dev, tmp_path):
    cudamem.record_memory_history(device=dev)
    p = _leaky_helper(dev)
    out = cudamem.viz(cudamem.snapshot(dev), tmp_path / "viz.html", title="history test")
    html = Path(out).read_text(encoding="utf-8")
    assert html.lstrip().lower().startswith("<!doctype html") and "history test" in html
    assert "_leaky_helper" in html
    for q in p:
        cudamem.free(q, dev)


def test_reports_reject_what_is_not_a_trace():
    with pytest.raises(TypeError):
        cudamem.report_leaks(42)
    with pytest.raises(ValueError):
        cudamem.report_leaks(b"not a trace")
