"""Tests of the Python package on the simulated GPU (CUDAMEM_DEVICE=sim; see conftest.py).

They cover the Python API: allocation, statistics, errors, settings, streams and threads. The
C ABI and the C++ shim are tested in test_c_abi.py.
"""

import collections
import math
import sys
import threading
import types
from pathlib import Path

import pytest

import cudamem
import cudamem.torch as cudamem_torch

MiB = 1 << 20
GiB = 1 << 30


# ------------------------------------------------------------------------------------------
# The package
# ------------------------------------------------------------------------------------------


def test_imports_on_the_simulated_device():
    assert cudamem.__version__
    info = cudamem.info()
    assert info["device_kind"] == "sim"
    assert info["policy"] in ("cudamem", "pytorch", "pytorch-expandable")
    assert issubclass(cudamem.OutOfMemoryError, RuntimeError)
    assert Path(cudamem.library_path()).exists()
    # The torch integration imports without torch; installing needs torch and a real GPU.
    assert cudamem_torch.is_installed() is False
    assert cudamem.torch is cudamem_torch


def test_malloc_free_move_allocated_and_reserved(dev):
    assert cudamem.memory_allocated(dev) == 0
    assert cudamem.memory_reserved(dev) == 0
    p = cudamem.malloc(3 * MiB, device=dev)
    assert p != 0
    assert cudamem.memory_allocated(dev) == 3 * MiB
    assert cudamem.memory_reserved(dev) >= 3 * MiB
    q = cudamem.malloc(1000, device=dev)
    assert q not in (0, p)
    assert cudamem.memory_allocated(dev) == 3 * MiB + 1024  # rounded to 512 bytes
    reserved = cudamem.memory_reserved(dev)
    cudamem.free(p, device=dev)
    cudamem.free(q, device=dev)
    assert cudamem.memory_allocated(dev) == 0
    assert cudamem.memory_reserved(dev) == reserved  # freed memory stays cached
    assert cudamem.max_memory_allocated(dev) == 3 * MiB + 1024
    assert cudamem.max_memory_reserved(dev) >= reserved
    # Cached memory is reused: the same request gets the same address without new segments.
    segments = cudamem.memory_stats(dev)["segment.all.allocated"]
    p2 = cudamem.malloc(3 * MiB, device=dev)
    assert cudamem.memory_stats(dev)["segment.all.allocated"] == segments
    cudamem.free(p2, device=dev)


def test_empty_cache_lowers_reserved(dev):
    ptrs = [cudamem.malloc(s, device=dev) for s in (512, 5 * MiB, 40 * MiB)]
    keep = cudamem.malloc(64 * MiB, device=dev)
    for p in ptrs:
        cudamem.free(p, device=dev)
    before = cudamem.memory_reserved(dev)
    cudamem.empty_cache(dev)
    after = cudamem.memory_reserved(dev)
    assert after < before
    assert after >= 64 * MiB  # what is in use stays
    cudamem.free(keep, device=dev)
    cudamem.empty_cache()  # no argument: every device, like torch.cuda.empty_cache()
    assert cudamem.memory_reserved(dev) == 0
    assert cudamem.memory_allocated(dev) == 0


def test_zero_size(dev):
    assert cudamem.malloc(0, device=dev) == 0
    cudamem.free(0, device=dev)  # freeing NULL is a no-op
    assert cudamem.memory_allocated(dev) == 0


def test_memory_stats_has_torchs_122_keys_sorted(dev):
    fresh = cudamem.memory_stats(dev)  # before any allocation: zeros, and no device opened
    assert len(fresh) == 122
    assert fresh["max_split_size"] == -1
    assert dev not in cudamem.info()["allocators"]
    p = cudamem.malloc(MiB, device=dev)
    stats = cudamem.memory_stats(dev)
    assert isinstance(stats, collections.OrderedDict)
    assert len(stats) == 122
    assert list(stats) == sorted(stats)
    assert all(isinstance(v, int) for v in stats.values())
    for key in ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak", "num_ooms",
                "num_alloc_retries", "oversize_segments.freed", "requested_bytes.small_pool.allocated"):
        assert key in stats
    assert stats["allocation.all.current"] == 1
    assert stats["allocated_bytes.all.current"] == cudamem.memory_allocated(dev)
    nested = cudamem.memory_stats_as_nested_dict(dev)
    assert nested["allocated_bytes"]["all"]["current"] == MiB
    cudamem.free(p, device=dev)


