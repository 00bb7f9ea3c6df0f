// The function table between the native torch allocator class (native_allocator.cpp) and the
// Rust engine (python/src/native.rs): field for field the Rust struct `native::NativeApi`,
// checked by version and size when the class is installed. Included by native_allocator.cpp
// only (one translation unit).

#pragma once

#include <cstddef>
#include <cstdint>

constexpr uint32_t kApiVersion = 9;  // native::NATIVE_API_VERSION
constexpr size_t kStatsLen = 122;    // native::STATS_LEN
constexpr int kErrOutOfMemory = 1;   // ffi::ERR_OOM
constexpr int kShimVersion = 1;      // cudamem.torch.NATIVE_SHIM_VERSION

using PtrSink = void (*)(void*, uint64_t, uint64_t);

// native::SegmentRecord and native::BlockRecord.
struct SegmentRecord {
  int device, is_large, is_expandable;
  uint64_t address, total_size, requested_size, allocated_size, active_size, stream, pool_a, pool_b;
};
struct BlockRecord {
  uint64_t size, requested_size;
  int allocated, active;
};
using SegmentSink = void (*)(void*, const SegmentRecord*);
using BlockSink = void (*)(void*, const BlockRecord*);
using ByteSink = void (*)(void*, const uint8_t*, size_t);
// (ctx, device, c10 TraceEntry::Action, addr, size, stream): trackers::TraceHook.
using TraceHook = void (*)(void*, int, int, uint64_t, uint64_t, uint64_t);
// A MemPool's allocator (pool_allocator::AllocFn, FreeFn, DropFn).
using PoolAllocFn = void* (*)(void*, size_t, int);
using PoolFreeFn = void (*)(void*, void*, size_t, int);
using PoolDropFn = void (*)(void*);

// Field for field the Rust struct `native::NativeApi`.
struct NativeApi {
  uint32_t version;
  uint32_t size;
  void* (*malloc)(int, size_t, void*, int, uint64_t*);
  int (*free)(void*, uint64_t*);
  int (*record_stream)(void*, void*);
  int (*empty_cache)(uint64_t, uint64_t);
  int (*stats)(int, int64_t*, size_t);
  void (*reset_peak)(int);
  void (*reset_accumulated)(int);
  int (*set_fraction)(int, double);
  double (*get_fraction)(int);
  uint64_t (*largest_free)(int);
  void* (*base_allocation)(void*, uint64_t*);
  int (*pool_create)(int, uint64_t, uint64_t);
  int (*pool_begin)(int, uint64_t, uint64_t, int*);
  int (*pool_end)(int, uint64_t, uint64_t);
  int (*pool_release)(int, uint64_t, uint64_t);
  int (*pool_use_count)(int, uint64_t, uint64_t);
  int (*pool_check_live)(int, uint64_t, uint64_t, const uint64_t*, size_t);
  int (*pool_set_use_on_oom)(int, uint64_t, uint64_t, int);
  void* (*checkpoint_get)(int, uint64_t, uint64_t);
  void (*checkpoint_free)(void*);
  int (*checkpoint_restore)(int, const void*, void*, PtrSink, PtrSink);
  int (*set_settings)(const char*);
  void (*totals)(int, uint64_t*);
  int (*record_history)(int, int, uint64_t, int);
  int (*history_enabled)();
  int (*snapshot)(void*, SegmentSink, BlockSink);
  int (*ipc_share)(void*, void*, ByteSink, uint64_t*);
  int (*ipc_open)(int, const uint8_t*, size_t, uint64_t*, int*);
  int (*ipc_close)(int, uint64_t, int);
  int (*set_trace_hook)(void*, TraceHook);
  int (*pool_create_with)(int, uint64_t, uint64_t, void*, PoolAllocFn, PoolFreeFn, PoolDropFn);
  int (*deferred_streams)(void*, uint64_t*, size_t);
  int (*release_deferred)(void*);
  int (*pool_set_no_split)(int, uint64_t, uint64_t);
};
