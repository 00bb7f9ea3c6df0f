"""Tests of the C ABI that PyTorch's CUDAPluggableAllocator calls (loaded with ctypes, as
PyTorch does) and of the C++ shim's logic (compiled against a stand-in for
c10/util/Exception.h when a C++ compiler is present), on the simulated GPU (see conftest.py).
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

import cudamem
import cudamem.torch as cudamem_torch
from cudamem import _cudamem

MiB = 1 << 20
GiB = 1 << 30
HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------------------
# The C ABI (what PyTorch's CUDAPluggableAllocator calls)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lib():
    so = ctypes.CDLL(cudamem.library_path())
    so.cudamem_malloc.restype = ctypes.c_void_p
    so.cudamem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    so.cudamem_free.restype = None
    so.cudamem_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    so.cudamem_malloc_or_error.restype = ctypes.c_void_p
    so.cudamem_malloc_or_error.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    so.cudamem_empty_cache.restype = None
    so.cudamem_empty_cache.argtypes = []
    so.cudamem_set_memory_fraction.restype = None
    so.cudamem_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
    so.cudamem_record_stream.restype = None
    so.cudamem_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    so.cudamem_last_error_kind.restype = ctypes.c_int
    so.cudamem_last_error.restype = ctypes.c_int
    so.cudamem_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    so.cudamem_unknown_frees.restype = ctypes.c_uint64
    so.cudamem_memory_allocated.restype = ctypes.c_uint64
    so.cudamem_memory_allocated.argtypes = [ctypes.c_int]
    so.cudamem_memory_reserved.restype = ctypes.c_uint64
    so.cudamem_memory_reserved.argtypes = [ctypes.c_int]
    return so


def test_c_functions_are_exported(lib):
    for name in ("cudamem_malloc", "cudamem_free", "cudamem_empty_cache", "cudamem_set_memory_fraction",
                 "cudamem_record_stream", "cudamem_malloc_or_error", "cudamem_last_error",
                 "cudamem_last_error_kind", "cudamem_set_error_mode", "cudamem_set_error_thrower"):
        assert ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def test_c_malloc_and_free_move_the_stats(lib, dev):
    p = lib.cudamem_malloc(5 * MiB, dev, None)
    assert p
    assert cudamem.memory_allocated(dev) == 5 * MiB
    assert lib.cudamem_memory_allocated(dev) == 5 * MiB
    q = lib.cudamem_malloc(100, dev, ctypes.c_void_p(0x77))
    assert cudamem.memory_stats(dev)["allocation.all.current"] == 2
    lib.cudamem_record_stream(q, ctypes.c_void_p(0x99))
    lib.cudamem_free(p, 5 * MiB, dev, None)
    lib.cudamem_free(q, 100, dev, ctypes.c_void_p(0x77))
    assert cudamem.memory_allocated(dev) == 0
    assert lib.cudamem_memory_reserved(dev) > 0
    lib.cudamem_empty_cache()  # torch.cuda.empty_cache()
    assert cudamem.memory_reserved(dev) == 0
    assert lib.cudamem_malloc(0, dev, None) is None  # size 0: NULL, as PyTorch's allocator


def test_c_free_of_unknown_pointer_does_not_crash(lib, dev, capfd):
    before = lib.cudamem_unknown_frees()
    lib.cudamem_free(ctypes.c_void_p(0xDEADBEEF000), 64, dev, None)
    lib.cudamem_free(ctypes.c_void_p(0xDEADBEEF000), 64, dev, None)
    lib.cudamem_free(ctypes.c_void_p(0x1000), 64, cudamem._cudamem.MAX_DEVICES + 5, None)  # bad device
    lib.cudamem_free(None, 0, dev, None)  # NULL: ignored silently
    assert lib.cudamem_unknown_frees() == before + 3
    err = capfd.readouterr().err
    if before == 0:
        assert err.count("ignoring cudamem_free of a pointer it did not allocate") == 1
    assert cudamem.info()["unknown_frees"] == before + 3
    # The allocator is fine afterwards.
    p = lib.cudamem_malloc(MiB, dev, None)
    lib.cudamem_free(p, MiB, dev, None)
    assert cudamem.memory_allocated(dev) == 0


def test_c_malloc_or_error_reports_out_of_memory(lib, dev):
    buf = ctypes.create_string_buffer(4096)
    p = lib.cudamem_malloc_or_error(10**13, dev, None, buf, len(buf))
    assert p is None
    assert buf.value.decode().startswith("CUDA out of memory. Tried to allocate")
    assert lib.cudamem_last_error_kind() == _cudamem.ERR_OOM
    small = ctypes.create_string_buffer(16)
    assert lib.cudamem_malloc_or_error(10**13, dev, None, small, len(small)) is None
    assert small.value == b"CUDA out of mem"  # cut to fit, NUL-terminated
    buf2 = ctypes.create_string_buffer(256)
    assert lib.cudamem_last_error(buf2, len(buf2)) == _cudamem.ERR_OOM
    assert buf2.value.startswith(b"CUDA out of memory")
    assert lib.cudamem_malloc_or_error(16, -3, None, buf, len(buf)) is None
    assert lib.cudamem_last_error_kind() == _cudamem.ERR_INVALID
    assert b"device" in buf.value
    p = lib.cudamem_malloc_or_error(MiB, dev, None, buf, len(buf))
    assert p and buf.value == b""
    lib.cudamem_free(p, MiB, dev, None)
    assert cudamem.memory_stats(dev)["num_ooms"] == 2


def test_c_malloc_out_of_memory_is_not_silent(lib, dev, capfd):
    assert cudamem.info()["error_mode"] == _cudamem.MODE_RETURN_NULL
    assert lib.cudamem_malloc(10**13, dev, None) is None
    assert "CUDA out of memory. Tried to allocate" in capfd.readouterr().err
    assert lib.cudamem_last_error_kind() == _cudamem.ERR_OOM


def test_c_malloc_abort_mode_in_a_subprocess(run_python):
    code = (
        "import ctypes, cudamem\n"
        "from cudamem import _cudamem\n"
        "lib = ctypes.CDLL(cudamem.library_path())\n"
        "lib.cudamem_malloc.restype = ctypes.c_void_p\n"
        "lib.cudamem_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]\n"
        "_cudamem.set_error_mode(_cudamem.MODE_ABORT)\n"
        "lib.cudamem_malloc(10**13, 0, None)\n"
        "print('returned')\n"
    )
    r = run_python(code)
    assert r.returncode != 0 and "returned" not in r.stdout
    assert "CUDA out of memory" in r.stderr and "aborting" in r.stderr


def test_c_set_memory_fraction(lib, dev):
    lib.cudamem_set_memory_fraction(0.1, dev)
    with pytest.raises(cudamem.OutOfMemoryError, match="allowed;"):
        cudamem.malloc(20 * GiB, device=dev)
    lib.cudamem_set_memory_fraction(1.0, dev)
    cudamem.free(cudamem.malloc(20 * GiB, device=dev), device=dev)


def test_set_error_mode_validates():
    with pytest.raises(ValueError):
        _cudamem.set_error_mode(7)
    assert _cudamem.set_error_mode(_cudamem.MODE_RETURN_NULL) == _cudamem.MODE_RETURN_NULL


# ------------------------------------------------------------------------------------------
# The C++ shim (against a stand-in for c10/util/Exception.h: torch is not needed)
# ------------------------------------------------------------------------------------------


def _compile(tmp, src, name, extra=()):
    out = tmp / name
    cmd = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", f"-I{HERE / 'fake_c10'}", str(src), "-o", str(out), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return str(out)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_shim_throws_out_of_memory(tmp_path, dev, lib):
    src = cudamem_torch.shim_source()
    assert src.exists() and "cudamem_torch_malloc" in src.read_text()
    shim = ctypes.CDLL(_compile(tmp_path, src, "shim.so"))
    harness = ctypes.CDLL(_compile(tmp_path, HERE / "shim_harness.cpp", "harness.so"))
    harness.harness_malloc.restype = ctypes.c_int
    harness.harness_malloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_size_t]
    torch_malloc = ctypes.cast(shim.cudamem_torch_malloc, ctypes.c_void_p)
    out, msg = ctypes.c_void_p(), ctypes.create_string_buffer(8192)

    # Before init: a c10::Error, not a crash.
    assert harness.harness_malloc(torch_malloc, 16, dev, ctypes.byref(out), msg, len(msg)) == 2
    assert b"not initialised" in msg.value

    shim.cudamem_torch_shim_init.restype = ctypes.c_int
    shim.cudamem_torch_shim_init.argtypes = [ctypes.c_void_p] * 3
    addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
    version = shim.cudamem_torch_shim_init(addr(lib.cudamem_malloc_or_error), addr(lib.cudamem_free),
                                           addr(lib.cudamem_last_error_kind))
    assert version == cudamem_torch.SHIM_ABI_VERSION

    assert harness.harness_malloc(torch_malloc, 3 * MiB, dev, ctypes.byref(out), msg, len(msg)) == 0
    assert out.value and cudamem.memory_allocated(dev) == 3 * MiB
    shim.cudamem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    shim.cudamem_torch_free(out, 3 * MiB, dev, None)
    assert cudamem.memory_allocated(dev) == 0

    # Out of memory: c10::OutOfMemoryError with cudamem's message.
    assert harness.harness_malloc(torch_malloc, 10**13, dev, ctypes.byref(out), msg, len(msg)) == 1
    assert msg.value.decode().startswith("CUDA out of memory. Tried to allocate")
    # Another failure (a bad device): c10::Error.
    assert harness.harness_malloc(torch_malloc, 16, -1, ctypes.byref(out), msg, len(msg)) == 2
    assert b"device" in msg.value
    # Size 0: NULL, no exception.
    assert harness.harness_malloc(torch_malloc, 0, dev, ctypes.byref(out), msg, len(msg)) == 0
    assert out.value is None


# ------------------------------------------------------------------------------------------
# The native class's function table (through the generated header, as the class calls it)
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    shim_dir = Path(cudamem_torch.shim_source()).parent
    h = ctypes.CDLL(_compile(tmp_path_factory.mktemp("table"), HERE / "table_harness.cpp", "table.so",
                             [f"-I{shim_dir}"]))
    u64x4 = ctypes.c_uint64 * 4
    h.table_matches.argtypes = [ctypes.c_void_p]
    h.table_malloc.restype = ctypes.c_void_p
    h.table_malloc.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_int, u64x4]
    h.table_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, u64x4]
    rust = ctypes.CDLL(cudamem.library_path())
    rust.cudamem_native_api.restype = ctypes.c_void_p
    rust.cudamem_last_error.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    api = rust.cudamem_native_api()
    assert h.table_matches(api) == 0, "the table is not the one cudamem_abi.h declares"

    def last_error():
        buf = ctypes.create_string_buffer(4096)
        kind = rust.cudamem_last_error(buf, len(buf))
        return kind, buf.value.decode()

    return h, api, u64x4, last_error


def test_the_tables_malloc_and_free_report_what_the_profiler_asks_for(dev, table):
    h, api, u64x4, _ = table
    info = u64x4()
    p = h.table_malloc(api, dev, 3 * MiB + 1, 1, info)
    assert p
    block = info[0]
    assert 3 * MiB + 1 <= block < 4 * MiB
    assert (info[1], info[2]) == (cudamem.memory_allocated(dev), cudamem.memory_reserved(dev))
    assert info[1] == block
    # Without profiling nothing more is read.
    info = u64x4()
    q = h.table_malloc(api, dev, MiB, 0, info)
    assert q and list(info)[:3] == [0, 0, 0]
    assert cudamem.memory_allocated(dev) == block + MiB

    info = u64x4()
    assert h.table_free(api, p, 1, info) == 0
    assert info[0] == block and info[3] == dev
    assert (info[1], info[2]) == (cudamem.memory_allocated(dev), cudamem.memory_reserved(dev)) == (MiB, info[2])
    info = u64x4()
    assert h.table_free(api, q, 0, info) == 0
    assert list(info) == [0, 0, 0, dev]
    assert cudamem.memory_allocated(dev) == 0


def test_the_tables_failures_leave_their_kind_and_message(dev, table):
    h, api, u64x4, last_error = table
    info = u64x4()
    assert h.table_malloc(api, dev, 10**13, 0, info) is None
    kind, msg = last_error()
    assert kind == h.table_err_oom() and msg.startswith("CUDA out of memory. Tried to allocate")
    assert h.table_malloc(api, -1, 16, 0, info) is None
    kind, msg = last_error()
    assert kind == h.table_err_invalid() and "invalid device -1" in msg
    cudamem.free(cudamem.malloc(MiB, device=dev), device=dev)  # an allocator exists
    assert h.table_free(api, 0xDEAD000, 0, info) == h.table_err_invalid()
    kind, msg = last_error()
    assert kind == h.table_err_invalid() and "invalid device pointer: 0xdead000" in msg
