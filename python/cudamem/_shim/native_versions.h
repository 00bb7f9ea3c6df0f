// The torch releases' allocator interfaces, adapted to one: every difference between the
// c10::cuda::CUDACachingAllocator::CUDAAllocator of torch 2.9 through 2.15 lives in this file, so
// that native_allocator.cpp and its other headers are written once.
//
// How: `Adapter` derives from the CUDAAllocator of the torch being compiled against (its version
// from torch/version.h) and overrides each virtual whose signature differs between releases, or
// that exists only in some, by forwarding to one version-neutral hook that the class implements.
// A virtual that a release lacks is simply not overridden there. The names that moved between
// namespaces (2.11 moved the history types to c10::CachingDeviceAllocator) and the stream type of
// history records (cudaStream_t before 2.11, void* since) are aliased below.
//
// Rules:
// * A release older than OLDEST is refused at compile time with a message naming the supported
//   range (cudamem/_torch_versions.py checks it before compiling, too).
// * A release newer than the newest named here compiles against the newest branch of every
//   #if: if its interface changed, the compile fails and install() says so; nothing guesses.
// * Defaults of the base class that would silently do the wrong thing for cudamem are
//   overridden (user metadata is recorded, so supportsUserMetadata() is true).
//
// Included by native_allocator.cpp only (one translation unit), after c10's allocator header.

#pragma once

#include <torch/version.h>

#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#define CUDAMEM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if !CUDAMEM_TORCH_AT_LEAST(2, 9)
#error "cudamem's native torch allocator supports torch 2.9 and newer"
#endif

namespace cudamem_versions {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;

#if CUDAMEM_TORCH_AT_LEAST(2, 11)
using AnnotationEntry = c10::CachingDeviceAllocator::AnnotationEntry;
#else
using AnnotationEntry = CCA::AnnotationEntry;
#endif

// The type of TraceEntry::stream_ and SegmentInfo::stream (cudaStream_t, then void*).
using RecordStream = decltype(CCA::TraceEntry::stream_);

inline RecordStream record_stream(uint64_t stream) { return reinterpret_cast<RecordStream>(stream); }

// Whether torch's history records user metadata (torch 2.10 on).
constexpr bool kUserMetadata = CUDAMEM_TORCH_AT_LEAST(2, 10);
// Whether torch has the ANNOTATE trace action, for annotateMemory (torch 2.14 on).
constexpr bool kAnnotateMemory = CUDAMEM_TORCH_AT_LEAST(2, 14);

// A TraceEntry with the arguments this release's constructor takes.
inline CCA::TraceEntry trace_entry(
    CCA::TraceEntry::Action action,
    int device,
    uint64_t addr,
    uint64_t size,
    uint64_t stream,
    c10::approx_time_t time,
    std::shared_ptr<c10::GatheredContext> ctx,
    std::string compile_context = "",
    const std::string& user_metadata = "") {
#if CUDAMEM_TORCH_AT_LEAST(2, 10)
  return CCA::TraceEntry(
      action, static_cast<c10::DeviceIndex>(device), addr, size, record_stream(stream), MempoolId_t{0, 0}, time,
      std::move(ctx), std::move(compile_context), user_metadata);
#else
  (void)user_metadata;
  return CCA::TraceEntry(
      action, static_cast<c10::DeviceIndex>(device), addr, size, record_stream(stream), MempoolId_t{0, 0}, time,
      std::move(ctx), std::move(compile_context));
#endif
}

// Parses recordHistory's skip_actions (torch 2.11 on; older releases have none).
template <typename Set>
void parse_skip_actions(const std::vector<std::string>& names, Set& out) {
#if CUDAMEM_TORCH_AT_LEAST(2, 11)
  for (const auto& a : names) {
    out.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(a));  // throws on an unknown name
  }
#else
  (void)names;
  (void)out;
#endif
}

// The snapshot's settings that only some releases have, at torch's defaults: the pinned (host)
// allocator's max_round_threshold and max_cached_size (torch 2.13 on), which cudamem does not
// manage. Their structs have no initialisers, so an unset field would be read uninitialised.
inline void fill_release_settings(CCA::AllocatorConfigInfo& md) {
#if CUDAMEM_TORCH_AT_LEAST(2, 13)
  md.max_round_threshold = std::numeric_limits<size_t>::max();
  md.max_cached_size = std::numeric_limits<size_t>::max();
#else
  (void)md;
#endif
}