def test_memory_summary(dev):
    p = cudamem.malloc(7 * MiB, device=dev)
    text = cudamem.memory_summary(dev)
    assert "PyTorch CUDA memory summary" in text
    assert f"device ID {dev}" in text
    assert "from large pool" in text
    short = cudamem.memory_summary(device=dev, abbreviated=True)
    assert "PyTorch CUDA memory summary" in short
    assert "from large pool" not in short
    cudamem.free(p, device=dev)
    # Before first use too (all zeros).
    assert "PyTorch CUDA memory summary" in cudamem.memory_summary(cudamem._cudamem.MAX_DEVICES - 1)


def test_reset_peak_and_accumulated(dev):
    p = cudamem.malloc(10 * MiB, device=dev)
    cudamem.free(p, device=dev)
    assert cudamem.max_memory_allocated(dev) == 10 * MiB
    cudamem.reset_peak_memory_stats(dev)
    assert cudamem.max_memory_allocated(dev) == 0
    assert cudamem.memory_stats(dev)["allocation.all.allocated"] == 1
    cudamem.reset_accumulated_memory_stats(dev)
    assert cudamem.memory_stats(dev)["allocation.all.allocated"] == 0


def test_mem_get_info(dev):
    free, total = cudamem.mem_get_info(dev)
    assert total == 150_109_880_320  # the simulated H200
    p = cudamem.malloc(GiB, device=dev)
    free2, _ = cudamem.mem_get_info(dev)
    assert free2 <= free - GiB
    cudamem.free(p, device=dev)


def test_devices_are_separate(new_dev):
    a, b = new_dev(), new_dev()
    p = cudamem.malloc(8 * MiB, device=a)
    assert cudamem.memory_allocated(a) == 8 * MiB
    assert cudamem.memory_allocated(b) == 0
    with pytest.raises(ValueError, match="invalid device pointer"):
        cudamem.free(p, device=b)  # no cross-device frees
    cudamem.free(p, device=a)
    # torch-style device arguments
    q = cudamem.malloc(MiB, device=f"cuda:{b}")
    assert cudamem.memory_allocated(types.SimpleNamespace(type="cuda", index=b)) == MiB
    cudamem.free(q, device=b)


# ------------------------------------------------------------------------------------------
# Out of memory
# ------------------------------------------------------------------------------------------


def test_oversized_malloc_raises_out_of_memory_and_allocator_keeps_working(dev):
    keep = cudamem.malloc(MiB, device=dev)
    with pytest.raises(cudamem.OutOfMemoryError) as exc:
        cudamem.malloc(10**13, device=dev)
    msg = str(exc.value)
    assert "CUDA out of memory. Tried to allocate" in msg
    assert f"GPU {dev} has a total capacity of 139.80 GiB" in msg
    assert "[cudamem:" in msg  # cudamem's diagnosis follows PyTorch's message
    assert isinstance(exc.value, RuntimeError)
    assert cudamem.memory_stats(dev)["num_ooms"] == 1
    p = cudamem.malloc(16 * MiB, device=dev)
    assert cudamem.memory_allocated(dev) == 17 * MiB
    cudamem.free(p, device=dev)
    cudamem.free(keep, device=dev)
    with pytest.raises(cudamem.OutOfMemoryError, match="more than 1EB"):
        cudamem.malloc(2**62, device=dev)


def test_out_of_memory_is_also_torchs_when_torch_is_imported(dev, monkeypatch):
    # A stand-in for torch: its OutOfMemoryError must catch cudamem's too.
    fake = types.ModuleType("torch")

    class TorchOOM(RuntimeError):
        pass

    fake.OutOfMemoryError = TorchOOM
    fake.cuda = types.SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(TorchOOM) as exc:
        cudamem.malloc(10**13, device=dev)
    assert isinstance(exc.value, cudamem.OutOfMemoryError)
    assert "CUDA out of memory. Tried to allocate" in str(exc.value)


