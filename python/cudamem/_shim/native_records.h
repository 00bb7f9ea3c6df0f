// What the engine's records become in c10's structs, for the native torch allocator class:
// snapshot() segments and blocks (with torch's history contexts by address), a checkpoint
// restore's delta, DeviceStats from the engine's flat values, and the snapshot's config metadata.
// Included by native_allocator.cpp only (one translation unit), after c10's allocator header.

#pragma once

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <vector>

#include "cudamem_abi.h"
#include "native_history.h"
#include "native_versions.h"

namespace cudamem_records {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;

struct SnapshotSink {
  std::vector<CCA::SegmentInfo>* segments;
  MempoolId_t only;  // {0, 0}: every pool
  cudamem_history::History* history = nullptr;
  bool keep_current = false;
  uint64_t next_block = 0;  // the address of the segment's next block
};

inline void on_segment(void* ctx, const cudamem_abi::SegmentRecord* r) {
  auto* s = static_cast<SnapshotSink*>(ctx);
  MempoolId_t pool{r->pool_a, r->pool_b};
  s->keep_current = s->only == MempoolId_t{0, 0} || s->only == pool;
  if (!s->keep_current) {
    return;
  }
  CCA::SegmentInfo seg;
  seg.device = static_cast<c10::DeviceIndex>(r->device);
  seg.address = r->address;
  seg.total_size = r->total_size;
  seg.requested_size = r->requested_size;
  seg.allocated_size = r->allocated_size;
  seg.active_size = r->active_size;
  seg.stream = cudamem_versions::record_stream(r->stream);
  seg.is_large = r->is_large != 0;
  seg.is_expandable = r->is_expandable != 0;
  seg.owner_private_pool_id = pool;
  if (s->history != nullptr) {
    seg.context_when_allocated = s->history->segment_context(r->address);
  }
  s->next_block = r->address;
  s->segments->push_back(std::move(seg));
}

inline void on_block(void* ctx, const cudamem_abi::BlockRecord* r) {
  auto* s = static_cast<SnapshotSink*>(ctx);
  if (!s->keep_current) {
    return;
  }
  CCA::BlockInfo b;
  b.size = r->size;
  b.requested_size = r->requested_size;
  b.allocated = r->allocated != 0;
  b.active = r->active != 0;
  if (s->history != nullptr && b.active) {
    b.context_when_allocated = s->history->block_context(s->next_block);
  }
  s->next_block += r->size;
  s->segments->back().blocks.push_back(std::move(b));
}

struct RestoreSink {
  CCA::CheckpointDelta delta;
  int device;
  c10::DeleterFnPtr deleter;  // of the DataPtrs made for the restored allocations
};

inline void on_freed(void* ctx, uint64_t ptr, uint64_t) {
  static_cast<RestoreSink*>(ctx)->delta.ptrs_freed.push_back(reinterpret_cast<void*>(ptr));
}

inline void on_allocated(void* ctx, uint64_t ptr, uint64_t) {
  auto* s = static_cast<RestoreSink*>(ctx);
  void* p = reinterpret_cast<void*>(ptr);
  s->delta.dataptrs_allocd.emplace_back(
      p, p, s->deleter, c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(s->device)));
}

// c10's DeviceStats from the engine's cudamem_abi::STATS_LEN values (python/src/native.rs, `flatten_stats`).
inline CCA::DeviceStats device_stats(const int64_t* v) {
  CCA::DeviceStats s;
  size_t i = 0;
  auto stat = [&](c10::CachingAllocator::Stat& st) {
    st.current = v[i++];
    st.peak = v[i++];
    st.allocated = v[i++];
    st.freed = v[i++];
  };
  for (auto* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes, &s.reserved_bytes,
                  &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& st : *a) {
      stat(st);
    }
  }
  s.num_alloc_retries = v[i++];
  s.num_ooms = v[i++];
  stat(s.oversize_allocations);
  stat(s.oversize_segments);
  s.num_sync_all_streams = v[i++];
  s.num_device_alloc = v[i++];
  s.num_device_free = v[i++];
  s.max_split_size = v[i++];
  return s;
}

// The snapshot's allocator settings: what torch reports for an allocator without its own knobs,
// expandable segments if any segment is expandable.
inline void fill_config_metadata(CCA::SnapshotInfo& info) {
  auto& md = info.config_metadata;
  md.garbage_collection_threshold = 0.0;
  md.max_split_size = std::numeric_limits<size_t>::max();
  md.pinned_num_register_threads = 1;
  md.expandable_segments = false;
  md.release_lock_on_malloc = false;
  md.pinned_use_host_register = false;
  md.graph_capture_record_stream_reuse = false;
  cudamem_versions::fill_release_settings(md);
  // The variable torch's CUDA allocator config read (PYTORCH_CUDA_ALLOC_CONF, else the newer
  // PYTORCH_ALLOC_CONF), as cudamem's engine reads them too (AllocatorConfig::from_env).
  const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  if (conf == nullptr) {
    conf = std::getenv("PYTORCH_ALLOC_CONF");
  }
  md.last_allocator_settings = conf != nullptr ? conf : "";
  for (const auto& seg : info.segments) {
    md.expandable_segments = md.expandable_segments || seg.is_expandable;
  }
}

}  // namespace cudamem_records
