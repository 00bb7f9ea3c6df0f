// CUDA tensors between processes (torch.multiprocessing) for the native torch allocator class:
// shareIpcHandle and getIpcDevPtr. The bytes of a handle are PyTorch's (see python/src/ipc.rs),
// so a tensor of whole-segment memory passes between cudamem and torch's own allocator in
// either direction; Rust makes and reads them and does the driver calls.
//
// Rules kept here, as torch's allocator keeps them:
// * One mapping per handle per process: CUDA opens an IPC handle once per context, and several
//   storages may arrive from one sender's segment. getIpcDevPtr caches what it opened by the
//   handle's bytes and hands out the same shared_ptr while any user holds it.
// * The last user's release closes it (unmaps imported memory after waiting for the device),
//   outside the cache's lock. A release cannot throw: a failure is printed.
//
// Included by native_allocator.cpp only (one translation unit), after c10's allocator header.

#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cudamem_abi.h"

namespace cudamem_ipc {

namespace CCA = c10::cuda::CUDACachingAllocator;

// `check` throws the Rust side's last error for a nonzero kind.
using Check = void (*)(int);

inline void append_bytes(void* ctx, const uint8_t* bytes, size_t len) {
  static_cast<std::string*>(ctx)->append(reinterpret_cast<const char*>(bytes), len);
}

// shareIpcHandle: the handle bytes of allocation `ptr` and its offset in what they describe.
inline CCA::ShareableHandle share(const cudamem_abi::NativeApi* api, Check check, void* ptr) {
  std::string bytes;
  uint64_t offset = 0;
  check(api->ipc_share(ptr, &bytes, &append_bytes, &offset));
  return CCA::ShareableHandle{static_cast<ptrdiff_t>(offset), std::move(bytes)};
}

class Opened {
 public:
  // getIpcDevPtr on `device` (the current one, as torch's allocator uses).
  std::shared_ptr<void> get(const cudamem_abi::NativeApi* api, Check check, const std::string& handle, int device) {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = open_.find(handle);
    if (it != open_.end()) {
      if (auto live = it->second.lock()) {
        return live;
      }
      open_.erase(it);  // its last user is gone and its release is under way
    }
    uint64_t ptr = 0;
    int kind = 0;
    check(api->ipc_open(device, reinterpret_cast<const uint8_t*>(handle.data()), handle.size(), &ptr, &kind));
    std::shared_ptr<void> sp(reinterpret_cast<void*>(ptr), [this, api, handle, device, kind](void* p) {
      {
        std::lock_guard<std::mutex> g(mutex_);
        auto e = open_.find(handle);
        if (e != open_.end() && e->second.expired()) {
          open_.erase(e);
        }
      }
      if (api->ipc_close(device, reinterpret_cast<uint64_t>(p), kind) != 0) {
        std::fprintf(stderr, "cudamem: closing memory received from another process failed\n");
      }
    });
    open_[handle] = sp;
    return sp;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<void>> open_;
};

}  // namespace cudamem_ipc
