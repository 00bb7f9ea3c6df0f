// Torch's own memory history, and torch's trace trackers, on the native torch allocator class: recordHistory, snapshot's
// device_traces and contexts, recordAnnotation, compile contexts and user metadata, kept in
// torch's TraceEntry with torch's context recorder, so that torch.cuda.memory._snapshot(),
// _dump_snapshot, torch::cuda::_memory_snapshot_pickled and torch.cuda._memory_viz work unchanged,
// with torch's frames (Python, TorchScript and C++, as `stacks=` asks) and torch's options
// (context="state"/"alloc"/"all", skip_actions, max_entries, _set_memory_metadata,
// compile_context, annotations).
//
// Rules kept here, as torch's allocator keeps them:
// * Contexts are gathered before the class calls into the engine, on the calling thread, with no
//   lock held (the recorder may take the GIL): at allocation when recording at all ("state" and
//   up: blocks show where they were allocated), at free and empty_cache with context "all". The
//   engine's events of that call (alloc, segment_alloc, segment_map, free_requested,
//   free_completed, segment_free, segment_unmap, oom) arrive through the trace hook on the same
//   thread and take that context (Scope); a block's free events without one take the block's
//   allocation context. A segment shows its context until an allocation splits its head block
//   (torch keeps it on the head block, which a split moves behind the new one).
// * Trace entries are kept while recording is enabled, whatever the context (at most
//   max_entries per device, oldest dropped first), minus skip_actions, each with the compile
//   context on top ("N/A" when none) and the user metadata set at the time; entries carry frames
//   from context "alloc" on, block and segment contexts from context "state" on. Times are
//   torch's approximate clock, turned into microseconds at snapshot.
// * The hook runs under the engine's lock; this history's mutex is taken inside it and never
//   held while calling the engine.
//
// Included by native_allocator.cpp only (one translation unit), after c10's allocator header.

#pragma once

#include <c10/util/ApproximateClock.h>

#include "native_versions.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace cudamem_history {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;
using Ctx = std::shared_ptr<c10::GatheredContext>;
using Action = CCA::TraceEntry::Action;

inline Ctx& call_context() {
  thread_local Ctx ctx;
  return ctx;
}

