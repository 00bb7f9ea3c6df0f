// Out of memory on the native torch allocator class, as torch's allocator reports it: to the
// profiler (c10::reportOutOfMemoryToProfiler), then to the OOM observers that
// attachOutOfMemoryObserver registered (device, allocated bytes, device total, device free), all
// before the exception is thrown and outside cudamem's lock.
//
// Included by native_allocator.cpp only (one translation unit), after c10's CUDA headers.

#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "cudamem_abi.h"

namespace cudamem_oom {

namespace CCA = c10::cuda::CUDACachingAllocator;

class Observers {
 public:
  void add(CCA::OutOfMemoryObserver observer) {
    std::lock_guard<std::mutex> g(mutex_);
    observers_.push_back(std::move(observer));
  }

  // An allocation of `size` bytes on `device` failed for want of memory.
  void report(const cudamem_abi::NativeApi* api, int device, size_t size) {
    uint64_t t[2] = {0, 0};
    api->totals(device, t);
    const c10::Device where(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), t[0], t[1], where);
    std::vector<CCA::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> g(mutex_);
      observers = observers_;
    }
    if (observers.empty()) {
      return;
    }
    size_t free_bytes = 0, total = 0;
    {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
      if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
      }
    }
    for (auto& o : observers) {
      o(device, static_cast<size_t>(t[0]), total, free_bytes);
    }
  }

 private:
  std::mutex mutex_;
  std::vector<CCA::OutOfMemoryObserver> observers_;
};

}  // namespace cudamem_oom
