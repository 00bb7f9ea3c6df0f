// Calls the native class's function table (python/src/native.rs) through the header the class
// includes (cudamem_abi.h, generated from python/src/abi.rs), as the class does, so that the
// Python tests can check the table's malloc and free without torch or a GPU.
#include "cudamem_abi.h"

using cudamem_abi::NativeApi;

// 0 when the table is the one this header declares (version and size), else 1.
extern "C" int table_matches(const void* api) {
  auto* a = static_cast<const NativeApi*>(api);
  return a->version == cudamem_abi::NATIVE_API_VERSION && a->size == sizeof(NativeApi) ? 0 : 1;
}

// The class's malloc: `info` gets the block size, allocated and reserved bytes (asked for with
// `profiling`, as the class does while the profiler records memory).
extern "C" void* table_malloc(const void* api, int device, size_t size, int profiling, uint64_t* info) {
  info[0] = profiling != 0 ? 1 : 0;
  return static_cast<const NativeApi*>(api)->malloc(device, size, nullptr, -1, info);
}

// The class's free: `info` gets the block size, allocated and reserved bytes, then the device.
extern "C" int table_free(const void* api, void* ptr, int profiling, uint64_t* info) {
  info[0] = profiling != 0 ? 1 : 0;
  return static_cast<const NativeApi*>(api)->free(ptr, info);
}

extern "C" int table_err_oom() { return cudamem_abi::ERR_OOM; }
extern "C" int table_err_invalid() { return cudamem_abi::ERR_INVALID; }