// The context of the events of one call into the engine, on this thread.
struct Scope {
  explicit Scope(Ctx c) { call_context() = std::move(c); }
  ~Scope() { call_context().reset(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

class History {
 public:
  void record(
      bool enabled,
      CCA::CreateContextFn recorder,
      size_t max_entries,
      CCA::RecordContext when,
      bool clear,
      const std::vector<std::string>& skip_actions) {
    std::set<Action> skip;
    cudamem_versions::parse_skip_actions(skip_actions, skip);  // throws on an unknown name, as torch does
    std::lock_guard<std::mutex> g(mutex_);
    enabled_ = enabled;
    when_ = enabled ? when : CCA::RecordContext::NEVER;
    recorder_ = enabled ? recorder : nullptr;
    max_entries_ = max_entries;
    skip_ = std::move(skip);
    if (clear || !enabled) {  // torch drops its trace when recording stops, too
      traces_.clear();
    }
    if (clear) {
      annotations_.clear();
    }
    for (auto& t : traces_) {
      while (t.size() > max_entries_) {
        t.pop_front();
      }
    }
    if (!enabled) {
      block_ctx_.clear();
      block_info_.clear();
      segment_ctx_.clear();
    }
  }

  bool recording() {
    std::lock_guard<std::mutex> g(mutex_);
    return enabled_;
  }

  // The recorder's context if recording at `level` or more (no lock held while it runs).
  Ctx gather(CCA::RecordContext level) {
    CCA::CreateContextFn recorder = nullptr;
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (when_ < level || recorder_ == nullptr) {
        return nullptr;
      }
      recorder = recorder_;
    }
    return recorder();
  }

  // One event of the engine (through the trace hook, on the thread of the call).
  void on_event(Action action, int device, uint64_t addr, uint64_t size, uint64_t stream) {
    std::lock_guard<std::mutex> g(mutex_);
    if (!enabled_) {
      return;
    }
    Ctx ctx = call_context();
    switch (action) {
      case Action::ALLOC: {
        if (ctx) {
          block_ctx_[addr] = ctx;
        }
        block_info_[addr] = BlockInfo{device, size, stream};
        // Torch keeps a segment's context on its first block, and a split moves that block
        // behind the new one: a segment whose head is split shows no frames from then on.
        auto seg = segment_ctx_.find(addr);
        if (seg != segment_ctx_.end()) {
          const uint64_t block = (size + 511) / 512 * 512;
          const uint64_t rest = block < seg->second.size ? seg->second.size - block : 0;
          const bool small_rule = seg->second.mapped || seg->second.size <= (2u << 20);
          if (small_rule ? rest >= 512 : rest > (1u << 20)) {
            segment_ctx_.erase(seg);
          }
        }
        break;
      }
      case Action::FREE_REQUESTED:
      case Action::FREE_COMPLETED: {
        auto it = block_ctx_.find(addr);
        if (!ctx && it != block_ctx_.end()) {
          ctx = it->second;
        }
        if (action == Action::FREE_COMPLETED && it != block_ctx_.end()) {
          block_ctx_.erase(it);
        }
        if (action == Action::FREE_COMPLETED) {
          block_info_.erase(addr);
        }
        break;
      }
      case Action::SEGMENT_ALLOC:
      case Action::SEGMENT_MAP:
        if (ctx && segment_ctx_.find(addr) == segment_ctx_.end()) {
          segment_ctx_[addr] = SegmentCtx{ctx, size, action == Action::SEGMENT_MAP};
        }
        break;
      case Action::SEGMENT_FREE:
        segment_ctx_.erase(addr);
        break;
      default:
        break;
    }
    if (skip_.count(action) != 0) {
      return;
    }
    // As torch's: trace entries carry frames from context "alloc" on; with "state" only the
    // blocks and segments do.
    if (when_ < CCA::RecordContext::ALLOC) {
      ctx = nullptr;
    }
    append(action, device, addr, size, stream, std::move(ctx), user_metadata_);
  }

  // torch.cuda.memory._annotate_tensor (torch 2.14 on): an ANNOTATE entry, with the metadata as
  // its payload, for the live allocation that starts at `addr`. Recorded only while the history
  // is (as torch's allocator does); then an address that is no live allocation's start is an
  // error. (Torch also refuses such an address while not recording; cudamem, which knows the
  // live blocks' starts only while recording, then ignores the call.)
  void annotate_memory(uint64_t addr, const std::string& metadata) {
#if CUDAMEM_TORCH_AT_LEAST(2, 14)
    Ctx ctx = gather(CCA::RecordContext::ALLOC);  // frames from context "alloc" on, as torch's
    std::lock_guard<std::mutex> g(mutex_);
    if (!enabled_) {
      return;
    }
    auto it = block_info_.find(addr);
    TORCH_CHECK(
        it != block_info_.end(), "cudamem: annotate_memory: ", reinterpret_cast<void*>(addr),
        " is not the start of a live allocation recorded in the memory history");
    if (skip_.count(Action::ANNOTATE) == 0) {
      const BlockInfo b = it->second;
      append(Action::ANNOTATE, b.device, addr, b.size, b.stream, std::move(ctx), metadata);
    }
#else
    (void)addr;
    (void)metadata;
#endif
  }

  // recordAnnotation (torch's record_function ranges), on `device` (-1: the current one).
  void annotate(const std::vector<std::pair<std::string, std::string>>& md, int on_device = -1) {
    std::lock_guard<std::mutex> g(mutex_);
    if (!enabled_) {
      return;
    }
    c10::DeviceIndex device = static_cast<c10::DeviceIndex>(on_device);
    if (on_device < 0) {
      device = 0;
      (void)c10::cuda::GetDevice(&device);
    }
    cudamem_versions::AnnotationEntry ae(device, c10::getApproximateTime());
    for (const auto& [k, v] : md) {
      ae.recordUserMetadata(k, v);
    }
    annotations_.push_back(std::move(ae));
  }

  // cudamem.annotate: `stage` ("START" or "END") of the region `name`, as torch's
  // record_function ranges record them. 1 when recorded, 0 when not recording; never throws.
  int annotate_region(const char* name, const char* stage, int device) {
    try {
      if (name == nullptr || stage == nullptr || !recording()) {
        return 0;
      }
      annotate({{"name", name}, {"stage", stage}}, device);
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cudamem: annotate failed: %s\n", e.what());
      return 0;
    }
  }

  void push_compile_context(const std::string& md) {
    std::lock_guard<std::mutex> g(mutex_);
    compile_context_.push_back(md);
  }
  void pop_compile_context() {
    std::lock_guard<std::mutex> g(mutex_);
    if (!compile_context_.empty()) {
      compile_context_.pop_back();
    }
  }
  void set_user_metadata(const std::string& md) {
    std::lock_guard<std::mutex> g(mutex_);
    user_metadata_ = md;
  }
  std::string user_metadata() {
    std::lock_guard<std::mutex> g(mutex_);
    return user_metadata_;
  }

  Ctx block_context(uint64_t addr) {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = block_ctx_.find(addr);
    return it == block_ctx_.end() ? nullptr : it->second;
  }
  Ctx segment_context(uint64_t addr) {
    std::lock_guard<std::mutex> g(mutex_);
    auto it = segment_ctx_.find(addr);
    return it == segment_ctx_.end() ? nullptr : it->second.ctx;
  }

  // snapshot(): the traces and annotations, with times in microseconds.
  void fill(CCA::SnapshotInfo& info, int device_count) {
    auto to_ns = converter_.makeConverter();
    std::lock_guard<std::mutex> g(mutex_);
    info.device_traces.assign(std::max<size_t>(device_count, traces_.size()), {});
    for (size_t d = 0; d < traces_.size(); ++d) {
      for (const auto& te : traces_[d]) {
        CCA::TraceEntry copy = te;
        copy.time_.t_ = to_ns(te.time_.approx_t_) / 1000;
        info.device_traces[d].push_back(std::move(copy));
      }
    }
    for (const auto& ae : annotations_) {
      cudamem_versions::AnnotationEntry copy = ae;
      copy.time_.t_ = to_ns(ae.time_.approx_t_) / 1000;
      info.external_annotations.push_back(std::move(copy));
    }
  }

 private:
  // One trace entry, with the compile context on top; the oldest go past max_entries.
  // Requires mutex_ held.
  void append(Action action, int device, uint64_t addr, uint64_t size, uint64_t stream, Ctx ctx,
              const std::string& metadata) {
    if (traces_.size() <= static_cast<size_t>(device)) {
      traces_.resize(device + 1);
    }
    auto& t = traces_[device];
    t.push_back(cudamem_versions::trace_entry(
        action, device, addr, size, stream, c10::getApproximateTime(), std::move(ctx),
        compile_context_.empty() ? std::string("N/A") : compile_context_.back(), metadata));
    while (t.size() > max_entries_) {
      t.pop_front();
    }
  }

  std::mutex mutex_;
  bool enabled_ = false;
  CCA::RecordContext when_ = CCA::RecordContext::NEVER;
  CCA::CreateContextFn recorder_ = nullptr;
  size_t max_entries_ = 0;
  std::set<Action> skip_;
  std::vector<std::deque<CCA::TraceEntry>> traces_;
  std::vector<cudamem_versions::AnnotationEntry> annotations_;
  std::unordered_map<uint64_t, Ctx> block_ctx_;
  // The live blocks seen while recording (for annotate_memory), keyed by address.
  struct BlockInfo {
    int device;
    uint64_t size;
    uint64_t stream;
  };
  std::unordered_map<uint64_t, BlockInfo> block_info_;
  // A segment's context, its size and whether it was mapped (expandable: torch splits those
  // by the small pool's rule), keyed by its address.
  struct SegmentCtx {
    Ctx ctx;
    uint64_t size;
    bool mapped;
  };
  std::unordered_map<uint64_t, SegmentCtx> segment_ctx_;
  std::vector<std::string> compile_context_;
  std::string user_metadata_;
  c10::ApproximateClockToUnixTimeConverter converter_;
};

// The trackers of attachAllocatorTraceTracker; each event reaches them as a TraceEntry with the
// call's context. A tracker that throws is reported and the others still hear the event.
class Trackers {
 public:
  void add(CCA::AllocatorTraceTracker t) {
    std::lock_guard<std::mutex> g(mutex_);
    trackers_.push_back(std::move(t));
    n_.fetch_add(1);
  }
  bool any() const { return n_.load(std::memory_order_relaxed) > 0; }
  void call(Action action, int device, uint64_t addr, uint64_t size, uint64_t stream) {
    if (!any()) {
      return;
    }
    CCA::TraceEntry te =
        cudamem_versions::trace_entry(action, device, addr, size, stream, c10::getApproximateTime(), call_context());
    std::lock_guard<std::mutex> g(mutex_);
    for (auto& t : trackers_) {
      try {
        t(te);
      } catch (const std::exception& e) {  // nothing may unwind into the engine
        std::fprintf(stderr, "cudamem: an allocator trace tracker failed: %s\n", e.what());
      }
    }
  }

 private:
  std::mutex mutex_;
  std::vector<CCA::AllocatorTraceTracker> trackers_;
  std::atomic<int> n_{0};
};

}  // namespace cudamem_history
