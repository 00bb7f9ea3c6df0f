"""Tags, sleep and wake: give the GPU memory of tagged tensors back and bring it back at the
same addresses (for jobs that hand a GPU back and forth between, e.g., inference and training).

::

    with cudamem.tag("weights"):
        model = build_model().cuda()        # every allocation inside comes from "weights"
    cudamem.sleep(["weights"], offload=True)  # bytes to host memory, pages back to the driver
    ...                                       # the memory is free for other work
    cudamem.wake_up(["weights"])             # same addresses, same bytes

Rules (the engine's, see ``docs/design/sleep-wake.md``): a tag is an allocator's, not a
thread's — while a tag is current every allocation on that device goes to it. Sleep waits for
the device. Allocating from a sleeping tag is an error naming it; freeing a sleeping tensor is
allowed (its bytes are lost); sleeping an asleep tag, waking an awake one and naming an unknown
tag are errors. A wake that runs out of memory raises the out-of-memory error and leaves every
tag asleep with its host copies intact. No call may come while a CUDA graph is being captured.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, List, Optional

from cudamem import _cudamem


def _names(tags: Optional[Iterable[str]]) -> List[str]:
    if tags is None:
        return []
    if isinstance(tags, str):
        return [tags]
    names = list(tags)
    for t in names:
        if not isinstance(t, str):
            raise TypeError(f"tags must be strings, got {t!r}")
    return names


def _device_or_all(device: Any) -> Optional[int]:
    import cudamem

    return None if device is None else cudamem._device_index(device)


@contextlib.contextmanager
def tag(name: str, device: Any = None) -> Iterator[None]:
    """Makes ``name`` the current tag inside the block: every allocation made there (on
    ``device``, or on every device when None) comes from the tag's own memory, which
    :func:`sleep` can release. The tag current before is current again afterwards."""
    import cudamem

    if not isinstance(name, str) or not name:
        raise ValueError(f"a tag is a non-empty string, got {name!r}")
    d = _device_or_all(device)
    if d is None:
        # The current device's allocator first (created if needed), then every other one.
        before = _cudamem._set_tag(name, cudamem._current_device())
        _cudamem._set_tag(name, None)
    else:
        before = _cudamem._set_tag(name, d)
    try:
        yield
    finally:
        _cudamem._set_tag(before, d)


def sleep(tags: Optional[Iterable[str]] = None, offload: bool = True, device: Any = None) -> None:
    """Gives the device memory of ``tags`` (every awake tag when None) back to the driver,
    keeping their addresses. With ``offload`` the bytes are copied to host memory first and come
    back with :func:`wake_up`; without, they are discarded."""
    _cudamem._sleep(_names(tags), bool(offload), _device_or_all(device))


def wake_up(tags: Optional[Iterable[str]] = None, device: Any = None) -> None:
    """Maps memory for ``tags`` (every sleeping tag when None) at their old addresses and
    restores offloaded bytes. Raises the out-of-memory error, and changes nothing, when the
    device cannot give the memory."""
    _cudamem._wake(_names(tags), _device_or_all(device))


def sleep_stats(device: Any = None) -> dict:
    """The sleep counters (``sleeping_bytes``, ``offloaded_bytes``, ``num_sleeps``, ...) and each
    tag's state (``tags``: name -> ``asleep``, ``allocated_bytes``, ``reserved_bytes``, ...)."""
    import cudamem

    return _cudamem._sleep_stats(cudamem._device_index(device))
