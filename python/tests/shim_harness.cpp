// Calls cudamem's torch shim the way PyTorch does and reports what it threw, so that the
// Python tests can check the shim's out-of-memory path without torch (built against
// fake_c10/). Result: 0 success, 1 c10::OutOfMemoryError, 2 other c10::Error, 3 other.
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <utility>

typedef struct CUstream_st* cudaStream_t;
using MallocFn = void* (*)(size_t, int, cudaStream_t);

namespace {

// Runs `call` as torch would and reports what it threw (see the top of this file), its message
// in `msg`.
template <typename F>
int catching(F call, char* msg, size_t len) {
  msg[0] = '\0';
  auto keep = [&](const std::exception& e) {
    std::strncpy(msg, e.what(), len - 1);
    msg[len - 1] = '\0';
  };
  try {
    call();
    return 0;
  } catch (const c10::OutOfMemoryError& e) {
    keep(e);
    return 1;
  } catch (const c10::Error& e) {
    keep(e);
    return 2;
  } catch (...) {
    return 3;
  }
}

}  // namespace

extern "C" int harness_malloc(void* fn, size_t size, int device, void** out, char* msg, size_t len) {
  MallocFn f = reinterpret_cast<MallocFn>(fn);
  return catching([&] { *out = f(size, device, nullptr); }, msg, len);
}

// Calls a pluggable allocator's begin_allocate_to_pool hook as torch's beginAllocateToPool does.
using BeginPoolFn = void (*)(int, std::pair<unsigned long long, unsigned long long>, std::function<bool(cudaStream_t)>);

extern "C" int harness_begin_pool(void* fn, char* msg, size_t len) {
  BeginPoolFn f = reinterpret_cast<BeginPoolFn>(fn);
  return catching([&] { f(0, {1, 0}, [](cudaStream_t) { return true; }); }, msg, len);
}
