"""A stand-in for the parts of torch that cudamem.torch.install() touches (CI has no torch).

It behaves like torch 2.x where it matters to cudamem: CUDAPluggableAllocator loads the two
functions with ctypes and exposes the hook setters; change_current_allocator refuses once CUDA
is initialised; the stats functions raise as with any pluggable allocator. Its lib/libc10.so
(built by the test from libc10.cpp) exports c10::detail::torchCheckFail.
"""

from . import cuda, utils  # noqa: F401

import os

# The version a test pretends (the native class's version checks read it).
__version__ = os.environ.get("FAKE_TORCH_VERSION", "2.11.0+fake")

compiled = []  # what torch.compile was called with


def compile(model=None, **kwargs):
    compiled.append(kwargs)
    return model


class OutOfMemoryError(RuntimeError):
    pass


class _C:
    _GLIBCXX_USE_CXX11_ABI = True
