// cudamem's shim between PyTorch's CUDAPluggableAllocator and the Rust allocator.
//
// Why it exists: PyTorch calls the pluggable allocator's alloc function from C++ and trusts
// whatever it returns; a NULL becomes a tensor on a null pointer. PyTorch's own allocator
// reports out-of-memory by throwing c10::OutOfMemoryError, which the Python bindings turn into
// torch.OutOfMemoryError. A Rust function cannot throw a C++ exception, so this file does it:
//
//   cudamem_torch_malloc(size, device, stream)
//     -> cudamem_malloc_or_error(size, device, stream, msg, sizeof msg)     (Rust; never throws)
//     -> NULL with size > 0: throw c10::OutOfMemoryError(msg)  (kind 1: out of memory)
//                            throw c10::Error(msg)             (any other failure)
//   cudamem_torch_free(...) -> cudamem_free(...)                             (Rust)
//
// And one hook more: cudamem_torch_refuse_pool, the pluggable allocator's beginAllocateToPool,
// throws (see cudamem/_torch_guard.py): without the native class nothing can keep a CUDA graph's
// memory in its private pool, and a capture that ran anyway would compute wrong results.
//
// The Rust functions are not linked: cudamem.torch.install() passes their addresses (read
// with ctypes from the loaded extension module) to cudamem_torch_shim_init before the
// allocator is used. Only c10/util/Exception.h and libc10 are needed from PyTorch.
//
// Built by cudamem.torch.build_shim():
//   g++ -O2 -shared -fPIC -std=c++17 -D_GLIBCXX_USE_CXX11_ABI=<torch's> -I<torch includes>
//       torch_shim.cpp -o torch_shim.so -L<torch/lib> -lc10 -Wl,-rpath,<torch/lib>

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "cudamem_abi.h"  // the Rust functions' types and error kinds (generated)

// Identical to CUDA's own typedef, so that including cuda_runtime.h as well stays valid.
typedef struct CUstream_st* cudaStream_t;

// c10's MempoolId_t (a pair of c10::CaptureId_t, unsigned long long in every release).
using MempoolId = std::pair<unsigned long long, unsigned long long>;

namespace {

// Set once by cudamem_torch_shim_init, before PyTorch can call the functions below.
cudamem_abi::MallocOrErrorFn g_malloc_or_error = nullptr;
cudamem_abi::PluggableFreeFn g_free = nullptr;
cudamem_abi::LastErrorKindFn g_last_error_kind = nullptr;

constexpr int kShimAbiVersion = 1;  // cudamem.torch.SHIM_ABI_VERSION
constexpr size_t kMessageCapacity = 8192;

}  // namespace

extern "C" {

// Returns the shim's interface version, which cudamem.torch checks.
int cudamem_torch_shim_init(void* malloc_or_error, void* free_fn, void* last_error_kind) {
  g_malloc_or_error = reinterpret_cast<cudamem_abi::MallocOrErrorFn>(malloc_or_error);
  g_free = reinterpret_cast<cudamem_abi::PluggableFreeFn>(free_fn);
  g_last_error_kind = reinterpret_cast<cudamem_abi::LastErrorKindFn>(last_error_kind);
  return kShimAbiVersion;
}

// PyTorch's alloc function: void* alloc(size_t size, int device, cudaStream_t stream).
void* cudamem_torch_malloc(size_t size, int device, cudaStream_t stream) {
  TORCH_CHECK(
      g_malloc_or_error != nullptr,
      "cudamem: the torch shim is not initialised (use cudamem.torch.install())");
  char message[kMessageCapacity];
  message[0] = '\0';
  void* ptr = g_malloc_or_error(size, device, stream, message, sizeof message);
  if (ptr == nullptr && size > 0) {
    const std::string text(message[0] != '\0' ? message : "cudamem: allocation failed");
    const int kind = g_last_error_kind != nullptr ? g_last_error_kind() : cudamem_abi::ERR_OOM;
    if (kind == cudamem_abi::ERR_OOM) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, text);
    }
    TORCH_CHECK(false, text);
  }
  return ptr;
}

// The pluggable allocator's begin_allocate_to_pool hook:
// void(int device, MempoolId_t, std::function<bool(cudaStream_t)> filter). Always throws.
void cudamem_torch_refuse_pool(int, MempoolId, std::function<bool(cudaStream_t)>) {
  TORCH_CHECK(
      false,
      "cudamem: CUDA graph capture and private memory pools (torch.cuda.graph, torch.cuda.MemPool, "
      "torch.compile's CUDA graphs) are not available on cudamem's pluggable path: torch's pluggable "
      "allocator interface cannot keep a graph's memory in its private pool, so the graph would compute "
      "wrong results. Use cudamem's native allocator class (cudamem.torch.install() without "
      "native=False), or run this process without cudamem.torch.install().");
}

// PyTorch's free function: void free(void* ptr, size_t size, int device, cudaStream_t stream).
void cudamem_torch_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  if (g_free != nullptr) {
    g_free(ptr, size, device, stream);
  }
}

}  // extern "C"
