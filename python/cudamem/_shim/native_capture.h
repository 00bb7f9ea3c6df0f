// graph_capture_record_stream_reuse on the native torch allocator class: a block freed during a
// CUDA-graph capture while other streams have used it (record_stream) is reused within the same
// capture once the capture's graph orders every later node after the block's last use on each
// of its streams. The rule is torch's (`record_free_markers`, `free_safe_blocks_in_capture`):
//
// * At the free (the engine has deferred the block and says on which streams it lives), the
//   current terminal nodes of each of those streams' captures are the block's *free markers*.
//   If any of the streams is not capturing, the block gets no markers and waits for the
//   capture's end, as without the setting.
// * Before an allocation on stream S during a capture, a reverse walk from S's current terminal
//   nodes over the graph's dependencies collects the nodes that precede all of them (kept per
//   capture and stream: nodes only ever gain successors, so a node once found stays found). A
//   deferred block of stream S whose markers were all found is handed back to the engine
//   (release_deferred): everything captured from now on runs after its last use.
// * Only graph topology is read (cudaStreamGetCaptureInfo, cudaGraphNodeGetDependencies): no
//   event is queried or recorded, which capture forbids.
// * When the last capture ends the engine records events for the blocks still deferred; this
//   table forgets them (clear()).
//
// Included by native_allocator.cpp only (one translation unit).

#pragma once

#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAException.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cudamem_abi.h"

namespace cudamem_capture {

struct CaptureInfo {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* terminals = nullptr;
  size_t num_terminals = 0;
};

inline CaptureInfo capture_info(cudaStream_t stream) {
  CaptureInfo info;
#if CUDART_VERSION >= 13000
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo(
      stream, &info.status, &info.id, &info.graph, &info.terminals, nullptr, &info.num_terminals));
#else
  C10_CUDA_CHECK(cudaStreamGetCaptureInfo_v2(
      stream, &info.status, &info.id, &info.graph, &info.terminals, &info.num_terminals));
#endif
  return info;
}

inline std::vector<cudaGraphNode_t> parents(cudaGraphNode_t node) {
  size_t count = 0;
#if CUDART_VERSION >= 13000
  C10_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> out(count);
  std::vector<cudaGraphEdgeData> edges(count);
  if (count != 0) {
    C10_CUDA_CHECK(cudaGraphNodeGetDependencies(node, out.data(), edges.data(), &count));
  }
#else
  C10_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, &count));
  std::vector<cudaGraphNode_t> out(count);
  if (count != 0) {
    C10_CUDA_CHECK(cudaGraphNodeGetDependencies(node, out.data(), &count));
  }
#endif
  out.resize(count);
  return out;
}

class Reuse {
 public:
  // After the engine has freed `ptr` during a capture. Asks the engine whether it deferred the
  // block (it does only with the setting on and other streams' uses) and records its markers.
  void on_free(void* ptr, const cudamem_abi::NativeApi* api) {
    uint64_t streams[64];
    int n = api->deferred_streams(ptr, streams, 64);
    if (n <= 0) {
      return;
    }
    Deferred d;
    d.stream = reinterpret_cast<cudaStream_t>(streams[0]);
    if (n <= 64) {  // more streams than that: no markers, the block waits for the end
      std::unordered_set<cudaGraphNode_t> markers;
      bool all_capturing = true;
      for (int i = 0; i < n && all_capturing; ++i) {
        CaptureInfo info = capture_info(reinterpret_cast<cudaStream_t>(streams[i]));
        if (info.status != cudaStreamCaptureStatusActive) {
          all_capturing = false;
          break;
        }
        markers.insert(info.terminals, info.terminals + info.num_terminals);
      }
      if (all_capturing) {
        d.markers.assign(markers.begin(), markers.end());
      }
    }
    std::lock_guard<std::mutex> g(mutex_);
    deferred_[ptr] = std::move(d);
  }

  // Before an allocation on `stream` while a capture is underway.
  void before_malloc(cudaStream_t stream, const cudamem_abi::NativeApi* api) {
    std::lock_guard<std::mutex> g(mutex_);
    if (deferred_.empty()) {
      return;
    }
    CaptureInfo info = capture_info(stream);
    if (info.status != cudaStreamCaptureStatusActive || info.num_terminals == 0) {
      return;
    }
    auto& visited = visited_[info.id][stream];
    std::vector<cudaGraphNode_t> dfs(info.terminals, info.terminals + info.num_terminals);
    while (!dfs.empty()) {
      cudaGraphNode_t v = dfs.back();
      dfs.pop_back();
      if (!visited.insert(v).second) {
        continue;
      }
      for (cudaGraphNode_t p : parents(v)) {
        dfs.push_back(p);
      }
    }
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      const Deferred& d = it->second;
      bool reusable = d.stream == stream && !d.markers.empty();
      for (size_t i = 0; reusable && i < d.markers.size(); ++i) {
        reusable = visited.count(d.markers[i]) != 0;
      }
      if (reusable && api->release_deferred(it->first) == 0) {
        it = deferred_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The last capture has ended: the engine records the events of what is still deferred.
  void clear() {
    std::lock_guard<std::mutex> g(mutex_);
    deferred_.clear();
    visited_.clear();
  }

 private:
  struct Deferred {
    cudaStream_t stream = nullptr;
    std::vector<cudaGraphNode_t> markers;  // empty: wait for the capture's end
  };
  std::mutex mutex_;
  std::unordered_map<void*, Deferred> deferred_;
  std::unordered_map<unsigned long long, std::unordered_map<cudaStream_t, std::unordered_set<cudaGraphNode_t>>>
      visited_;
};

}  // namespace cudamem_capture
