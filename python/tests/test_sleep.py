"""cudamem.tag / sleep / wake_up / sleep_stats on the simulated GPU (CUDAMEM_DEVICE=sim)."""

import pytest

import cudamem

MIB = 1 << 20


def test_sleep_gives_memory_back_and_wake_restores_it_at_the_same_address():
    free0, _ = cudamem.mem_get_info(0)
    with cudamem.tag("weights", device=0):
        p = cudamem.malloc(64 * MIB, device=0)
    assert cudamem.sleep_stats(0)["tags"]["weights"]["allocated_bytes"] >= 64 * MIB
    reserved = cudamem.memory_reserved(0)
    cudamem.sleep(["weights"], offload=True, device=0)
    s = cudamem.sleep_stats(0)
    assert s["tags"]["weights"]["asleep"]
    assert s["sleeping_bytes"] >= 64 * MIB and s["offloaded_bytes"] >= 64 * MIB
    assert cudamem.memory_reserved(0) <= reserved - 64 * MIB
    assert cudamem.mem_get_info(0)[0] >= free0 - 2 * MIB, "the device got the pages back"
    with pytest.raises(ValueError, match="weights"):
        with cudamem.tag("weights", device=0):
            cudamem.malloc(MIB, device=0)
    with pytest.raises(ValueError):
        cudamem.sleep(["weights"], device=0)  # asleep already
    cudamem.wake_up(["weights"], device=0)
    assert not cudamem.sleep_stats(0)["tags"]["weights"]["asleep"]
    assert cudamem.memory_reserved(0) >= reserved - 2 * MIB
    cudamem.free(p, device=0)


def test_tags_nest_and_untagged_memory_is_untouched():
    q = cudamem.malloc(8 * MIB, device=0)
    with cudamem.tag("a", device=0):
        a = cudamem.malloc(4 * MIB, device=0)
        with cudamem.tag("b", device=0):
            b = cudamem.malloc(4 * MIB, device=0)
        a2 = cudamem.malloc(MIB, device=0)
    tags = cudamem.sleep_stats(0)["tags"]
    assert tags["a"]["allocated_bytes"] >= 5 * MIB and tags["b"]["allocated_bytes"] >= 4 * MIB
    cudamem.sleep(["a"], offload=False, device=0)
    assert cudamem.sleep_stats(0)["tags"]["a"]["asleep"] and not cudamem.sleep_stats(0)["tags"]["b"]["asleep"]
    cudamem.wake_up(device=0)  # every sleeping tag
    for p in (a, a2, b, q):
        cudamem.free(p, device=0)


def test_bad_arguments_are_errors_that_name_the_problem():
    with pytest.raises(ValueError, match="tag"):
        with cudamem.tag("", device=0):
            pass
    with pytest.raises(TypeError):
        cudamem.sleep([1], device=0)
    with pytest.raises(ValueError, match="nope"):
        cudamem.wake_up(["nope"], device=0)


def test_snapshot_history_and_summary_show_the_tags():
    # Device 0, as the other tests here: the suite uses every fresh ordinal already.
    cudamem.record_memory_history(device=0)
    with cudamem.tag("views", device=0):
        p = cudamem.malloc(16 * MIB, device=0)
    cudamem.sleep(["views"], offload=True, device=0)
    snap = cudamem.snapshot(0)
    mine = [s for s in snap["segments"] if s.get("tag") == "views"]
    assert mine and all(s["asleep"] for s in mine)
    assert all("tag" not in s for s in snap["segments"] if s["segment_pool_id"] == (0, 0))
    assert sum(s["total_size"] for s in mine) == cudamem.sleep_stats(0)["tags"]["views"]["sleeping_bytes"]
    names = [(a["stage"], a["name"]) for a in snap["external_annotations"]]
    assert ("START", "cudamem.sleep:views") in names
    assert "| views (asleep)" in cudamem.memory_summary(0)
    cudamem.wake_up(["views"], device=0)
    snap = cudamem.snapshot(0)
    assert ("END", "cudamem.sleep:views") in [(a["stage"], a["name"]) for a in snap["external_annotations"]]
    assert any(e["action"] == "segment_map" for e in snap["device_traces"][0])
    assert "(asleep)" not in cudamem.memory_summary(0)
    cudamem.free(p, device=0)
    cudamem.record_memory_history(enabled=None, device=0)
