"""What the history and snapshot tests share: PyTorch's snapshot schema, the fixture that turns
history off after each test, and helpers that read entries and blocks (not a test module)."""

import pytest

import cudamem

MiB = 1 << 20

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