class Adapter : public CCA::CUDAAllocator {
 protected:
  // The version-neutral hooks the class implements.
  virtual CCA::SnapshotInfo take_snapshot(MempoolId_t mempool_id, bool include_traces) = 0;
  // `allocator`: the MemPool's own allocator, or null. Holds a reference while the pool needs it.
  virtual void create_or_incref_pool(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      std::shared_ptr<CCA::CUDAAllocator> allocator) = 0;
  virtual void set_use_on_oom(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) = 0;
  virtual void set_no_split(c10::DeviceIndex device, MempoolId_t mempool_id) = 0;
  virtual void record_history(
      bool enabled,
      CCA::CreateContextFn recorder,
      size_t max_entries,
      CCA::RecordContext when,
      bool clear,
      const std::vector<std::string>& skip_actions) = 0;
  virtual void set_user_metadata(const std::string& metadata) = 0;
  virtual std::string user_metadata() = 0;
  virtual std::shared_ptr<c10::GatheredContext> context_for_pointer(const void* ptr) = 0;
  virtual void annotate_memory(const void* ptr, const std::string& metadata) = 0;

 public:
#if CUDAMEM_TORCH_AT_LEAST(2, 11)
  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id, bool include_traces) override {
    return take_snapshot(mempool_id, include_traces);
  }
#else
  CCA::SnapshotInfo snapshot(MempoolId_t mempool_id) override { return take_snapshot(mempool_id, true); }
#endif

#if CUDAMEM_TORCH_AT_LEAST(2, 11)
  void createOrIncrefPool(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    create_or_incref_pool(device, mempool_id, std::move(allocator));
  }
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    set_use_on_oom(device, mempool_id, use_on_oom);
  }
#else
  // Before 2.11 the MemPool object owns its allocator and passes a plain pointer; torch's own
  // allocator keeps that pointer while the pool has segments, and so does cudamem (a reference
  // that owns nothing).
  void createOrIncrefPool(c10::DeviceIndex device, MempoolId_t mempool_id, CCA::CUDAAllocator* allocator) override {
    std::shared_ptr<CCA::CUDAAllocator> held;
    if (allocator != nullptr) {
      held = std::shared_ptr<CCA::CUDAAllocator>(allocator, [](CCA::CUDAAllocator*) {});
    }
    create_or_incref_pool(device, mempool_id, std::move(held));
  }
  void setUseOnOOM(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    set_use_on_oom(device, mempool_id, true);
  }
#endif

#if CUDAMEM_TORCH_AT_LEAST(2, 10)
  void setNoSplit(c10::DeviceIndex device, MempoolId_t mempool_id) override { set_no_split(device, mempool_id); }
  std::vector<CCA::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }
  void setUserMetadata(const std::string& metadata) override { set_user_metadata(metadata); }
  std::string getUserMetadata() override { return user_metadata(); }
#endif

#if CUDAMEM_TORCH_AT_LEAST(2, 11)
  void recordHistory(
      bool enabled,
      CCA::CreateContextFn recorder,
      size_t max_entries,
      CCA::RecordContext when,
      bool clear,
      const std::vector<std::string>& skip_actions) override {
    record_history(enabled, recorder, max_entries, when, clear, skip_actions);
  }
#else
  void recordHistory(
      bool enabled,
      CCA::CreateContextFn recorder,
      size_t max_entries,
      CCA::RecordContext when,
      bool clear) override {
    record_history(enabled, recorder, max_entries, when, clear, {});
  }
#endif

#if CUDAMEM_TORCH_AT_LEAST(2, 12)
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    return context_for_pointer(ptr);
  }
  // Torch calls these when an allocation is refused up front under its throw_on_cudamalloc_oom
  // setting. cudamem has no such setting (its configuration parser refuses the key), so it never
  // refuses that way and the observers are kept but never called.
  void attachOomRejectionObserver(CCA::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> g(rejection_mutex_);
    rejection_observers_.push_back(std::move(observer));
  }
#endif

#if CUDAMEM_TORCH_AT_LEAST(2, 14)
  bool supportsUserMetadata() override { return true; }
  void annotateMemory(const void* ptr, const std::string& metadata) override { annotate_memory(ptr, metadata); }
#endif

 private:
#if CUDAMEM_TORCH_AT_LEAST(2, 12)
  std::mutex rejection_mutex_;
  std::vector<CCA::OomRejectionObserver> rejection_observers_;
#endif
};

}  // namespace cudamem_versions
