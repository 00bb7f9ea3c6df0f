"""cudamem: PyTorch's CUDA caching allocator, re-implemented in Rust.

Setup for PyTorch is one call, before the first CUDA tensor::

    import cudamem.torch
    cudamem.torch.install()          # policy="cudamem" unless CUDAMEM_POLICY says otherwise

    import torch
    x = torch.randn(1024, 1024, device="cuda")   # served by cudamem
    print(cudamem.memory_summary())

Design
------
The package is one shared library, ``cudamem/_cudamem.abi3.so`` (Rust, pyo3), with two faces:

* the Python functions of this module, which mirror ``torch.cuda``'s memory API
  (``memory_allocated``, ``memory_stats`` with the same 122 keys, ``memory_summary`` with the
  same table, ``empty_cache``, ``set_per_process_memory_fraction``, ...), plus ``malloc`` /
  ``free`` / ``record_stream`` for use without torch;
* a C ABI (``cudamem_malloc``, ``cudamem_free``, ``cudamem_empty_cache``, ...) that PyTorch's
  ``CUDAPluggableAllocator`` calls for every CUDA tensor once :func:`cudamem.torch.install`
  has run (see :mod:`cudamem.torch`).

Both act on the same process-global allocators: one per device ordinal, created on first use,
never shared between devices. The device is the GPU of that ordinal, or a simulated GPU when
``CUDAMEM_DEVICE=sim`` (or ``sim:<size>``, e.g. ``sim:8GiB``) — that is how the tests run
without a GPU. The configuration comes from ``CUDAMEM_ALLOC_CONF`` (else
``PYTORCH_CUDA_ALLOC_CONF``, else ``PYTORCH_ALLOC_CONF``, in torch's order; same syntax as PyTorch's) and the policy from ``CUDAMEM_POLICY``
(``cudamem``, the default; ``pytorch``, PyTorch's exact algorithm; ``pytorch-expandable``), or
from :func:`configure` / ``install(policy=..., config=...)`` before the first allocation.

``device`` arguments accept what torch's do: ``None`` (the current device: torch's current
device when torch is imported and CUDA initialised, else 0), an int, ``"cuda"``, ``"cuda:1"`` or a
``torch.device``.

Errors: out of memory raises :class:`OutOfMemoryError` (a ``RuntimeError``; when torch has been
imported the raised object is also a ``torch.OutOfMemoryError``) carrying PyTorch's message
("CUDA out of memory. Tried to allocate ...") and cudamem's diagnosis (largest free cached
block, fragmentation). An argument of the wrong type raises ``TypeError`` naming the argument
and the type given; a bad value, configuration string or policy raises ``ValueError`` (naming
the environment variable a bad configuration came from).

Memory history and snapshots mirror ``torch.cuda.memory``'s: :func:`record_memory_history`
(``_record_memory_history``), :func:`snapshot` (``_snapshot``), :func:`dump_snapshot`
(``_dump_snapshot``), with PyTorch's schema, so that ``python -m torch.cuda._memory_viz`` and
pytorch.org/memory_viz open cudamem's snapshots. Allocations record the Python stack of the
thread that allocates. :func:`report_leaks`, :func:`report_why`, :func:`report_summary` and
:func:`viz` are cudamem's reports over a snapshot (a dict, bytes or a file).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import pickle
import sys
from typing import Any, Iterator, Optional, Tuple, Union

from . import _cudamem

__all__ = [
    "OutOfMemoryError",
    "tag",
    "sleep",
    "wake_up",
    "sleep_stats",
    "malloc",
    "free",
    "record_stream",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "empty_cache",
    "mem_get_info",
    "set_per_process_memory_fraction",
    "configure",
    "info",
    "library_path",
    "record_memory_history",
    "snapshot",
    "dump_snapshot",
    "annotate",
    "annotate_region",
    "report_summary",
    "report_leaks",
    "report_why",
    "viz",
]

__version__ = _cudamem.__version__


class OutOfMemoryError(RuntimeError):
    """The device has not enough free memory for an allocation, even after cudamem released
    its cache and retried. The message is PyTorch's, followed by cudamem's diagnosis."""


_torch_oom_class = None


def _oom_class():
    """The class to raise for out-of-memory: ``OutOfMemoryError``, or, once torch is imported,
    a subclass of both it and ``torch.OutOfMemoryError`` (so either ``except`` catches it)."""
    global _torch_oom_class
    torch = sys.modules.get("torch")
    base = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if not isinstance(base, type) or not issubclass(base, BaseException) or issubclass(OutOfMemoryError, base):
        return OutOfMemoryError
    if _torch_oom_class is None or base not in _torch_oom_class.__mro__:
        try:
            _torch_oom_class = type(
                "OutOfMemoryError",
                (OutOfMemoryError, base),
                {"__module__": __name__, "__doc__": OutOfMemoryError.__doc__},
            )
        except TypeError:  # an incompatible layout: keep the plain class
            return OutOfMemoryError
    return _torch_oom_class


_cudamem._set_oom_class_factory(_oom_class)


def _current_device() -> int:
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # a partial or stub torch module: fall back to 0
            pass
    return 0


def _device_index(device: Any, name: str = "device") -> int:
    """Resolves a torch-style device argument to an ordinal (TypeError for a type that is none,
    ValueError for a value that is none)."""
    if device is None:
        return _current_device()
    if isinstance(device, bool):
        raise TypeError(f"{name} must be None, an int, 'cuda[:N]' or a torch.device, got bool")
    if isinstance(device, int):
        index = device
    elif isinstance(device, str) or (hasattr(device, "type") and hasattr(device, "index")):
        if isinstance(device, str):
            text = device.strip()
            kind, _, num = text.partition(":")
            if text.isdigit():
                kind, num = "cuda", text
        else:
            kind, num = str(device.type), "" if device.index is None else str(device.index)
        if kind != "cuda":
            raise ValueError(f"{name} must be a CUDA device, got {device!r}")
        if num == "":
            return _current_device()
        if not num.isdigit():
            raise ValueError(f"{name}: invalid device ordinal in {device!r}")
        index = int(num)
    else:
        raise TypeError(f"{name} must be None, an int, 'cuda[:N]' or a torch.device, got {type(device).__name__}")
    if not 0 <= index < _cudamem.MAX_DEVICES:
        raise ValueError(f"invalid {name} {index}: device must be an ordinal in [0, {_cudamem.MAX_DEVICES})")
    return index


# --------------------------------------------------------------------------------------------
# Raw allocation (no torch needed)
# --------------------------------------------------------------------------------------------


def malloc(size: int, device: Any = 0, stream: int = 0) -> int:
    """Allocates ``size`` bytes on ``device`` for use on ``stream`` (a raw ``cudaStream_t``
    value such as ``torch.cuda.current_stream().cuda_stream``; 0 is the default stream).
    Returns the device address (0 for size 0). Raises :class:`OutOfMemoryError`."""
    return _cudamem.malloc(size, _device_index(device), stream)


def free(ptr: int, device: Any = 0) -> None:
    """Frees an address returned by :func:`malloc` on the same device (ValueError for an
    address cudamem did not hand out there)."""
    _cudamem.free(ptr, _device_index(device))


def record_stream(ptr: int, stream: int, device: Any = 0) -> None:
    """Marks the allocation at ``ptr`` as used on ``stream`` too: when freed, it is reused only
    after the work queued on ``stream`` by then has completed (PyTorch's ``record_stream``)."""
    _cudamem.record_stream(ptr, stream, _device_index(device))


# --------------------------------------------------------------------------------------------
# torch.cuda's memory API
# --------------------------------------------------------------------------------------------


def memory_allocated(device: Any = None) -> int:
    """Bytes currently allocated to tensors (rounded block sizes), like
    ``torch.cuda.memory_allocated``."""
    return _cudamem.memory_allocated(_device_index(device))


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`."""
    return _cudamem.max_memory_allocated(_device_index(device))


def memory_reserved(device: Any = None) -> int:
    """Bytes held from the device (allocated plus cached)."""
    return _cudamem.memory_reserved(_device_index(device))


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved`."""
    return _cudamem.max_memory_reserved(_device_index(device))


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, int]":
    """PyTorch's 122 statistics (``allocated_bytes.all.current``, ``num_ooms``, ...), sorted
    by key, as ``torch.cuda.memory_stats`` returns them. All zero before the device's first
    allocation (and reading them opens no device)."""
    stats = _cudamem.memory_stats(_device_index(device))
    return collections.OrderedDict(sorted(stats.items()))


def memory_stats_as_nested_dict(device: Any = None) -> dict:
    """The statistics as nested dicts (``{"allocated_bytes": {"all": {"current": ...}}}``)."""
    nested: dict = {}
    for key, value in memory_stats(device).items():
        parts = key.split(".")
        node = nested
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return nested


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """PyTorch's ``memory_summary()`` table ("PyTorch CUDA memory summary, device ID N")."""
    return _cudamem.memory_summary(_device_index(device), bool(abbreviated))


def reset_peak_memory_stats(device: Any = None) -> None:
    """Sets every peak statistic to its current value."""
    _cudamem.reset_peak_memory_stats(_device_index(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Zeroes the accumulated statistics (allocated/freed totals, retries, OOM counts, ...)."""
    _cudamem.reset_accumulated_memory_stats(_device_index(device))


def empty_cache(device: Any = None) -> None:
    """Returns unused cached memory to the device. Without an argument it does so on every
    device, as ``torch.cuda.empty_cache()`` does; with one, on that device only."""
    _cudamem.empty_cache(None if device is None else _device_index(device))


def mem_get_info(device: Any = None) -> Tuple[int, int]:
    """``(free, total)`` bytes of the device, as ``cudaMemGetInfo`` reports them."""
    return tuple(_cudamem.mem_get_info(_device_index(device)))  # type: ignore[return-value]


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limits cudamem on ``device`` to ``fraction`` (a float in [0, 1]) of the device's memory;
    allocations beyond it raise :class:`OutOfMemoryError`."""
    _cudamem.set_per_process_memory_fraction(fraction, _device_index(device))


def configure(policy: Optional[str] = None, config: Optional[str] = None) -> None:
    """Chooses the policy (``"cudamem"``, ``"pytorch"``, ``"pytorch-expandable"``) and/or the
    configuration string (``PYTORCH_CUDA_ALLOC_CONF`` syntax, e.g.
    ``"expandable_segments:True,max_split_size_mb:512"``) for the allocators not yet created,
    overriding ``CUDAMEM_POLICY`` / ``CUDAMEM_ALLOC_CONF``. A bad value raises ``ValueError``;
    a change after the first allocation raises ``RuntimeError``."""
    _cudamem.configure(policy, config)


def info() -> dict:
    """What cudamem runs on: the device kind, the policy and configuration of new allocators,
    each existing allocator (device, policy, config), the error mode of the C ABI, and the
    count of ignored frees of unknown pointers."""
    return _cudamem.info()


def library_path() -> str:
    """The path of the shared library exporting the C ABI (``cudamem_malloc``, ...)."""
    return _cudamem.__file__


# --------------------------------------------------------------------------------------------
# Memory history and snapshots (torch.cuda.memory._record_memory_history, _snapshot, ...)
# --------------------------------------------------------------------------------------------

# Stop gathering Python stacks when the interpreter shuts down: a thread that allocates during
# finalization must not wait for the GIL.
atexit.register(_cudamem._at_exit)


def _check_count(value: Any, name: str) -> int:
    """A non-negative int argument (TypeError naming it when not an int, ValueError when
    negative)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return value


def _check_path(path: Any, name: str) -> None:
    """A file name argument: a str or os.PathLike (an int would be taken as an open file
    descriptor)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a file path (str or os.PathLike), got {type(path).__name__}")


def _device_or_all(device: Any) -> Optional[int]:
    return None if device is None else _device_index(device)


def record_memory_history(
    enabled: Union[str, bool, None] = "all",
    context: Optional[str] = "all",
    stacks: str = "python",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
) -> None:
    """Starts or stops recording the allocator's history, like
    ``torch.cuda.memory._record_memory_history``.

    Args:
        enabled: ``"all"`` records every event (alloc, free_requested, free_completed,
            segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot) in a ring of
            ``max_entries``; ``"state"`` keeps only the stacks of live blocks (the ring holds one
            entry); ``None`` stops recording and clears the ring. ``True``/``False`` mean
            ``"all"``/``None``.
        context: which events carry the Python stack of the thread that allocated or freed:
            ``"state"`` live blocks only (in :func:`snapshot`'s segments), ``"alloc"`` also the
            alloc entries, ``"all"`` also the frees; ``None`` no stacks (and no cost on the
            allocation path).
        stacks: ``"python"``, or ``"all"`` (accepted for PyTorch's sake; cudamem records Python
            frames only, no C++ frames).
        max_entries: the ring's size (forced to 1 unless ``enabled == "all"``, as PyTorch does).
        device: ``None`` (default) for every device, those in use and those used later
            (PyTorch's setting is global); or one device.
        clear_history: empty the ring first.

    Stacks are those of the thread that calls the allocator: through PyTorch, the Python code
    that created the tensor (innermost frame first); an allocation from a thread without Python
    code (autograd's engine threads) has no frames.
    """
    if isinstance(enabled, bool):
        enabled = "all" if enabled else None
    _check_count(max_entries, "max_entries")
    _cudamem.record_memory_history(
        enabled, context, stacks, min(max_entries, 2**64 - 1), _device_or_all(device), bool(clear_history)
    )


def snapshot(device: Any = None) -> dict:
    """The allocator's state and recorded history in PyTorch's schema, like
    ``torch.cuda.memory._snapshot()``: a dict with

    * ``segments``: one dict per segment (``device``, ``address``, ``total_size``,
      ``allocated_size``, ``active_size``, ``requested_size``, ``stream``, ``segment_type``
      "large"/"small", ``segment_pool_id``, ``is_expandable``, ``frames``, ``blocks``: dicts of
      ``address``, ``size``, ``requested_size``, ``state`` ("active_allocated",
      "active_pending_free", "inactive") and ``frames``);
    * ``device_traces``: one list of history entries per device ordinal (``action``, ``addr``
      or ``device_free`` for "oom", ``size``, ``stream``, ``time_us``, ``frames`` when recorded,
      ``compile_context``, ``user_metadata``);
    * ``allocator_settings`` (``PYTORCH_CUDA_ALLOC_CONF``, ``max_split_size``, ...);
    * ``external_annotations``: the :func:`annotate` entries (``stage``, ``name``, ``device``,
      ``time_us``).

    ``device=None`` gives every device (as PyTorch does); a device gives that one. Frames are
    ``{"name", "filename", "line"}`` dicts, innermost first; identical stacks share one list.
    While recording, taking a snapshot records a ``snapshot`` entry (as in PyTorch). Times are
    microseconds since the device's allocator was created.

    With cudamem's native allocator class installed (:func:`cudamem.torch.install`), torch's
    ``torch.cuda.memory._record_memory_history`` records torch's history once, in the class, with
    torch's frames; while it records and cudamem's own recording is off, this is torch's
    ``_snapshot()`` (of ``device`` only, when one is given), times in torch's clock.
    """
    d = _device_or_all(device)
    torchs = _torch_history_snapshot(d)
    return torchs if torchs is not None else _cudamem.snapshot(d)


def _torch_keeps_history() -> Any:
    """The ``cudamem.torch`` module when cudamem's native class records torch's history and
    cudamem's own recording is off (then that history is the one record), else None."""
    glue = sys.modules.get("cudamem.torch")
    torch = sys.modules.get("torch")
    if glue is None or torch is None or glue.install_mode() != "native" or _cudamem._recording():
        return None
    return glue if torch._C._cuda_isHistoryEnabled() else None


def _torch_history_snapshot(device: Optional[int]) -> Optional[dict]:
    """Torch's snapshot while it is the one record (see :func:`snapshot`), else None."""
    if _torch_keeps_history() is None:
        return None
    snap = sys.modules["torch"].cuda.memory._snapshot()
    if device is not None:
        snap["segments"] = [s for s in snap["segments"] if s.get("device") == device]
        snap["device_traces"] = [t if i == device else [] for i, t in enumerate(snap["device_traces"])]
        snap["external_annotations"] = [a for a in snap.get("external_annotations", []) if a.get("device") == device]
    return snap


def dump_snapshot(filename: Union[str, "os.PathLike[str]"] = "dump_snapshot.pickle", device: Any = None) -> None:
    """Writes :func:`snapshot` to ``filename`` as a pickle, like
    ``torch.cuda.memory._dump_snapshot``: ``python -m torch.cuda._memory_viz stats|trace FILE``,
    pytorch.org/memory_viz and ``cudamem viz`` open it."""
    _check_path(filename, "filename")
    data = snapshot(device)
    with open(filename, "wb") as f:
        pickle.dump(data, f)


#: The stages of an annotation: the start and the end of a region, as PyTorch records them.
ANNOTATION_STAGES = ("START", "END")


def annotate(name: str, stage: str = "START", device: Any = None) -> None:
    """Records an annotation in the history (``external_annotations`` of :func:`snapshot`, and
    an ``annotate`` entry in the device's trace): ``stage`` is ``"START"`` or ``"END"`` of the
    region ``name``, as PyTorch records ``record_function`` ranges. ``device=None``: every
    device in use. Nothing is recorded where history is off.

    While cudamem's native class keeps torch's history (see :func:`snapshot`), the annotation
    goes there, as torch's ``record_function`` ranges do: one entry, on ``device`` or else the
    current one."""
    for arg, value in (("name", name), ("stage", stage)):
        if not isinstance(value, str):
            raise TypeError(f"{arg} must be a str, got {type(value).__name__}")
    if stage not in ANNOTATION_STAGES:
        raise ValueError(f"stage must be one of {', '.join(map(repr, ANNOTATION_STAGES))}, got {stage!r}")
    d = _device_or_all(device)
    glue = _torch_keeps_history()
    if glue is not None:
        glue._native_annotate(name, stage, -1 if d is None else d)
        return
    _cudamem.annotate(name, stage, d)


@contextlib.contextmanager
def annotate_region(name: str, device: Any = None) -> Iterator[None]:
    """``with cudamem.annotate_region("forward"): ...`` records ``START`` and ``END``
    annotations around the block (``END`` also when it raises)."""
    annotate(name, "START", device)
    try:
        yield
    finally:
        annotate(name, "END", device)


def __getattr__(name: str):
    # `cudamem.torch` without importing torch (or the submodule) when cudamem is imported;
    # `cudamem.estimate` (a callable module) on first use, so that `python -m cudamem.estimate`
    # runs it fresh.
    if name in ("torch", "estimate"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


from cudamem._reports import _trace_bytes, report_leaks, report_summary, report_why, viz  # noqa: E402,F401
from cudamem._sleep import sleep, sleep_stats, tag, wake_up  # noqa: E402