def test_memory_fraction(dev):
    cudamem.set_per_process_memory_fraction(0.25, device=dev)
    with pytest.raises(cudamem.OutOfMemoryError, match="allowed;"):
        cudamem.malloc(40 * GiB, device=dev)
    p = cudamem.malloc(30 * GiB, device=dev)
    cudamem.free(p, device=dev)
    cudamem.set_per_process_memory_fraction(1, device=dev)
    p = cudamem.malloc(40 * GiB, device=dev)
    cudamem.free(p, device=dev)
    cudamem.empty_cache(dev)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), float("inf")])
def test_bad_fraction_is_a_value_error(dev, bad):
    with pytest.raises(ValueError, match="fraction must be a float in"):
        cudamem.set_per_process_memory_fraction(bad, device=dev)


@pytest.mark.parametrize("bad", ["half", None, True, [0.5]])
def test_fraction_of_another_type_is_a_type_error(bad):
    with pytest.raises(TypeError, match=f"fraction must be a float, got {type(bad).__name__}"):
        cudamem.set_per_process_memory_fraction(bad, device=0)  # refused before any change


# ------------------------------------------------------------------------------------------
# Bad arguments and settings
# ------------------------------------------------------------------------------------------


def test_bad_arguments_are_value_errors_naming_them(dev):
    with pytest.raises(ValueError, match="size"):
        cudamem.malloc(-1, device=dev)
    with pytest.raises(TypeError, match="size must be an int, got float"):
        cudamem.malloc(1.5, device=dev)
    with pytest.raises(ValueError, match="stream"):
        cudamem.malloc(16, device=dev, stream=-3)
    with pytest.raises(ValueError, match="device"):
        cudamem.malloc(16, device=-1)
    with pytest.raises(ValueError, match="device"):
        cudamem.malloc(16, device=cudamem._cudamem.MAX_DEVICES)
    with pytest.raises(ValueError, match="device"):
        cudamem.memory_allocated("cpu")
    with pytest.raises(ValueError, match="ptr"):
        cudamem.free(-5, device=dev)
    p = cudamem.malloc(4096, device=dev)
    with pytest.raises(ValueError, match="invalid device pointer"):
        cudamem.free(p + 512, device=dev)  # interior pointer
    cudamem.free(p, device=dev)
    with pytest.raises(ValueError, match="invalid device pointer"):
        cudamem.free(p, device=dev)  # double free
    with pytest.raises(ValueError, match="invalid device pointer"):
        cudamem.record_stream(0xDEAD000, 7, device=dev)
    assert cudamem.memory_allocated(dev) == 0


def test_bad_config_is_a_value_error_with_the_parsers_text():
    with pytest.raises(ValueError) as exc:
        cudamem.configure(config="max_split_size_mb:banana")
    assert "max_split_size_mb" in str(exc.value)
    with pytest.raises(ValueError, match="no_such_option"):
        cudamem.configure(config="no_such_option:1")
    with pytest.raises(ValueError, match="unknown policy"):
        cudamem.configure(policy="fastest")
    with pytest.raises(ValueError, match="sharded:True is not available in the Python package"):
        cudamem.configure(config="sharded:True")
    cudamem.configure()  # nothing to change: fine at any time


def test_configure_after_first_use_is_a_runtime_error(dev):
    cudamem.free(cudamem.malloc(16, device=dev), device=dev)
    with pytest.raises(RuntimeError, match="before the first allocation"):
        cudamem.configure(policy="pytorch")


def test_bad_settings_from_the_environment(run_python):
    code = (
        "import cudamem\n"
        "try:\n    cudamem.malloc(16)\nexcept ValueError as e:\n    print('ValueError:', e)\n"
    )
    r = run_python(code, CUDAMEM_ALLOC_CONF="garbage_key:1")
    assert "ValueError:" in r.stdout and "garbage_key" in r.stdout, r.stdout + r.stderr
    r = run_python(code, CUDAMEM_POLICY="nope")
    assert "ValueError: CUDAMEM_POLICY" in r.stdout, r.stdout + r.stderr
    r = run_python(code, CUDAMEM_DEVICE="tpu")
    assert "ValueError: CUDAMEM_DEVICE" in r.stdout, r.stdout + r.stderr
    # The ordinal is torch's (the current device): naming one is refused, with the reason.
    r = run_python(code, CUDAMEM_DEVICE="cuda:1")
    assert "ValueError: CUDAMEM_DEVICE" in r.stdout and "ordinal" in r.stdout, r.stdout + r.stderr


