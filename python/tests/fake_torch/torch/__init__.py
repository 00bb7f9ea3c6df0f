"""A stand-in for the parts of torch that cudamem.torch.install() touches (CI has no torch).

It behaves like torch 2.x where it matters to cudamem: CUDAPluggableAllocator loads the two
functions with ctypes and exposes the hook setters; change_current_allocator refuses once CUDA
is initialised; the stats functions raise as with any pluggable allocator. Its lib/libc10.so
(built by the test from libc10.cpp) exports c10::detail::torchCheckFail.
"""

from . import cuda, utils  # noqa: F401

__version__ = "0.0.0+fake"


class OutOfMemoryError(RuntimeError):
    pass


class _C:
    _GLIBCXX_USE_CXX11_ABI = True
