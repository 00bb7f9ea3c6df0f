"""Will it fit: a job's GPU memory, predicted without running it on the GPU.

Two ways in:

* :func:`estimate` (also ``cudamem.estimate(fn, ...)``: this module is callable) runs ``fn`` on
  the CPU with no GPU: every CUDA tensor it makes is a *meta* tensor (shapes and dtypes, no
  data), and :mod:`cudamem._estimate_torch` records each storage's creation and death in program
  order into a trace, which is replayed on the simulated GPU with the ``pytorch`` policy (what
  PyTorch's allocator would reserve) and cudamem's default. ``with recording() as rec:`` does the
  same for a block of code.
* :func:`largest_batch` records ``fn(batch)`` that way at a few small batches and scales them
  (below) to the largest batch that fits a GPU, still without one.
* :func:`scale` takes real traces of one job at two or three batch sizes
  (``torch.cuda.memory._dump_snapshot``) and answers for a larger batch and for a GPU: the peak
  reserved per policy and the largest batch that fits, with how sure it is
  (``cudamem scale`` on the command line).

This file holds the entry points and the command line (``python -m cudamem.estimate
MODULE:FUNCTION``); :mod:`cudamem._estimate_core` the parts that need no torch (the trace the
recorder writes, the cuBLAS workspace rule, the replays, the result object and its table),
:mod:`cudamem._estimate_torch` the recorder and :mod:`cudamem._largest_batch` the search for the
largest batch. Guarantees: a recorded trace is a PyTorch
snapshot dict that every cudamem reader accepts; the estimate names what it leaves out (memory
only real kernels allocate) instead of silently omitting it; an argument of the wrong type
raises ``TypeError`` and a bad value ``ValueError``, each naming the argument.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Callable, List, Optional, Sequence

# The torch-free parts live in _estimate_core; these are this module's public API.
from ._estimate_core import (DEFAULT_POLICIES, LIKELY_SHARE, MIN_CAPACITY, ORDERS, Estimate,  # noqa: F401
                             TraceBuilder, capacity_bytes, cublas_workspace_bytes, cublaslt_workspace_bytes,
                             headline, human, recording, replay, scale)

__all__ = ["DEFAULT_POLICIES", "LIKELY_SHARE", "MAY_FIT_SPAN", "MIN_CAPACITY", "ORDERS", "SAFE_MARGIN", "Estimate",
           "TraceBuilder", "capacity_bytes", "cublas_workspace_bytes", "cublaslt_workspace_bytes", "estimate",
           "headline", "human", "largest_batch", "main", "recording", "replay", "scale"]


def estimate(fn: Callable, *args: Any, device_memory: Any = None, policies: Sequence[str] = DEFAULT_POLICIES,
             config: Optional[str] = None, compute_capability: int = 9, **kwargs: Any) -> Estimate:
    """Runs ``fn(*args, **kwargs)`` on the CPU with no GPU (CUDA tensors become meta tensors)
    and estimates the peak memory PyTorch would reserve for it, per policy. ``fn`` should build
    its model and run its steps itself (what is allocated before it is not seen), and must not
    read tensor values (``.item()``, data-dependent shapes): there are none. ``device_memory``
    (bytes, ``"24GiB"`` or a GPU name) also says whether it fits; ``compute_capability`` is the
    GPU's major version, for the cuBLAS workspace size."""
    if not callable(fn):
        raise TypeError(f"fn: expected the function to record, got {type(fn).__name__}")
    with recording(compute_capability=compute_capability) as rec:
        fn(*args, **kwargs)
    return rec.estimate(device_memory=device_memory, policies=policies, config=config)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m cudamem.estimate MODULE:FUNCTION [--device-memory 24GiB] [--policy a,b]
    [--save trace.pickle] [--json]``: the GPU-free estimate of a function taking no arguments."""
    import argparse
    import importlib

    ap = argparse.ArgumentParser(prog="python -m cudamem.estimate", description=main.__doc__)
    ap.add_argument("target", help="MODULE:FUNCTION (or path/to/file.py:FUNCTION), called with no arguments")
    ap.add_argument("--device-memory", help="a size (24GiB) or a GPU name (h100-80gb, a100-40gb, h200)")
    ap.add_argument("--policy", default=",".join(DEFAULT_POLICIES), help="comma-separated policies")
    ap.add_argument("--compute-capability", type=int, default=9, help="the GPU's major version (cuBLAS workspace)")
    ap.add_argument("--save", help="write the recorded trace (a snapshot pickle) here")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    mod_name, sep, fn_name = a.target.rpartition(":")
    if not sep or not mod_name or not fn_name:
        ap.error(f"target {a.target!r}: expected MODULE:FUNCTION")
    try:
        if mod_name.endswith(".py"):
            import importlib.util

            spec = importlib.util.spec_from_file_location("_cudamem_estimate_target", mod_name)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {mod_name}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        else:
            mod = importlib.import_module(mod_name)
        fn = getattr(mod, fn_name)
    except (ImportError, AttributeError, OSError) as e:
        print(f"cudamem.estimate: {a.target}: {e}", file=sys.stderr)
        return 2
    try:
        est = estimate(fn, device_memory=a.device_memory, policies=a.policy,
                       compute_capability=a.compute_capability)
    except (ValueError, RuntimeError) as e:
        print(f"cudamem.estimate: {e}", file=sys.stderr)
        return 2
    if a.save:
        est.save(a.save)
    print(json.dumps(est.as_dict()) if a.json else est)
    return 0


from ._largest_batch import MAY_FIT_SPAN, SAFE_MARGIN, largest_batch  # noqa: E402,F401 (re-exported)


class _CallableModule(types.ModuleType):
    """Lets ``cudamem.estimate(fn, ...)`` call :func:`estimate` while ``cudamem.estimate.scale``
    and the rest stay reachable as module attributes."""

    def __call__(self, fn: Callable, *args: Any, **kwargs: Any) -> Estimate:
        return estimate(fn, *args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
