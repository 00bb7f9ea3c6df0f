from . import graphs, memory
from .graphs import CUDAGraph, graph  # noqa: F401
from .memory import MemPool  # noqa: F401
from .memory import memory_allocated, memory_snapshot, memory_stats, memory_summary  # noqa: F401

_initialized = False


def is_initialized():
    return _initialized


def current_device():
    return 0


def init():
    global _initialized
    _initialized = True
