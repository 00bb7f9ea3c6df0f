"""Snapshots in PyTorch's schema (dump, the Rust reader and writer, the native class's history)
and the reports on them (simulated GPU; no torch needed). The history entries themselves are
test_history.py's.

What PyTorch's tools need from a snapshot (torch.cuda._memory_viz: `stats` asserts that the
blocks of a segment add up to its total_size, `trace` reads each entry's action, addr/size or
device_free) is checked here on the dict; scripts/gpu/torch/history_check.py runs the real
tools on the GPU machine.
"""

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cudamem
from cudamem import _cudamem
from history_common import (  # noqa: F401 (history_off: an autouse fixture)
    BLOCK_KEYS, MiB, SEGMENT_KEYS, SETTINGS_KEYS, STATES, _block_at, _names, _one, history_off,
)


def _allocate_here(dev, size):
    return cudamem.malloc(size, dev)  # the line the alloc entry's frame must name

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