def test_auto_device_takes_what_the_machine_has(run_python):
    # The Rust API's `auto`: a CUDA device when one is present, else the simulated H200.
    code = "import cudamem\np = cudamem.malloc(16)\ncudamem.free(p)\nprint('ok')\n"
    r = run_python(code, CUDAMEM_DEVICE="auto")
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr


def test_simulated_capacity_takes_every_size_the_cli_takes(run_python):
    # One size parser for the CLI, the Rust API and CUDAMEM_DEVICE: binary and decimal units,
    # either case, up to EiB.
    code = "import cudamem\nprint(cudamem.mem_get_info()[1])\n"
    for size, total in [("8GiB", 8 << 30), ("8G", 8 << 30), ("80GB", 80 * 10**9), ("8gb", 8 * 10**9),
                        ("1.5TiB", 3 << 39), ("2PiB", 2 << 50), ("1eib", 1 << 60), ("1073741824", 1 << 30)]:
        r = run_python(code, CUDAMEM_DEVICE=f"sim:{size}")
        assert r.returncode == 0 and r.stdout.split() == [str(total)], (size, r.stdout + r.stderr)
    bad = "import cudamem\ntry:\n    cudamem.malloc(16)\nexcept ValueError as e:\n    print('ValueError:', e)\n"
    for size, says in [("0", "out of range"), ("8XB", "unknown size unit 'XB'"), ("-1", "negative"),
                       ("lots", "not a size")]:
        r = run_python(bad, CUDAMEM_DEVICE=f"sim:{size}")
        assert "ValueError: CUDAMEM_DEVICE" in r.stdout and says in r.stdout, (size, r.stdout + r.stderr)


def test_policy_and_config_in_a_fresh_process(run_python):
    code = (
        "import cudamem\n"
        "cudamem.configure(policy='pytorch', config='max_split_size_mb:64')\n"
        "p = cudamem.malloc(1 << 20)\n"
        "i = cudamem.info()['allocators'][0]\n"
        "print(i['policy'], i['config'], cudamem.memory_stats()['max_split_size'])\n"
        "cudamem.free(p)\n"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["pytorch", "max_split_size_mb:64", str(64 << 20)]
    r = run_python("import cudamem; p = cudamem.malloc(5); print(cudamem.info()['allocators'][0]['policy'])",
             CUDAMEM_POLICY="pytorch-expandable")
    assert r.stdout.strip() == "pytorch-expandable", r.stderr


# ------------------------------------------------------------------------------------------
# Streams and threads
# ------------------------------------------------------------------------------------------


def test_record_stream(dev):
    p = cudamem.malloc(2 * MiB, device=dev, stream=0)
    cudamem.record_stream(p, 0x1234, device=dev)
    cudamem.free(p, device=dev)
    assert cudamem.memory_allocated(dev) == 0
    # Still active until the event recorded on stream 0x1234 is seen complete (at the next
    # allocation or empty_cache; events complete at once on the simulated device).
    assert cudamem.memory_stats(dev)["active.all.current"] == 1
    q = cudamem.malloc(2 * MiB, device=dev)
    assert cudamem.memory_stats(dev)["active.all.current"] == 1
    assert q == p  # the block came back and was reused
    cudamem.free(q, device=dev)
    assert cudamem.memory_stats(dev)["active.all.current"] == 0


def test_threads(dev):
    errors = []

    def work(seed):
        try:
            for i in range(300):
                p = cudamem.malloc(((seed * 7919 + i * 104729) % (4 * MiB)) + 1, device=dev, stream=seed % 3)
                cudamem.free(p, device=dev)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cudamem.memory_allocated(dev) == 0
    assert cudamem.memory_stats(dev)["allocation.all.allocated"] == 1200


def test_install_needs_torch_or_says_why():
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            cudamem_torch.install()
        assert not cudamem_torch.is_installed()
    else:  # pragma: no cover - torch is not installed in CI
        with pytest.raises(RuntimeError, match="simulated"):
            cudamem_torch.install()


def test_nan_and_bool_are_not_sizes(dev):
    with pytest.raises(TypeError, match="size"):
        cudamem.malloc(True, device=dev)
    with pytest.raises(TypeError, match="size"):
        cudamem.malloc(math.nan, device=dev)
