"""Per-device allocators in one process (the scale-out issue), on simulated GPUs: each device
ordinal has its own allocator, stats and memory; nothing moves between devices; a pointer of one
device is unknown to another."""

import pytest

import cudamem

MiB = 1 << 20


def test_each_device_has_its_own_allocator_and_stats(new_dev):
    d0, d1 = new_dev(), new_dev()
    p0 = cudamem.malloc(30 * MiB, device=d0)
    assert cudamem.memory_allocated(d0) == 30 * MiB
    assert cudamem.memory_allocated(d1) == 0, "device 1 saw nothing"
    p1 = cudamem.malloc(4 * MiB, device=d1)
    assert cudamem.memory_allocated(d1) == 4 * MiB
    assert p0 != p1, "simulated devices have disjoint address ranges, as under unified addressing"
    # Device 1's empty_cache leaves device 0's cache alone.
    cudamem.free(p0, device=d0)
    reserved0 = cudamem.memory_reserved(d0)
    cudamem.empty_cache(device=d1)
    assert cudamem.memory_reserved(d0) == reserved0 > 0
    cudamem.free(p1, device=d1)
    cudamem.empty_cache(device=d0)
    cudamem.empty_cache(device=d1)
    assert cudamem.memory_reserved(d0) == cudamem.memory_reserved(d1) == 0


@pytest.fixture(scope="module")
def pair():
    """Two fresh device ordinals shared by the tests below (ordinals are a bounded resource)."""
    from conftest import _ordinals

    return next(_ordinals), next(_ordinals)


def test_a_pointer_of_one_device_cannot_be_freed_on_another(pair):
    d0, d1 = pair
    p0 = cudamem.malloc(MiB, device=d0)
    cudamem.malloc(MiB, device=d1)  # device 1 is in use too
    with pytest.raises(ValueError):
        cudamem.free(p0, device=d1)
    assert cudamem.memory_allocated(d0) == MiB, "device 0's allocation is intact"
    cudamem.free(p0, device=d0)


def test_no_cross_device_reuse(pair):
    d0, d1 = pair
    p = cudamem.malloc(8 * MiB, device=d0)
    cudamem.free(p, device=d0)  # cached on device 0
    q = cudamem.malloc(8 * MiB, device=d1)
    assert cudamem.memory_stats(d1)["num_device_alloc"] >= 1, "device 1 got its own memory"
    assert cudamem.memory_reserved(d0) > 0, "device 0 keeps its cache"
    cudamem.free(q, device=d1)
