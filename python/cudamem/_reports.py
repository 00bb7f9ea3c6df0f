"""cudamem's reports over a snapshot (crate cudamem-report): what ``cudamem summary``,
``leaks``, ``why`` and ``viz`` print, for a snapshot dict, the bytes of a trace or a file path.
Re-exported by :mod:`cudamem`."""

from __future__ import annotations

import json as _json
import os
import pickle
import sys
from typing import Any, Optional, Tuple, Union

from cudamem import _check_count, _check_path, _cudamem


def _trace_bytes(trace: Any) -> Tuple[bytes, str]:
    """(bytes, name) of a snapshot dict (or a bare segments list), bytes, or a file path."""
    if isinstance(trace, (dict, list)):
        return pickle.dumps(trace, protocol=4), "<snapshot>"
    if isinstance(trace, (bytes, bytearray, memoryview)):
        return bytes(trace), "<bytes>"
    if isinstance(trace, (str, os.PathLike)):
        path = os.fspath(trace)
        with open(path, "rb") as f:
            return f.read(), os.path.basename(path)
    raise TypeError(
        f"expected a snapshot dict (cudamem.snapshot()), bytes or a file path, got {type(trace).__name__}"
    )


def report_summary(trace: Any, json: bool = False) -> Union[str, dict]:
    """``memory_summary()`` tables at the end of the trace and at its reserved peak (replayed
    with PyTorch's algorithm and the trace's settings). ``trace``: a snapshot dict
    (:func:`snapshot`), the bytes of a snapshot pickle (plain or gzip'd) or another trace format
    cudamem reads, or a file path. Returns the text, or with ``json=True`` a dict."""
    data, source = _trace_bytes(trace)
    text = _cudamem._report_summary(data, source, bool(json))
    return _json.loads(text) if json else text


def report_leaks(trace: Any, at: Optional[str] = None, top: int = 10, frames: int = 12, json: bool = False) -> Union[str, dict]:
    """What is still allocated, grouped by the stack that allocated it, largest first: at the
    end of the trace (the snapshot's live blocks), or at ``at`` (an event index as a string, or
    an annotation ``NAME``, ``NAME@k``, ``NAME@last``). Text with the ``top`` groups and
    ``frames`` frames each, or with ``json=True`` a dict of all groups."""
    if isinstance(at, bool) or not isinstance(at, (int, str, type(None))):
        raise TypeError(f"at must be an event index (int), an annotation name (str) or None, got {type(at).__name__}")
    if isinstance(at, int) and at < 0:
        raise ValueError(f"at must be an event index >= 0 or an annotation name, got {at}")
    top, frames = (min(_check_count(v, n), sys.maxsize) for v, n in ((top, "top"), (frames, "frames")))
    data, source = _trace_bytes(trace)
    text = _cudamem._report_leaks(data, source, None if at is None else str(at), top, frames, bool(json))
    return _json.loads(text) if json else text


def report_why(trace: Any, top: int = 10, json: bool = False) -> Union[str, dict]:
    """Why memory stays reserved: which cached bytes ``empty_cache()`` would release, and which
    live blocks (with their stacks) pin the rest of their segments."""
    top = min(_check_count(top, "top"), sys.maxsize)
    data, source = _trace_bytes(trace)
    text = _cudamem._report_why(data, source, top, 5, 6, bool(json))
    return _json.loads(text) if json else text


def viz(
    trace: Any,
    out_html: Union[str, "os.PathLike[str]"] = "cudamem_viz.html",
    title: Optional[str] = None,
    policy: Optional[str] = None,
    config: Optional[str] = None,
) -> str:
    """Writes cudamem's self-contained HTML viewer of the trace to ``out_html`` (no network
    needed to open it): the active-memory timeline with stacks, the segment map at any event,
    reserved vs allocated, and ``memory_summary()`` tables. With ``policy`` (e.g.
    ``"cudamem"``) it shows the trace replayed with that policy (``config``: settings over the
    trace's). Returns the path written; ``out_html`` may not be the trace's own file."""
    _check_path(out_html, "out_html")
    path = os.fspath(out_html)
    if isinstance(trace, (str, os.PathLike)) and os.path.exists(path) and os.path.samefile(trace, path):
        raise ValueError(f"out_html {path!r} is the trace itself: writing it would overwrite the trace")
    data, source = _trace_bytes(trace)
    html = _cudamem._report_viz(data, source, title, policy, config)
    with open(path, "w", encoding="utf-8") as f:
        f.write(html)
    return path
