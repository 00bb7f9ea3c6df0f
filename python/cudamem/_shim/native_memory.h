// Memory the native torch allocator class gets outside the engine's own device: straight from
// cudaMalloc while caching is disabled, and a MemPool's segments from the pool's own allocator.
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

}  // namespace cudamem_memory
