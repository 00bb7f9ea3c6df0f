import ctypes

current = None


class _PluggableHooks:
    def __init__(self, alloc, free):
        self.alloc, self.free = alloc, free
        self.reset = self.fraction = self.record = self.begin_pool = None

    def set_reset_fn(self, addr):
        self.reset = addr

    def set_memory_fraction_fn(self, addr):
        self.fraction = addr

    def set_record_stream_fn(self, addr):
        self.record = addr

    def set_begin_allocate_to_pool(self, addr):
        self.begin_pool = addr


class CUDAPluggableAllocator:
    def __init__(self, path_to_so_file, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path_to_so_file)
        alloc = ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value
        free = ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value
        self.path = path_to_so_file
        self._allocator = _PluggableHooks(alloc, free)

    def allocator(self):
        return self._allocator


class MemPool:
    def __init__(self, allocator=None):
        self.allocator = allocator


def change_current_allocator(allocator):
    global current
    from torch import cuda

    if cuda._initialized:
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator


def _unsupported(*args, **kwargs):
    raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats.")


memory_allocated = memory_stats = memory_summary = max_memory_allocated = _unsupported
_record_memory_history = _snapshot = _dump_snapshot = memory_snapshot = _unsupported
