// The native torch allocator class's link to the Rust engine: the function table (set once, at
// install), the Rust side's last error turned into torch's exceptions (c10::OutOfMemoryError for
// out of memory, c10::Error otherwise), and the engine objects torch owns (a private pool's
// checkpoint).
//
// Included by native_allocator.cpp only (one translation unit), after c10's CUDA headers.

#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "cudamem_abi.h"

namespace cudamem_engine {

namespace CCA = c10::cuda::CUDACachingAllocator;

// The Rust side's function table and its last-error function (set once, at install).
inline const cudamem_abi::NativeApi* g_api = nullptr;
inline cudamem_abi::LastErrorFn g_last_error = nullptr;

// The calling thread's last error on the Rust side (its kind in `kind`, when not null).
inline std::string last_error_message(int* kind) {
  char buf[8192];
  buf[0] = '\0';
  int k = g_last_error != nullptr ? g_last_error(buf, sizeof buf) : 0;
  if (kind != nullptr) {
    *kind = k;
  }
  return buf[0] != '\0' ? std::string(buf) : std::string("cudamem: the call failed");
}

// Throws the Rust side's last error unless `kind` is 0.
inline void check(int kind) {
  if (kind == 0) {
    return;
  }
  std::string msg = last_error_message(nullptr);
  if (kind == cudamem_abi::ERR_OOM) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
  }
  TORCH_CHECK(false, msg);
}

inline c10::Device cuda_device(int device) {
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
}

// A private pool's checkpoint (torch.compile's CUDA-graph trees): owns the Rust object.
struct PoolState : CCA::AllocatorState {
  explicit PoolState(void* h, int d) : handle(h), device(d) {}
  ~PoolState() override { g_api->checkpoint_free(handle); }
  void* handle;
  int device;
};

// `s` into `buf` (at most `len - 1` bytes, then NUL).
inline void write_message(const std::string& s, char* buf, size_t len) {
  if (buf == nullptr || len == 0) {
    return;
  }
  size_t n = s.size() < len - 1 ? s.size() : len - 1;
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

}  // namespace cudamem_engine
