"""cudamem.torch.install() against a stand-in torch (tests/fake_torch; CI has no torch).

Checks what can be checked without PyTorch and a GPU: the shim is compiled (with the command
install() uses, against stand-in headers and libc10), cached and loaded; the hooks get the right
function addresses; torch.cuda's stats functions are replaced; a failure in the alloc function
reaches the caller as a C++ exception — from the shim, and in the no-compiler fallback from
c10::detail::torchCheckFail called by the Rust function (a C++ exception unwinding through
Rust) — never as NULL; install() after CUDA initialisation raises RuntimeError; a shim planted
in a cache directory others can write to is refused (UntrustedCacheError), not loaded; when the
native class cannot be built install() refuses (NativeBuildError naming the fix) instead of
falling back; on the pluggable path, asked for explicitly, CUDA graph capture, MemPool and
torch.compile's CUDA graphs raise, in Python and through the shim's C++ pool hook.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fake_torch"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")


def _gxx(*args):
    r = subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", f"-I{HERE / 'fake_c10'}", *map(str, args)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def fake_torch(tmp_path_factory):
    root = tmp_path_factory.mktemp("faketorch")
    shutil.copytree(FAKE / "torch", root / "torch")
    for script in ("check_install.py", "check_too_late.py", "check_guard.py"):
        shutil.copy(FAKE / script, root / script)
    (root / "torch" / "lib").mkdir()
    _gxx(FAKE / "libc10.cpp", "-o", root / "torch" / "lib" / "libc10.so")
    harness = root / "harness.so"
    _gxx(HERE / "shim_harness.cpp", "-o", harness)
    return root, harness


def _run(script, fake_torch, tmp_path, *args, **env):
    root, harness = fake_torch
    full = {k: v for k, v in os.environ.items() if k != "CUDAMEM_DEVICE"}  # install() wants a CUDA device
    # The stand-in torch has no c10/cuda headers: the pluggable path is what these tests check
    # (the native class is compiled by test_native_compile.py and run on a GPU).
    full.update(PYTHONPATH=str(root), FAKE_C10_INCLUDE=str(HERE / "fake_c10"),
                CUDAMEM_CACHE_DIR=str(tmp_path / "cache"), CUDAMEM_TORCH_NATIVE="0")
    full.update(env)
    full = {k: v for k, v in full.items() if v is not None}
    r = subprocess.run([sys.executable, str(root / script), *args, str(harness)], capture_output=True, text=True,
                       env=full, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr
    return r


def test_install_with_the_shim(fake_torch, tmp_path):
    r = _run("check_install.py", fake_torch, tmp_path, "shim")
    assert "mode shim warnings 0" in r.stdout
    built = list((tmp_path / "cache").glob("torch_shim-torch2.11.0+fake-*.so"))
    assert len(built) == 1
    # Cached: a second process does not compile again (no compiler needed).
    r = _run("check_install.py", fake_torch, tmp_path, "shim", CXX="/nonexistent/g++")
    assert list((tmp_path / "cache").glob("*.so")) == built


def test_install_without_a_compiler_falls_back(fake_torch, tmp_path):
    r = _run("check_install.py", fake_torch, tmp_path, "c", CXX="/nonexistent/g++")
    assert "mode c warnings 1" in r.stdout
    r = _run("check_install.py", fake_torch, tmp_path, "c", CUDAMEM_TORCH_SHIM="0")
    assert "mode c warnings 0" in r.stdout


def _install_raises(fake_torch, tmp_path, call, error, cache=None, after="", **env):
    """Runs ``ct.<call>`` in a fresh process with the stand-in torch (no CUDAMEM_DEVICE, none of
    CUDAMEM_TORCH_NATIVE unless given) and checks that it raised ``error`` (a name ``ct`` or the
    module's globals know) and installed nothing; returns the process's stdout."""
    root, _ = fake_torch
    name = error.split(".")[-1]
    code = (
        "import torch, cudamem.torch as ct\n"
        "from cudamem._torch_native import NativeBuildError\n"
        f"try:\n    ct.{call}\nexcept {error} as e:\n    print('{name}:', e)\n"
        "assert not ct.is_installed()\n" + after
    )
    full = {k: v for k, v in os.environ.items() if k not in ("CUDAMEM_DEVICE", "CUDAMEM_TORCH_NATIVE")}
    full.update(PYTHONPATH=str(root), FAKE_C10_INCLUDE=str(HERE / "fake_c10"),
                CUDAMEM_CACHE_DIR=str(cache or tmp_path / "cache"), **env)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=full,
                       cwd=str(tmp_path))
    assert r.returncode == 0 and f"{name}:" in r.stdout, r.stdout + r.stderr
    return r.stdout


def _install_refused(fake_torch, tmp_path, **env):
    """install() with the defaults, which must raise NativeBuildError; its message."""
    out = _install_raises(fake_torch, tmp_path, "install()", "NativeBuildError", CUDA_HOME=str(tmp_path / "no-cuda"),
                          after="torch.cuda.graphs.CUDAGraph().capture_begin()  # untouched: nothing was installed\n",
                          **env)
    assert "native=False" in out and "torch 2.9 to 2.15" in out, "it names the fix"
    return out


def test_install_refuses_rather_than_fall_back_when_the_native_class_cannot_be_built(fake_torch, tmp_path):
    out = _install_refused(fake_torch, tmp_path)
    assert "CUDA runtime headers were not found" in out, "it says what is missing"


def test_install_refuses_a_torch_older_than_supported_before_compiling(fake_torch, tmp_path):
    out = _install_refused(fake_torch, tmp_path, FAKE_TORCH_VERSION="2.8.0+cu128")
    assert "torch 2.8.0+cu128 is older than" in out
    assert not list((tmp_path / "cache").glob("*.so")), "nothing was compiled"


@pytest.mark.parametrize("mode", ["shim", "c"])
def test_the_pluggable_path_refuses_cuda_graphs_mempool_and_compiled_graphs(fake_torch, tmp_path, mode):
    env = {"CXX": "/nonexistent/g++"} if mode == "c" else {}
    r = _run("check_guard.py", fake_torch, tmp_path, mode, **env)
    assert r.stdout.count("refused:") == 8, r.stdout


def test_install_after_cuda_init_says_so(fake_torch, tmp_path):
    _run("check_too_late.py", fake_torch, tmp_path)


def test_install_rejects_bad_settings_at_once(fake_torch, tmp_path):
    for var, value, expect in [("CUDAMEM_ALLOC_CONF", "bogus_key:1", "bogus_key"),
                               ("PYTORCH_ALLOC_CONF", "other_bogus_key:1", "other_bogus_key"),
                               ("CUDAMEM_POLICY", "fastest", "CUDAMEM_POLICY"),
                               ("CUDAMEM_DEVICE", "tpu", "CUDAMEM_DEVICE")]:
        out = _install_raises(fake_torch, tmp_path, "install()", "ValueError", **{var: value})
        assert expect in out, out
    out = _install_raises(fake_torch, tmp_path, "install()", "RuntimeError", CUDAMEM_DEVICE="sim")
    assert "simulated" in out, out


def test_install_refuses_a_planted_shim_in_a_group_writable_cache(fake_torch, tmp_path):
    _run("check_install.py", fake_torch, tmp_path, "shim")  # builds and caches the shim
    cache = tmp_path / "cache"
    (shim,) = cache.glob("torch_shim-*.so")
    # What another member of the group could do: put their own library under the expected name
    # (with a matching digest), in a cache they can write to.
    shim.write_bytes(b"planted")
    (cache / (shim.name + ".sha256")).write_text(hashlib.sha256(b"planted").hexdigest() + "  " + shim.name + "\n")
    os.chmod(cache, 0o770)
    for extra in ({}, {"CUDAMEM_TORCH_NATIVE": "0"}):  # the default path, and the shim's alone
        out = _install_raises(fake_torch, tmp_path, "install()", "ct.UntrustedCacheError", cache=cache, **extra)
        assert str(cache) in out and "0770" in out and "chmod 700" in out, out
    assert shim.read_bytes() == b"planted"  # refused, neither loaded nor overwritten


def test_install_refuses_a_record_history_of_a_wrong_type_before_installing(fake_torch, tmp_path):
    out = _install_raises(fake_torch, tmp_path, "install(native=False, record_history=3)", "TypeError")
    assert "record_history must be a bool or a dict" in out, out
