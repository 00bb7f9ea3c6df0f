"""The torch functions that cudamem.torch.install() replaces, and why.

* With the native allocator class, torch's statistics, history and snapshot functions need no
  patch (the class answers them in C++); run-time settings reach cudamem as well as torch
  (:func:`_patch_torch_native`).
* On the pluggable path, torch's statistics functions raise ("CUDAPluggableAllocator does not
  yet support getDeviceStats"), so they are replaced by cudamem's as well
  (:func:`_patch_torch_stats`).
"""

from __future__ import annotations

import sys
from typing import Any

import cudamem
from cudamem import _cudamem

# --------------------------------------------------------------------------------------------
# torch.cuda's statistics, answered by cudamem
# --------------------------------------------------------------------------------------------

_PATCHED = {
    "memory_stats": cudamem.memory_stats,
    "memory_stats_as_nested_dict": cudamem.memory_stats_as_nested_dict,
    "memory_allocated": cudamem.memory_allocated,
    "max_memory_allocated": cudamem.max_memory_allocated,
    "memory_reserved": cudamem.memory_reserved,
    "max_memory_reserved": cudamem.max_memory_reserved,
    "memory_summary": cudamem.memory_summary,
    "reset_peak_memory_stats": cudamem.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": cudamem.reset_accumulated_memory_stats,
}


# torch.cuda.memory's history and snapshot functions, with torch's signatures.


_HISTORY_ARGS = ("context", "stacks", "max_entries", "device", "clear_history")
# torch.cuda.memory._record_memory_history_legacy, chosen by a bool first argument.
_HISTORY_ARGS_LEGACY = (
    "record_context", "trace_alloc_max_entries", "trace_alloc_record_context", "device", "record_context_cpp",
    "clear_history",
)  # fmt: skip


def _torch_record_memory_history(enabled: Any = "all", *args: Any, **kwargs: Any) -> None:
    """cudamem's memory history, with ``torch.cuda.memory._record_memory_history``'s
    arguments (see :func:`cudamem.record_memory_history`): ``enabled``, ``context``, ``stacks``,
    ``max_entries``, ``device``, ``clear_history``. As in PyTorch the setting is global
    (``device`` is ignored) and ``stacks`` defaults to ``"all"`` (cudamem records Python frames
    only). The legacy form (a bool first, then ``record_context``, ``trace_alloc_max_entries``,
    ``trace_alloc_record_context``, ...) is accepted. Arguments of newer torch versions
    (``compile_context``, ``global_record_annotations``, ``skip_actions``, ...) are ignored."""
    names = _HISTORY_ARGS_LEGACY if isinstance(enabled, bool) else _HISTORY_ARGS
    a = dict(zip(names, args))  # positional arguments past these (newer torch's) are ignored
    for k, v in kwargs.items():
        if k in a:
            raise TypeError(f"_record_memory_history() got multiple values for argument {k!r}")
        a[k] = v
    clear = bool(a.get("clear_history", False))
    if isinstance(enabled, bool):
        if not enabled:
            cudamem.record_memory_history(None, clear_history=clear)
            return
        # PyTorch's legacy: context ALLOC if trace_alloc_record_context, else STATE if
        # record_context; the ring holds trace_alloc_max_entries.
        if a.get("trace_alloc_record_context", False):
            context = "alloc"
        elif a.get("record_context", True):
            context = "state"
        else:
            context = None
        n = max(int(a.get("trace_alloc_max_entries", 1)), 1)
        cudamem.record_memory_history("all", context, "python", n, None, clear)
        return
    stacks = a.get("stacks", "all")
    cudamem.record_memory_history(
        enabled,
        a.get("context", "all"),
        "python" if stacks in ("python", "all") else stacks,
        a.get("max_entries", sys.maxsize),
        None,
        clear,
    )


def _torch_snapshot(device: Any = None, *args: Any, **kwargs: Any) -> dict:
    """cudamem's :func:`cudamem.snapshot` of every device, as ``torch.cuda.memory._snapshot``."""
    return cudamem.snapshot()


def _torch_dump_snapshot(filename: str = "dump_snapshot.pickle", *args: Any, **kwargs: Any) -> None:
    """cudamem's :func:`cudamem.dump_snapshot` of every device, as
    ``torch.cuda.memory._dump_snapshot``."""
    cudamem.dump_snapshot(filename)


def _torch_memory_snapshot(*args: Any, **kwargs: Any) -> list:
    """The ``segments`` of :func:`cudamem.snapshot`, as ``torch.cuda.memory_snapshot``."""
    return cudamem.snapshot()["segments"]


_PATCHED_HISTORY = {
    "_record_memory_history": _torch_record_memory_history,
    "_snapshot": _torch_snapshot,
    "_dump_snapshot": _torch_dump_snapshot,
    "memory_snapshot": _torch_memory_snapshot,
}


def _patch_torch_native(torch: Any) -> None:
    """With the native allocator torch's statistics, history and snapshots need no patch; run-time
    settings reach cudamem as well as torch."""
    original = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if original is not None and not getattr(original, "_cudamem", False):

        def set_allocator_settings(env: str) -> Any:
            result = original(env)  # torch's parser first: it rejects what torch rejects
            _cudamem.set_allocator_settings(env)
            return result

        set_allocator_settings._cudamem = True  # type: ignore[attr-defined]
        torch._C._accelerator_setAllocatorSettings = set_allocator_settings


def _patch_torch_stats(torch: Any) -> None:
    # torch.cuda.memory's other helpers (memory_cached, reset_max_memory_allocated, ...) call
    # these through the module's globals, so replacing them there covers those too.
    for module in (torch.cuda.memory, torch.cuda):
        for name, fn in _PATCHED.items():
            if hasattr(module, name):
                setattr(module, name, fn)
        for name, fn in _PATCHED_HISTORY.items():
            if hasattr(module, name):
                setattr(module, name, fn)
