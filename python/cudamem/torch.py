"""Installing cudamem as PyTorch's CUDA allocator.

::

    import cudamem.torch
    cudamem.torch.install()     # before the first CUDA tensor
    import torch
    ...                          # every CUDA tensor now comes from cudamem

How it plugs in
---------------
By default :func:`install` compiles cudamem's native allocator class
(``cudamem/_shim/native_allocator.cpp``, a c10 ``CUDAAllocator``; see
:mod:`cudamem._torch_native` and ``docs/design/torch-allocator.md``) against the installed torch
and installs it with torch's ``changeCurrentAllocator``. Torch's own code then talks to cudamem
in C++: statistics, CUDA graphs and their private pools, ``torch.cuda.MemPool``,
``torch.compile(mode="reduce-overhead")``, cuDNN autotuning, the profiler's memory view and OOM
observers work unchanged, and so do the memory history and snapshots
(``torch.cuda.memory._record_memory_history``, ``_snapshot``, ``_dump_snapshot``: the class
keeps torch's history with torch's context recorder, so frames are torch's own). The swap is only possible before PyTorch's own allocator is initialised, i.e. before
CUDA is first used in the process; :func:`install` checks this and says so.

Torch versions: the class supports torch 2.9 to 2.15 (:mod:`cudamem._torch_versions`; it is
compiled for the installed release, adapting to its allocator interface). An older torch is
refused before anything is compiled; a newer one is compiled against, and refused with the
compiler's output if its interface changed.

Failing closed: if the class cannot be built (an unsupported torch, no C++ compiler, no CUDA
runtime headers), :func:`install` raises :class:`cudamem._torch_native.NativeBuildError` naming
the cause and the fix; it does not fall back by itself. The fallback,
``torch.cuda.memory.CUDAPluggableAllocator``, is used only when asked for
(``install(native=False)`` or ``CUDAMEM_TORCH_NATIVE=0``): two C functions, ``void* alloc(size_t,
int device, cudaStream_t)`` and ``void free(void*, size_t, int, cudaStream_t)``, plus the
optional hooks ``set_reset_fn`` (``empty_cache``), ``set_memory_fraction_fn`` and
``set_record_stream_fn``. That interface cannot route a CUDA graph's memory to its private pool,
so on it cudamem refuses CUDA graph capture, ``torch.cuda.MemPool`` and ``torch.compile``'s CUDA
graphs with an error (:mod:`cudamem._torch_guard`) rather than let a graph compute wrong
numbers. The rest of this page is that path.

Out of memory: the C++ shim
---------------------------
A C function cannot raise a Python exception inside PyTorch's C++ allocation path, and if the
alloc function returns NULL PyTorch silently builds a tensor on a null pointer. PyTorch's own
allocator throws the C++ exception ``c10::OutOfMemoryError``, which PyTorch's bindings turn into
``torch.OutOfMemoryError``. So does cudamem, through a small C++ shim
(``cudamem/_shim/torch_shim.cpp``): its ``cudamem_torch_malloc`` calls the Rust
``cudamem_malloc_or_error`` and, on NULL with size > 0, throws ``c10::OutOfMemoryError``
(``TORCH_CHECK_WITH(OutOfMemoryError, false, msg)``) with cudamem's message; other failures
throw ``c10::Error`` (→ ``RuntimeError``). The shim is compiled at the first :func:`install`
with the system's C++ compiler (``$CXX`` or ``g++``), against the headers and ``libc10`` of
the installed torch, with torch's ``_GLIBCXX_USE_CXX11_ABI``, and cached in
``~/.cache/cudamem/`` (``$CUDAMEM_CACHE_DIR`` or ``$XDG_CACHE_HOME/cudamem`` if set) under a
name keyed by torch's version, that ABI flag and the shim source's hash. No ninja, no
setuptools build: one ``g++`` command (shown by :func:`build_shim` on failure).

The cache is trusted only if nobody else could have written to it (:mod:`cudamem._cache`):
the directory (created with mode 0700) and the library must be owned by the current user and
not writable by group or others, the library must not be a symlink, and its SHA-256 must match
the ``.sha256`` file recorded beside it when it was built. A cache that fails the ownership or
mode checks raises :class:`UntrustedCacheError` from :func:`install` (no fallback: another user
may have planted the file); a missing or mismatching digest makes it rebuild the shim.

Without a C++ compiler (or with ``CUDAMEM_TORCH_SHIM=0``), :func:`install` warns and plugs in
the Rust functions directly. Out of memory is then still an exception, not a null tensor:
``cudamem_malloc`` calls ``c10::detail::torchCheckFail`` (a plain-C-typed function exported by
``libc10``), which throws ``c10::Error`` — a Python ``RuntimeError`` carrying the same "CUDA out
of memory. Tried to allocate ..." message, but *not* a ``torch.OutOfMemoryError`` (``except
torch.OutOfMemoryError`` does not catch it; ``except RuntimeError`` does). Should that symbol be
missing, cudamem prints the message and aborts the process rather than return NULL.

What changes for the rest of torch
----------------------------------
* ``torch.cuda.memory_allocated()``, ``memory_stats()``, ``memory_summary()``, the
  ``max_*``/``reset_*`` functions raise "CUDAPluggableAllocator does not yet support
  getDeviceStats" with any pluggable allocator. :func:`install` (with ``patch_torch_stats=True``,
  the default) replaces them in ``torch.cuda`` and ``torch.cuda.memory`` by cudamem's, which
  return the same keys and table.
* Memory history and snapshots: PyTorch's ``torch.cuda.memory._record_memory_history``,
  ``_snapshot``, ``_dump_snapshot`` and ``memory_snapshot`` raise with any pluggable allocator;
  :func:`install` (``patch_torch_stats=True``) replaces them by cudamem's
  (:func:`cudamem.record_memory_history`, ...), which record the Python stack of each
  allocation and write PyTorch's snapshot schema, so ``torch.cuda._memory_viz`` works on the
  dumps. ``install(record_history=True)`` starts recording at once. PyTorch's
  ``record_function`` ranges are not recorded as annotations (use
  :func:`cudamem.annotate_region`).
* Refused on the pluggable path, with an error (see above): CUDA graphs and their private pools
  (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``), ``torch.cuda.MemPool``.
  Not supported there either (PyTorch's pluggable-allocator limits): CUDA IPC of tensors between
  processes; cuDNN autotuning (``torch.backends.cudnn.benchmark = True``) queries the
  allocator's ``cacheInfo``, which pluggable allocators refuse.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Union

import cudamem
from cudamem import _cudamem, _torch_build, _torch_guard, _torch_versions
from cudamem._cache import UntrustedCacheError

__all__ = [
    "install", "is_installed", "install_mode", "build_shim", "shim_source", "ShimBuildError", "UntrustedCacheError",
]  # fmt: skip

# Bumped whenever the shim's exported interface changes (checked at load time).
SHIM_ABI_VERSION = 1

_TORCH_CHECK_FAIL = "_ZN3c106detail14torchCheckFailEPKcS2_jS2_"

_TOO_LATE = (
    "cudamem.torch.install() must run before the first CUDA tensor: PyTorch has already "
    "initialised CUDA and its own caching allocator in this process, and an initialised "
    "allocator cannot be swapped. Call cudamem.torch.install() right after `import torch` (and "
    "before anything that touches CUDA, such as .cuda(), torch.cuda.init() or creating a model "
    "on the GPU)."
)

_lock = threading.Lock()
_state: dict = {}  # mode, allocator, libraries: kept alive for the rest of the process


class ShimBuildError(RuntimeError):
    """The C++ shim could not be compiled (no compiler, or a compile error: see the message)."""


def is_installed() -> bool:
    """Whether :func:`install` has made cudamem PyTorch's CUDA allocator in this process."""
    return "mode" in _state


