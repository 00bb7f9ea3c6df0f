"""Per-device allocators in one process (the scale-out issue), on simulated GPUs: each device
ordinal has its own allocator, stats and memory; nothing moves between devices; a pointer of one
device is unknown to another."""

import os

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


def test_a_device_that_cannot_be_opened_points_at_the_simulated_one():
    """Without a usable GPU, the error says how to use the simulated one instead."""
    import shutil
    import subprocess
    import sys

    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this machine may have a GPU: the real device would open")
    code = "import cudamem\ntry:\n    cudamem.malloc(1)\nexcept RuntimeError as e:\n    print('RuntimeError:', e)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDAMEM_DEVICE": "cuda"})
    assert "RuntimeError: cudamem: cannot open the device" in r.stdout, r.stdout + r.stderr
    assert "CUDAMEM_DEVICE=sim" in r.stdout, r.stdout
