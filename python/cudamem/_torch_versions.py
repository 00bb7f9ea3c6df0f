"""The torch releases cudamem's native allocator class supports, and what it does on others.

The class (``_shim/native_allocator.cpp``) implements c10's ``CUDAAllocator``, whose interface
changes between torch releases; ``_shim/native_versions.h`` adapts it at compile time to each
release from :data:`OLDEST` to :data:`NEWEST` (by ``torch/version.h``). Every release in
:data:`RELEASES` is compiled against by the compile matrix (``scripts/torch_matrix.py``).

Rules:

* A torch older than :data:`OLDEST` is refused before anything is compiled: its interface is
  not one the class knows.
* A torch newer than :data:`NEWEST` is tried (its interface may not have changed); if the class
  does not compile, :func:`cudamem.torch.install` refuses with the compiler's output and this
  module's range. Nothing falls back silently.
* The C++ standard is the one the release's headers require: C++17 up to 2.13, C++20 from 2.14.

This module imports nothing of cudamem's, so scripts can load it by path.
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

# Every torch release the class is compiled against (the compile matrix's rows).
RELEASES = ("2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0")

# The oldest and newest minor releases supported (inclusive).
OLDEST = (2, 9)
NEWEST = (2, 15)

# The releases the GPU checks (scripts/gpu/torch/native.sh, PyTorch's tests) run on.
GPU_TESTED = ("2.11",)

# From this release on, torch's headers require C++20.
CXX20_FROM = (2, 14)


def parse(version: str) -> Tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``"2.15.0+cu130"`` or ``"2.16.0a0"``.
    Raises ``ValueError`` for a string that is not one."""
    m = re.match(r"^\s*(\d+)\.(\d+)", str(version))
    if m is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def supported_range() -> str:
    return f"torch {OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"


def refusal(version: str) -> Optional[str]:
    """Why the class cannot be built for this torch, or None when it is to be compiled."""
    v = parse(version)
    if v < OLDEST:
        return (f"torch {version} is older than cudamem's native allocator supports "
                f"({supported_range()}): install a supported torch")  # fmt: skip
    return None


def is_newer_than_supported(version: str) -> bool:
    return parse(version) > NEWEST


def cxx_standard(version: str) -> str:
    """The ``-std=`` value for compiling against this torch's headers."""
    return "c++20" if parse(version) >= CXX20_FROM else "c++17"