def install_mode() -> Optional[str]:
    """``"native"`` (cudamem is torch's c10 CUDA allocator: see :mod:`cudamem._torch_native`),
    ``"shim"`` (through ``CUDAPluggableAllocator``; out of memory raises
    ``torch.OutOfMemoryError``), ``"c"`` (pluggable without a C++ compiler: ``RuntimeError``),
    or None when not installed."""
    return _state.get("mode")


def shim_source() -> Path:
    """The C++ source of the shim, shipped inside the package."""
    return Path(__file__).resolve().parent / "_shim" / "torch_shim.cpp"


def build_shim(verbose: bool = False) -> str:
    """Compiles the shim for the installed torch (once; then it is read from the cache) and
    returns the path of the shared library. Raises :class:`ShimBuildError` with the command and
    the compiler's output when that fails, :class:`UntrustedCacheError` when the cache could
    have been written by another user."""
    import torch

    return _torch_build.build_for_torch(
        torch, shim_source(), "torch_shim", SHIM_ABI_VERSION, _torch_build.torch_include_paths(torch),
        ["c10"], ShimBuildError, "cudamem's torch shim", verbose,
    )  # fmt: skip


def _addr(fn: Any) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def _load_shim(path: str, rust: ctypes.CDLL) -> ctypes.CDLL:
    shim = ctypes.CDLL(path)
    init = shim.cudamem_torch_shim_init
    init.restype = ctypes.c_int
    init.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    version = init(_addr(rust.cudamem_malloc_or_error), _addr(rust.cudamem_free), _addr(rust.cudamem_last_error_kind))
    if version != SHIM_ABI_VERSION:
        raise ShimBuildError(f"the shim at {path} has interface version {version}, expected {SHIM_ABI_VERSION}")
    return shim


