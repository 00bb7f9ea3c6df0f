"""What the pluggable path refuses: CUDA graphs, ``MemPool`` and ``torch.compile``'s CUDA graphs.

Through ``CUDAPluggableAllocator`` torch hands cudamem two functions, allocate and free. A CUDA
graph capture needs more: the allocations made while capturing must go to the graph's private
pool and stay there until the graph is gone, because replays write to those addresses. Torch's
pluggable allocator forwards ``beginAllocateToPool`` only to a hook, and without the native class
nothing routes the capture, so a capture would run and its replays would compute wrong numbers
with no error. Rather than that, on the pluggable path cudamem refuses, with an error that names
the cause and the fix, each way into a capture or a private pool:

* ``torch.cuda.CUDAGraph.capture_begin`` (``torch.cuda.graph``, ``make_graphed_callables``,
  ``torch.compile``'s CUDA-graph trees all go through it);
* ``torch.cuda.MemPool`` (and so ``torch.cuda.use_mem_pool``);
* ``torch.compile`` with ``mode="reduce-overhead"`` or ``"max-autotune"`` (both capture CUDA
  graphs), ``options={"triton.cudagraphs": True}`` or ``backend="cudagraphs"``, refused at the
  call, before anything is compiled;
* in C++, torch's ``beginAllocateToPool`` itself, through the shim's pool hook
  (``cudamem_torch_refuse_pool``, set by :mod:`cudamem.torch` when the shim is loaded), for
  callers that do not come through Python.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from cudamem import _torch_versions

GUARDED = "_cudamem_guarded"


def refusal(what: str) -> str:
    return (
        f"cudamem: {what} is not available on cudamem's pluggable path (cudamem.torch.install(native=False) "
        "or CUDAMEM_TORCH_NATIVE=0): torch's pluggable allocator interface cannot keep a CUDA graph's "
        "memory in its private pool, so the graph would compute wrong results. Use cudamem's native "
        f"allocator class instead (it needs {_torch_versions.supported_range()}, a C++ compiler and the "
        "CUDA runtime headers; install() without native=False builds it), or run this process without "
        "cudamem.torch.install()."
    )


def _wrap(fn: Callable, check: Callable[..., None]) -> Callable:
    if getattr(fn, GUARDED, False):
        return fn

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        check(*args, **kwargs)
        return fn(*args, **kwargs)

    setattr(guarded, GUARDED, True)
    return guarded


def _refuse(what: str) -> Callable[..., None]:
    def check(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(refusal(what))

    return check


def _check_compile(*args: Any, **kwargs: Any) -> None:
    mode = kwargs.get("mode")
    options = kwargs.get("options") or {}
    backend = kwargs.get("backend", "inductor")
    if mode in ("reduce-overhead", "max-autotune"):
        raise RuntimeError(refusal(f'torch.compile(mode="{mode}") (it captures CUDA graphs)'))
    if isinstance(options, dict) and options.get("triton.cudagraphs"):
        raise RuntimeError(refusal('torch.compile(options={"triton.cudagraphs": True})'))
    if backend == "cudagraphs":
        raise RuntimeError(refusal('torch.compile(backend="cudagraphs")'))


def guard_pluggable(torch: Any) -> None:
    """Makes every Python way into a CUDA graph capture or a private pool raise :func:`refusal`."""
    graphs = getattr(torch.cuda, "graphs", None)
    graph_cls = getattr(graphs, "CUDAGraph", None) or getattr(torch.cuda, "CUDAGraph", None)
    if graph_cls is not None:
        graph_cls.capture_begin = _wrap(graph_cls.capture_begin, _refuse("CUDA graph capture (torch.cuda.graph, CUDAGraph.capture_begin)"))
    pool_cls = getattr(torch.cuda.memory, "MemPool", None) or getattr(torch.cuda, "MemPool", None)
    if pool_cls is not None:
        pool_cls.__init__ = _wrap(pool_cls.__init__, _refuse("torch.cuda.MemPool"))
    if hasattr(torch, "compile"):
        torch.compile = _wrap(torch.compile, _check_compile)
