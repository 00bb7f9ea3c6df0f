// 1M malloc+free pairs through the native table (profiling off and on) and the pluggable C path (scripts/dev/native_table_ab.py runs it).
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <cstdio>
#include "cudamem_abi.h"
using namespace cudamem_abi;
typedef void *(*MallocFn)(size_t, int, void *);
typedef void (*FreeFn)(void *, size_t, int, void *);
extern "C" void bench(NativeApiFn api_fn, MallocFn m, FreeFn f, long n, double *out) {
  const NativeApi *api = api_fn();
  for (int prof = 0; prof < 2; prof++) {
    uint64_t info[4];
    for (long i = 0; i < 1000; i++) { info[0] = prof; void *p = api->malloc(0, 1 << 20, nullptr, -1, info); info[0] = prof; api->free(p, info); }
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; i++) {
      info[0] = prof; void *p = api->malloc(0, 1 << 20, nullptr, -1, info);
      info[0] = prof; api->free(p, info);
    }
    auto t1 = std::chrono::steady_clock::now();
    out[prof] = std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
  }
  auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < n; i++) { void *p = m(1 << 20, 0, nullptr); f(p, 1 << 20, 0, nullptr); }
  auto t1 = std::chrono::steady_clock::now();
  out[2] = std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
}