def _find_torch_check_fail(torch: Any) -> int:
    """The address of ``c10::detail::torchCheckFail(const char*, const char*, uint32_t, const
    char*)`` in the loaded libc10, or 0."""
    lib = Path(torch.__file__).resolve().parent / "lib" / "libc10.so"
    try:
        c10 = ctypes.CDLL(str(lib))
        return _addr(getattr(c10, _TORCH_CHECK_FAIL))
    except (OSError, AttributeError):
        return 0


def install(
    policy: Optional[str] = None,
    config: Optional[str] = None,
    *,
    patch_torch_stats: bool = True,
    use_shim: Optional[bool] = None,
    verbose: bool = False,
    record_history: Union[bool, Dict[str, Any]] = False,
    native: Optional[bool] = None,
) -> None:
    """Makes cudamem PyTorch's CUDA allocator for the rest of the process.

    Args:
        policy: ``"cudamem"`` (default, or ``$CUDAMEM_POLICY``), ``"pytorch"`` (PyTorch's own
            algorithm) or ``"pytorch-expandable"``.
        config: a ``PYTORCH_CUDA_ALLOC_CONF``-style string (default: ``$CUDAMEM_ALLOC_CONF``,
            else ``$PYTORCH_CUDA_ALLOC_CONF``, else ``$PYTORCH_ALLOC_CONF``, torch's order).
        patch_torch_stats: route ``torch.cuda.memory_allocated``, ``memory_stats``,
            ``memory_summary``, ``max_memory_*``, ``reset_*``, and the history and snapshot
            functions ``torch.cuda.memory._record_memory_history``, ``_snapshot``,
            ``_dump_snapshot``, ``memory_snapshot`` to cudamem (they raise with any pluggable
            allocator otherwise).
        use_shim: True requires the C++ shim (raise if it cannot be built), False never builds
            it, None (default) builds it and falls back with a warning. ``CUDAMEM_TORCH_SHIM=0``
            means False.
        verbose: print the compiler command.
        native: True or None (default): the native allocator class, built for the installed
            torch (2.9 to 2.15); raise :class:`cudamem._torch_native.NativeBuildError` naming the
            cause and the fix if it cannot be built. False (or ``CUDAMEM_TORCH_NATIVE=0``): plug
            in through ``CUDAPluggableAllocator`` instead, where CUDA graph capture,
            ``torch.cuda.MemPool`` and ``torch.compile``'s CUDA graphs raise, and cuDNN
            autotuning and the profiler's memory view are unavailable.
        record_history: start recording the memory history now, on every device: ``True``
            for the defaults (every event, stacks on allocations and frees), or a dict of
            arguments (``{"max_entries": 100000}``): torch's
            ``torch.cuda.memory._record_memory_history`` with the native class (which keeps
            torch's history; :func:`cudamem.snapshot` returns it), :func:`cudamem.record_memory_history`
            on the pluggable path.

    Raises:
        cudamem._torch_native.NativeBuildError: the native class cannot be built for this torch
            (and ``native=False`` was not given).
        RuntimeError: CUDA was already used in this process (install() must come first), or
            ``CUDAMEM_DEVICE`` selects the simulated device.
        ValueError: a bad policy or configuration string.
        TypeError: ``record_history`` is neither a bool nor a dict.
        ImportError: torch is not installed.
    """
    if record_history is not None and not isinstance(record_history, (bool, dict)):
        raise TypeError(
            "record_history must be a bool or a dict of record_memory_history's arguments, "
            f"got {type(record_history).__name__}"
        )
    with _lock:
        if is_installed():
            if policy is not None or config is not None:
                cudamem.configure(policy, config)  # raises if it would change anything in use
            _start_history(record_history)
            return
        import torch

        info = cudamem.info()
        kind = str(info.get("device_kind"))
        if kind.startswith("invalid"):
            raise ValueError(kind[len("invalid: "):])
        if kind != "cuda":
            raise RuntimeError(
                "cudamem.torch.install(): CUDAMEM_DEVICE selects a simulated GPU, whose addresses "
                "PyTorch cannot use; unset CUDAMEM_DEVICE (or set it to 'cuda')"
            )
        if torch.cuda.is_initialized():
            raise RuntimeError(_TOO_LATE)
        cudamem.configure(policy, config)
        # A bad CUDAMEM_POLICY / CUDAMEM_ALLOC_CONF / PYTORCH_[CUDA_]ALLOC_CONF: say so now, not
        # at the first tensor.
        settings_error = cudamem.info().get("settings_error")
        if settings_error:
            raise ValueError(settings_error)

        rust_path = cudamem.library_path()
        rust = ctypes.CDLL(rust_path)
        if native is None and _env_off("CUDAMEM_TORCH_NATIVE"):
            native = False
        if native is not False:
            from cudamem import _torch_native

            if _torch_versions.is_newer_than_supported(torch.__version__):
                warnings.warn(
                    f"cudamem: torch {torch.__version__} is newer than the {_torch_versions.supported_range()} "
                    "that cudamem's native allocator supports; compiling it anyway (if torch's allocator "
                    "interface changed, install() raises NativeBuildError)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            try:
                lib = _torch_native.install_native(rust, verbose=verbose)
            except _torch_native.NativeBuildError as e:
                raise _torch_native.NativeBuildError(_native_failed(torch, e)) from e
            except RuntimeError as e:
                if "initialized" in str(e):
                    raise RuntimeError(_TOO_LATE) from e
                raise
            _state.update(mode="native", rust=rust, native=lib)
            if patch_torch_stats:
                _patch_torch_native(torch)
            _start_history(record_history)
            return
        if use_shim is None and _env_off("CUDAMEM_TORCH_SHIM"):
            use_shim = False
        shim = None
        if use_shim is not False:
            try:
                shim_path = build_shim(verbose=verbose)
                shim = _load_shim(shim_path, rust)
            except (ShimBuildError, OSError, AttributeError) as e:
                if use_shim:
                    raise
                warnings.warn(
                    "cudamem: the C++ shim could not be built, so out of memory will raise a plain "
                    "RuntimeError (not torch.OutOfMemoryError) with the same message. Install g++ "
                    f"(or set CXX) to fix this. Details: {e}",
                    RuntimeWarning,
                    stacklevel=2,
                )
        previous_mode = None
        if shim is not None:
            allocator = torch.cuda.memory.CUDAPluggableAllocator(shim_path, "cudamem_torch_malloc", "cudamem_torch_free")
            mode = "shim"
        else:
            thrower = _find_torch_check_fail(torch)
            _cudamem._set_error_thrower(thrower)
            previous_mode = _cudamem.set_error_mode(_cudamem.MODE_THROW if thrower else _cudamem.MODE_ABORT)
            allocator = torch.cuda.memory.CUDAPluggableAllocator(rust_path, "cudamem_malloc", "cudamem_free")
            mode = "c"
        hooks = allocator.allocator()
        hooks.set_reset_fn(_addr(rust.cudamem_empty_cache))
        hooks.set_memory_fraction_fn(_addr(rust.cudamem_set_memory_fraction))
        hooks.set_record_stream_fn(_addr(rust.cudamem_record_stream))
        if shim is not None and hasattr(hooks, "set_begin_allocate_to_pool"):
            hooks.set_begin_allocate_to_pool(_addr(shim.cudamem_torch_refuse_pool))
        _torch_guard.guard_pluggable(torch)
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            if previous_mode is not None:
                _cudamem.set_error_mode(previous_mode)
            if "initialized" in str(e):
                raise RuntimeError(_TOO_LATE) from e
            raise
        _state.update(mode=mode, allocator=allocator, rust=rust, shim=shim)
        if patch_torch_stats:
            _patch_torch_stats(torch)
        _start_history(record_history)


def _native_failed(torch: Any, e: Exception) -> str:
    return (
        f"cudamem: the native torch allocator could not be built for torch {torch.__version__}, so "
        "cudamem.torch.install() stops here rather than fall back to a path without CUDA graphs. "
        f"Cause: {e}\nFix: use a torch that cudamem supports ({_torch_versions.supported_range()}), with a "
        "C++ compiler (g++, or $CXX) and the CUDA runtime headers ($CUDA_HOME, or `pip install "
        "nvidia-cuda-runtime nvidia-cuda-crt`). Or accept the pluggable path, where CUDA graph capture, "
        "torch.cuda.MemPool and torch.compile's CUDA graphs raise: cudamem.torch.install(native=False) "
        "or CUDAMEM_TORCH_NATIVE=0."
    )


def _env_off(name: str) -> bool:
    return os.environ.get(name, "1").strip().lower() in ("0", "false", "off", "no")


def _native_annotate(name: str, stage: str, device: int) -> bool:
    """An annotation in torch's history, kept by the native class (``device`` -1: the current
    one); False when the class is not installed or does not record."""
    lib = _state.get("native")
    if lib is None:
        return False
    fn = lib.cudamem_native_annotate
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    return fn(name.encode(), stage.encode(), device) == 1


def _start_history(record_history: Union[bool, Dict[str, Any], None]) -> None:
    if record_history is None or record_history is False:
        return
    if record_history is True:
        kwargs: Dict[str, Any] = {}
    elif isinstance(record_history, dict):
        kwargs = dict(record_history)
    else:
        raise TypeError(f"record_history must be a bool or a dict of record_memory_history's arguments, got {record_history!r}")
    if _state.get("mode") == "native":
        import torch

        # Torch's own history, kept by the native class (cudamem.snapshot() reads it too).
        torch.cuda.memory._record_memory_history(**kwargs)
    else:
        cudamem.record_memory_history(**kwargs)


# torch.cuda's functions that cudamem answers (see cudamem._torch_patches).
from cudamem._torch_patches import (  # noqa: E402
    _patch_torch_native,
    _patch_torch_stats,
    _torch_dump_snapshot,
    _torch_memory_snapshot,
    _torch_record_memory_history,
    _torch_snapshot,
)
