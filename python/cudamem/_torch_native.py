"""cudamem as torch's native CUDA allocator (a c10 ``CUDAAllocator``), built for the installed torch.

:func:`install_native` compiles ``_shim/native_allocator.cpp`` (once per torch version and
source; then it comes from the trusted build cache of :mod:`cudamem._cache`), loads it, and
has it make cudamem torch's CUDA allocator through ``changeCurrentAllocator``. From then on
torch's own code — ``torch.cuda.memory_stats()``, ``memory_summary()``, CUDA graphs and their
private pools, ``torch.cuda.MemPool``, ``torch.compile(mode="reduce-overhead")``, cuDNN
autotuning's ``cacheInfo``, the profiler's memory view, OOM observers — talks to cudamem in
C++, with nothing patched.

What it needs: a C++ compiler (``$CXX``, else ``g++``), torch's headers (in every torch wheel),
and the CUDA runtime headers: ``$CUDA_HOME/include`` (or ``$CUDA_PATH``), else the
``nvidia-cuda-runtime`` and ``nvidia-cuda-crt`` wheels' ``include`` folders that CUDA builds of
torch install. Torch's allocator interface changes between releases; ``_shim/native_versions.h``
adapts the class to each release that :mod:`cudamem._torch_versions` supports. A torch older
than those is refused before compiling; a newer one is compiled against and, if its interface
changed, :func:`install_native` raises :class:`NativeBuildError` with the compiler's output.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any, List

from cudamem import _torch_build, _torch_versions

# Bumped whenever the C++ side's exported interface changes (checked at load time).
NATIVE_SHIM_VERSION = 2


class NativeBuildError(RuntimeError):
    """The native allocator class could not be compiled or loaded for the installed torch."""


def native_source() -> Path:
    """The C++ source of the native allocator class, shipped inside the package."""
    return Path(__file__).resolve().parent / "_shim" / "native_allocator.cpp"


def _site_dirs() -> List[Path]:
    dirs = [p for p in sys.path if p and os.path.isdir(p)]
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p and p not in dirs:
            dirs.append(p)
    return [Path(d) for d in dirs]


def cuda_include_dirs() -> List[str]:
    """Folders holding ``cuda_runtime_api.h`` and ``crt/host_config.h``, the CUDA headers that
    torch's c10/cuda headers include. Raises :class:`NativeBuildError` naming where it looked."""
    candidates: List[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    try:
        from torch.utils.cpp_extension import CUDA_HOME  # finds nvcc's toolkit

        if CUDA_HOME:
            candidates.append(Path(CUDA_HOME) / "include")
    except Exception:  # cpp_extension needs setuptools; the wheels below need nothing
        pass
    for site in _site_dirs():
        candidates += [Path(p) for p in glob.glob(str(site / "nvidia" / "*" / "include"))]
    api = [c for c in candidates if (c / "cuda_runtime_api.h").is_file()]
    crt = [c for c in candidates if (c / "crt" / "host_config.h").is_file()]
    if not api or not crt:
        looked = ", ".join(dict.fromkeys(str(c) for c in candidates)) or "nowhere"
        missing = "cuda_runtime_api.h" if not api else "crt/host_config.h"
        raise NativeBuildError(
            f"the CUDA runtime headers were not found ({missing} is missing; looked in: {looked}). "
            "Set CUDA_HOME to a CUDA toolkit, or `pip install nvidia-cuda-runtime nvidia-cuda-crt` "
            "for the CUDA version of your torch"
        )
    return list(dict.fromkeys(str(c) for c in api + crt))


def _torch_include_paths(torch: Any) -> List[str]:
    root = Path(torch.__file__).resolve().parent / "include"
    return [str(root), str(root / "torch" / "csrc" / "api" / "include")]


def build_native(verbose: bool = False) -> str:
    """Compiles the native allocator class for the installed torch (once; then it comes from
    the cache) and returns the shared library's path. Raises :class:`NativeBuildError` with the
    command and the compiler's output when that fails."""
    import torch

    refused = _torch_versions.refusal(torch.__version__)
    if refused is not None:
        raise NativeBuildError(refused)
    from cudamem import _cache

    _cache.ensure_private_dir()  # an untrusted cache is refused first, whatever else is missing
    what = f"cudamem's native torch allocator for torch {torch.__version__}"
    if _torch_versions.is_newer_than_supported(torch.__version__):
        what += (f" (newer than the {_torch_versions.supported_range()} it supports: its allocator "
                 "interface changed, and this cudamem does not know the new one yet)")
    return _torch_build.build_for_torch(
        torch, native_source(), "torch_native", NATIVE_SHIM_VERSION,
        _torch_include_paths(torch) + cuda_include_dirs(), ["c10", "c10_cuda", "torch_cuda", "torch_cpu"],
        NativeBuildError, what, verbose,
    )  # fmt: skip


def install_native(rust: ctypes.CDLL, verbose: bool = False) -> ctypes.CDLL:
    """Compiles (or finds) and loads the class and makes it torch's CUDA allocator. Returns
    the loaded library (keep it alive). Raises :class:`NativeBuildError` if it cannot be built
    or loaded, and ``RuntimeError`` with torch's reason if torch refuses the swap (its own
    allocator is initialised already)."""
    path = build_native(verbose=verbose)
    try:
        lib = ctypes.CDLL(path)
        version = lib.cudamem_native_version()
    except (OSError, AttributeError) as e:
        raise NativeBuildError(f"loading the native torch allocator {path} failed: {e}") from e
    if version != NATIVE_SHIM_VERSION:
        raise NativeBuildError(f"{path} has interface version {version}, expected {NATIVE_SHIM_VERSION}")
    rust.cudamem_native_api.restype = ctypes.c_void_p
    install = lib.cudamem_native_install
    install.restype = ctypes.c_int
    install.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    msg = ctypes.create_string_buffer(4096)
    last_error = ctypes.cast(rust.cudamem_last_error, ctypes.c_void_p).value
    rc = install(rust.cudamem_native_api(), last_error, msg, len(msg))
    text = msg.value.decode("utf-8", "replace")
    if rc == 2:
        raise NativeBuildError(text)
    if rc != 0:
        raise RuntimeError(text)
    return lib
