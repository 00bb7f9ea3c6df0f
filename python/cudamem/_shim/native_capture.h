// CUDA-graph captures and pool contexts on the native torch allocator class.
//
// Open: the captures and MemPool contexts underway (torch's captures_underway), each with its
// pool's slot in the engine and torch's stream filter. An allocation asks them, innermost first,
// which private pool it goes to; with none open, an allocation pays one relaxed atomic load.
//
// Reuse: graph_capture_record_stream_reuse. A block freed during a
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
#include <atomic>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cudamem_abi.h"

namespace cudamem_capture {

using c10::MempoolId_t;

class Open {
 public:
  // Room for the devices torch knows of (its init).
  void reserve(int device_count) {
    std::lock_guard<std::mutex> g(mutex_);
    if (static_cast<int>(by_device_.size()) < device_count) {
      by_device_.resize(device_count);
    }
  }

  // beginAllocateToPool: allocations on `device` that `filter` accepts go to `slot`.
  void begin(int device, MempoolId_t id, std::function<bool(cudaStream_t)> filter, int slot) {
    std::lock_guard<std::mutex> g(mutex_);
    if (static_cast<size_t>(device) >= by_device_.size()) {
      by_device_.resize(device + 1);
    }
    by_device_[device].push_back(Context{id, std::move(filter), slot});
    count_.fetch_add(1);
  }

  // endAllocateToPool. True when it ended the last open context of every device.
  bool end(int device, MempoolId_t id) {
    std::lock_guard<std::mutex> g(mutex_);
    auto& v = by_device_.at(device);
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it->id == id) {
        v.erase(it);
        return count_.fetch_sub(1) == 1;
      }
    }
    return false;
  }

  // Whether any capture or pool context is open.
  bool any() const { return count_.load(std::memory_order_relaxed) != 0; }

  // The private pool that an allocation on `stream` goes to (its slot), or -1.
  int slot_for(int device, cudaStream_t stream) {
    if (!any()) {
      return -1;
    }
    std::lock_guard<std::mutex> g(mutex_);
    if (static_cast<size_t>(device) >= by_device_.size()) {
      return -1;
    }
    // The innermost context that accepts the stream wins (torch searches captures_underway
    // last-in first-out, so nested use_mem_pool blocks route to the inner pool).
    const auto& v = by_device_[device];
    for (auto it = v.rbegin(); it != v.rend(); ++it) {
      if (it->filter(stream)) {
        return it->slot;
      }
    }
    return -1;
  }

 private:
  struct Context {
    MempoolId_t id;
    std::function<bool(cudaStream_t)> filter;
    int slot;
  };
  std::mutex mutex_;
  std::vector<std::vector<Context>> by_device_;
  std::atomic<int> count_{0};
};

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
