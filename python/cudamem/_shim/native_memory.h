// Memory the native torch allocator class gets outside the engine's own device: straight from
// cudaMalloc while caching is disabled, and a MemPool's segments from the pool's own allocator;
// the CUDA runtime state that torch's own cudaMalloc calls would have set up; copies between
// devices.
// Included by native_allocator.cpp only (one translation unit), after c10's CUDA headers.

#pragma once

#include <cstdio>
#include <memory>

namespace cudamem_memory {

namespace CCA = c10::cuda::CUDACachingAllocator;

// With caching disabled (torch.cuda.caching_allocator_enable(False)) memory comes straight from
// cudaMalloc and goes back with cudaFree, outside cudamem's pools and statistics, as with
// torch's allocator.
inline void* uncached_alloc(size_t size) {
  void* p = nullptr;
  C10_CUDA_CHECK(cudaMalloc(&p, size));
  return p;
}

inline void uncached_free(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "cudamem: cudaFree of uncached memory failed: %s\n", cudaGetErrorString(err));
  }
}

// A MemPool's own allocator, called by the engine for the pool's segments (under its lock, as
// torch calls it under its own). Nothing may unwind into the engine: a failure is out of memory.
inline void* pool_alloc(void* ctx, size_t size, int device) {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    return (*static_cast<std::shared_ptr<CCA::CUDAAllocator>*>(ctx))->raw_alloc(size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cudamem: a MemPool's allocator failed: %s\n", e.what());
    return nullptr;
  }
}

inline void pool_free(void* ctx, void* ptr, size_t, int device) {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    (*static_cast<std::shared_ptr<CCA::CUDAAllocator>*>(ctx))->raw_delete(ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cudamem: a MemPool's allocator failed to free: %s\n", e.what());
  }
}

inline void pool_drop(void* ctx) { delete static_cast<std::shared_ptr<CCA::CUDAAllocator>*>(ctx); }

// enablePeerAccess: as torch's, access already enabled is no error.
inline void enable_peer_access(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  c10::cuda::CUDAGuard guard(dev);
  cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
  } else {
    C10_CUDA_CHECK(err);
  }
}

// memcpyAsync: cudamem maps most memory with the VMM API, so across devices without peer access
// only the peer copy is correct for it.
inline cudaError_t copy_async(void* dst, int dst_device, const void* src, int src_device, size_t count,
                              cudaStream_t stream, bool p2p_enabled) {
  if (p2p_enabled || dst_device == src_device) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
}

// Torch's allocator makes segments with cudaMalloc, whose first call on a thread binds the
// current device's primary context to that thread; cudamem's engine calls the driver and
// leaves the thread's context as it found it. Without the binding, each device guard torch
// runs on that thread (one per torch.cuda.caching_allocator_alloc) takes the runtime's slow
// path until some other runtime call binds it. So bind it once per thread, as cudaMalloc
// would: cudaFree(nullptr) does only that. Never while a capture is underway (the call is
// one a capture in the default mode forbids); a later allocation binds it.
inline void bind_runtime_context(bool capturing) {
  static thread_local bool bound = false;
  if (bound || capturing) {
    return;
  }
  if (cudaFree(nullptr) != cudaSuccess) {
    (void)cudaGetLastError();  // the engine's own call reports a device that does not work
  }
  bound = true;
}

}  // namespace cudamem_memory
