"""CUDA streams and events for the GPU-free recorder (:mod:`cudamem._estimate_torch`).

Without a GPU, ``torch.cuda.Stream()``, ``torch.cuda.stream(s)``, ``current_stream()``,
``Event`` and ``Tensor.record_stream`` fail; the recorder swaps them for stand-ins that only keep
track of which stream is current. What matters for memory is kept: PyTorch's allocator gives
each stream its own pool (a block freed on one stream is reused only by that stream), so every
allocation is recorded with the stream current when it was made, and the cuBLAS and cuBLASLt
workspaces are per stream. What is not: no kernel runs, so waits, events and
``record_stream`` order nothing, and a block freed while another stream still uses it is free at
once (on the GPU it waits for that stream's work, usually a few kernels). Guarantees: the
stand-ins accept what torch's accept and raise ``TypeError`` for a stream argument that is not
one of theirs; every patch is undone with the recorder's others.
"""

from __future__ import annotations

import itertools
from typing import Any, List, Optional, Tuple

import torch

# Stream numbers as they appear in the trace: 0 is the default stream.
_numbers = itertools.count(1)


class Stream:
    """A stream stand-in: a number, and the methods scripts call on streams."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.number = next(_numbers)
        self.priority = priority

    def wait_stream(self, stream: "Stream") -> None:
        _check(stream)

    def wait_event(self, event: "Event") -> None:
        pass

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        return event if event is not None else Event()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.number == self.number

    def __hash__(self) -> int:
        return hash(("cudamem-stream", self.number))

    def __repr__(self) -> str:
        return f"<cudamem.estimate stream {self.number}>"


class Event:
    """An event stand-in: nothing to wait for."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        pass

    def record(self, stream: Optional[Stream] = None) -> None:
        pass

    def wait(self, stream: Optional[Stream] = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "Event") -> float:
        return 0.0


_DEFAULT = Stream.__new__(Stream)
_DEFAULT.number, _DEFAULT.priority = 0, 0


def _check(stream: Any) -> "Stream":
    if not isinstance(stream, Stream):
        raise TypeError(f"expected a stream made under the recorder (torch.cuda.Stream()), got {type(stream).__name__}")
    return stream


def patches(rec: Any) -> List[Tuple[Any, str, Any]]:
    """(object, attribute, stand-in) for every stream API the recorder replaces; ``rec.stream``
    is the current stream's number."""

    class _Context:
        def __init__(self, stream: Optional[Stream]) -> None:
            self.stream = None if stream is None else _check(stream)

        def __enter__(self) -> Optional[Stream]:
            self.prev = rec.stream
            if self.stream is not None:
                rec.stream = self.stream.number
            return self.stream

        def __exit__(self, *exc: Any) -> bool:
            rec.stream = self.prev
            return False

    known = {0: _DEFAULT}

    class RecordedStream(Stream):  # a class, as torch.cuda.Stream is (annotations, isinstance)
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            known[self.number] = self

    def current(device: Any = None) -> Stream:
        return known.get(rec.stream, _DEFAULT)

    def set_stream(stream: Stream) -> None:
        rec.stream = _check(stream).number

    return [(torch.cuda, "Stream", RecordedStream), (torch.cuda, "Event", Event),
            (torch.cuda, "stream", lambda stream=None: _Context(stream)),
            (torch.cuda, "current_stream", current), (torch.cuda, "default_stream", lambda device=None: _DEFAULT),
            (torch.cuda, "set_stream", set_stream),
            (torch.Tensor, "record_stream", lambda self, stream: _check(stream) and None)]
