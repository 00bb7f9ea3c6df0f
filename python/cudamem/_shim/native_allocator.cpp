// cudamem as torch's CUDA allocator: a c10::cuda::CUDACachingAllocator::CUDAAllocator.
//
// Why a class and not CUDAPluggableAllocator: the pluggable interface carries two functions
// (alloc, free); torch's CUDA graphs, MemPool, torch.compile's CUDA-graph trees, cuDNN
// autotuning, the profiler's memory view and every C++ caller of getDeviceStats need the
// rest of the interface. This file implements it by calling the Rust engine through the
// function table of python/src/native.rs (`NativeApi`, declared in cudamem_abi.h, which cbindgen
// generates from python/src/abi.rs; versioned: the Python side passes its address to
// cudamem_native_install, which checks version and size before using it).
//
// What lives on this side and not in Rust, and why (each header is one part, one TU):
// * PyTorch's stream filters (std::function) of beginAllocateToPool: each allocation asks
//   them which private pool it goes to, and passes that pool's slot to Rust (native_capture.h,
//   with graph_capture_record_stream_reuse).
// * Exceptions: a failed call leaves its message as the Rust thread's last error; the class
//   throws c10::OutOfMemoryError (-> torch.OutOfMemoryError) or c10::Error with it
//   (native_engine.h, the link to the function table).
// * The profiler: every allocation and free is reported with
//   c10::reportMemoryUsageToProfiler (only while memory profiling is on), as torch's own
//   allocator does, so profile_memory=True shows per-operator memory.
// * OOM observers, which run before the exception is thrown, outside cudamem's lock
//   (native_oom.h).
// * Torch's history and trackers (native_history.h), c10's structs (native_records.h), IPC
//   (native_ipc.h), memory from outside the engine (native_memory.h), releases (native_versions.h).
//
// Built by cudamem.torch (one g++ command against the installed torch's headers and the CUDA
// runtime headers; see cudamem/torch.py).

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cudamem_abi.h"
#include "native_capture.h"
#include "native_engine.h"
#include "native_history.h"
#include "native_ipc.h"
#include "native_memory.h"
#include "native_oom.h"
#include "native_records.h"
#include "native_versions.h"

namespace {

namespace CCA = c10::cuda::CUDACachingAllocator;
using c10::MempoolId_t;

using cudamem_abi::NativeApi;
constexpr int kShimVersion = 2;  // cudamem._torch_native.NATIVE_SHIM_VERSION

using cudamem_engine::check;
using cudamem_engine::cuda_device;
using cudamem_engine::g_api;
using cudamem_engine::last_error_message;

// What raw_free needs of the allocator object (set once, when it is installed).
std::atomic<bool> g_history_on{false};
cudamem_history::History* g_history = nullptr;
// Open captures and pool contexts (torch's captures_underway), and the blocks freed during
// them that wait for other streams (graph_capture_record_stream_reuse).
cudamem_capture::Open g_open;
cudamem_capture::Reuse g_reuse;

// The context of a free's events (context "all"), when torch's history is recorded.
cudamem_history::Ctx free_context() {
  if (!g_history_on.load(std::memory_order_relaxed) || g_history == nullptr) {
    return nullptr;
  }
  return g_history->gather(CCA::RecordContext::ALL);
}

// The deleter of every DataPtr cudamem hands out (and raw_deleter()).
void raw_free(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  cudamem_history::Scope scope(free_context());
  const bool profiling = c10::memoryProfilingEnabled();
  uint64_t info[4] = {profiling ? 1u : 0u, 0, 0, 0};
  int kind = g_api->free(ptr, info);
  if (kind != 0) {
    // A deleter cannot throw (torch calls it from destructors): say it, as torch does for
    // its own invariant failures, and go on.
    std::string msg = last_error_message(nullptr);
    std::fprintf(stderr, "cudamem: free failed: %s\n", msg.c_str());
    return;
  }
  if (g_open.any()) {
    try {
      g_reuse.on_free(ptr, g_api);
    } catch (const std::exception& e) {
      // The block still waits for the capture's end, as without the setting.
      std::fprintf(stderr, "cudamem: %s\n", e.what());
    }
  }
  if (profiling) {
    c10::reportMemoryUsageToProfiler(
        ptr, -static_cast<int64_t>(info[0]), info[1], info[2], cuda_device(static_cast<int>(info[3])));
  }
}

class CudamemAllocator final : public cudamem_versions::Adapter {
 public:
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    void* p = nullptr;
    if (!isEnabled()) {
      p = size != 0 ? cudamem_memory::uncached_alloc(size) : nullptr;
      return {p, p, &cudamem_memory::uncached_free, cuda_device(device)};
    }
    if (size != 0) {
      p = malloc(device, size, c10::cuda::getCurrentCUDAStream(device).stream());
    }
    return {p, p, &raw_free, cuda_device(device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return isEnabled() ? &raw_free : &cudamem_memory::uncached_free; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  bool initialized() override { return initialized_.load(); }

  void init(int device_count) override {
    g_open.reserve(device_count);
    initialized_.store(true);
  }

  void* raw_alloc(size_t nbytes) override {
    if (nbytes == 0) {
      return nullptr;
    }
    if (!isEnabled()) {
      return cudamem_memory::uncached_alloc(nbytes);
    }
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return malloc(device, nbytes, c10::cuda::getCurrentCUDAStream(device).stream());
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (nbytes == 0) {
      return nullptr;
    }
    if (!isEnabled()) {
      return cudamem_memory::uncached_alloc(nbytes);
    }
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return malloc(device, nbytes, stream);
  }

  // As torch's: which of the two a raw pointer came from is told by the setting now.
  void raw_delete(void* ptr) override { isEnabled() ? raw_free(ptr) : cudamem_memory::uncached_free(ptr); }

  void emptyCache(MempoolId_t mempool_id) override {
    cudamem_history::Scope scope(free_context());  // the stack of its segment frees
    check(g_api->empty_cache(mempool_id.first, mempool_id.second));
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    // Empty tensors and memory that is not cudamem's (from_blob) have nothing to record.
    if (ptr.get() == nullptr || ptr.get_deleter() != &raw_free) {
      return;
    }
    check(g_api->record_stream(ptr.get(), stream.stream()));
  }

  CCA::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    int64_t v[cudamem_abi::STATS_LEN];
    check(g_api->stats(device, v, cudamem_abi::STATS_LEN));
    return cudamem_records::device_stats(v);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override { g_api->reset_accumulated(device); }
  void resetPeakStats(c10::DeviceIndex device) override { g_api->reset_peak(device); }

  double getMemoryFraction(c10::DeviceIndex device) override { return g_api->get_fraction(device); }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    check(g_api->set_fraction(device, fraction));
  }

  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }

  // As torch's: a zero *largestBlock asks for an optimistic first guess (the device's free
  // memory); then the largest cached free block, if larger.
  void cacheInfo(c10::DeviceIndex device, size_t* largestBlock) override {
    if (*largestBlock == 0) {
      c10::cuda::CUDAGuard guard(device);
      size_t total = 0;
      C10_CUDA_CHECK(cudaMemGetInfo(largestBlock, &total));
    }
    size_t cached = static_cast<size_t>(g_api->largest_free(device));
    if (cached > *largestBlock) {
      *largestBlock = cached;
    }
  }

  void* getBaseAllocation(void* ptr, size_t* size) override {
    uint64_t s = 0;
    void* base = g_api->base_allocation(ptr, &s);
    if (base == nullptr) {
      check(cudamem_abi::ERR_INVALID);
    }
    *size = static_cast<size_t>(s);
    return base;
  }

  // The engine's segments and blocks, with the contexts and traces of torch's history.
  CCA::SnapshotInfo take_snapshot(MempoolId_t mempool_id, bool include_traces) override {
    CCA::SnapshotInfo info{};  // value-initialised: no field a release adds is left unset
    cudamem_records::SnapshotSink sink{&info.segments, mempool_id, &history_};
    check(g_api->snapshot(&sink, &cudamem_records::on_segment, &cudamem_records::on_block));
    if (include_traces) {
      history_.fill(info, c10::cuda::device_count());
    }
    cudamem_records::fill_config_metadata(info);
    return info;
  }

  void beginAllocateToPool(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      std::function<bool(cudaStream_t)> filter) override {
    int slot = -1;
    check(g_api->pool_begin(device, mempool_id.first, mempool_id.second, &slot));
    g_open.begin(device, mempool_id, std::move(filter), slot);
  }

  void endAllocateToPool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(g_api->pool_end(device, mempool_id.first, mempool_id.second));
    if (g_open.end(device, mempool_id)) {
      g_reuse.clear();  // the engine has recorded the events of what still waited
    }
  }

  void releasePool(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(g_api->pool_release(device, mempool_id.first, mempool_id.second));
  }

  int getPoolUseCount(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    return g_api->pool_use_count(device, mempool_id.first, mempool_id.second);
  }

  // A MemPool with an allocator of its own takes its segments from that allocator (torch's
  // rule); the pool keeps the allocator alive while it holds segments.
  void create_or_incref_pool(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      std::shared_ptr<CCA::CUDAAllocator> allocator) override {
    if (allocator == nullptr) {
      check(g_api->pool_create(device, mempool_id.first, mempool_id.second));
      return;
    }
    auto* held = new std::shared_ptr<CCA::CUDAAllocator>(std::move(allocator));
    check(g_api->pool_create_with(
        device, mempool_id.first, mempool_id.second, held, &cudamem_memory::pool_alloc, &cudamem_memory::pool_free, &cudamem_memory::pool_drop));
  }

  void set_use_on_oom(c10::DeviceIndex device, MempoolId_t mempool_id, bool use_on_oom) override {
    check(g_api->pool_set_use_on_oom(device, mempool_id.first, mempool_id.second, use_on_oom ? 1 : 0));
  }

  void set_no_split(c10::DeviceIndex device, MempoolId_t mempool_id) override {
    check(g_api->pool_set_no_split(device, mempool_id.first, mempool_id.second));
  }

  bool checkPoolLiveAllocations(
      c10::DeviceIndex device,
      MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override {
    std::vector<uint64_t> ptrs;
    ptrs.reserve(expected_live_allocations.size());
    for (void* p : expected_live_allocations) {
      ptrs.push_back(reinterpret_cast<uint64_t>(p));
    }
    int r = g_api->pool_check_live(device, mempool_id.first, mempool_id.second, ptrs.data(), ptrs.size());
    if (r < 0) {
      check(-r);
    }
    return r == 1;
  }

  CCA::ShareableHandle shareIpcHandle(void* ptr) override { return cudamem_ipc::share(g_api, &check, ptr); }

  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return ipc_.get(g_api, &check, handle, device);
  }

  bool isHistoryEnabled() override { return g_history_on.load() || g_api->history_enabled() != 0; }

  // Torch's history is kept here, in torch's TraceEntry with torch's recorder (see
  // native_history.h), and only here: each allocation's context is gathered once, by torch's
  // recorder, and cudamem.snapshot() reads this history through torch while cudamem's own
  // recording (cudamem.record_memory_history) is off.
  void record_history(
      bool enabled,
      CCA::CreateContextFn context_recorder,
      size_t alloc_trace_max_entries,
      CCA::RecordContext when,
      bool clearHistory,
      const std::vector<std::string>& skip_actions) override {
    history_.record(enabled, context_recorder, alloc_trace_max_entries, when, clearHistory, skip_actions);
    g_history_on.store(enabled);
    update_hook();
  }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override { history_.annotate(md); }
  void pushCompileContext(std::string& md) override { history_.push_compile_context(md); }
  void popCompileContext() override { history_.pop_compile_context(); }
  void set_user_metadata(const std::string& metadata) override { history_.set_user_metadata(metadata); }
  std::string user_metadata() override { return history_.user_metadata(); }
  // The context recorded when the block at `ptr` was allocated (null when history was off).
  std::shared_ptr<c10::GatheredContext> context_for_pointer(const void* ptr) override {
    return history_.block_context(reinterpret_cast<uint64_t>(ptr));
  }
  // torch.cuda.memory._annotate_memory: an ANNOTATE trace entry for the live allocation at `ptr`.
  void annotate_memory(const void* ptr, const std::string& metadata) override {
    history_.annotate_memory(reinterpret_cast<uint64_t>(ptr), metadata);
  }

  void attachOutOfMemoryObserver(CCA::OutOfMemoryObserver observer) override { oom_.add(std::move(observer)); }

  // Trackers hear every event of the engine (ProcessGroupNCCL registers segments with them), as
  // torch calls its trackers under its allocator's mutex (see update_hook).
  void attachAllocatorTraceTracker(CCA::AllocatorTraceTracker tracker) override {
    trackers_.add(std::move(tracker));
    update_hook();
  }

  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    cudamem_memory::enable_peer_access(dev, dev_to_access);
  }

  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count,
                          cudaStream_t stream, bool p2p_enabled) override {
    return cudamem_memory::copy_async(dst, dstDevice, src, srcDevice, count, stream, p2p_enabled);
  }

  std::shared_ptr<CCA::AllocatorState> getCheckpointState(c10::DeviceIndex device, MempoolId_t id) override {
    void* h = g_api->checkpoint_get(device, id.first, id.second);
    if (h == nullptr) {
      check(cudamem_abi::ERR_INVALID);
    }
    return std::make_shared<cudamem_engine::PoolState>(h, device);
  }

  CCA::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device,
      std::shared_ptr<CCA::AllocatorState> pps) override {
    auto* state = dynamic_cast<cudamem_engine::PoolState*>(pps.get());
    TORCH_CHECK(state != nullptr, "cudamem: the checkpoint was not made by cudamem");
    cudamem_records::RestoreSink sink{{}, device, &raw_free};
    check(g_api->checkpoint_restore(
        device, state->handle, &sink, &cudamem_records::on_freed, &cudamem_records::on_allocated));
    return std::move(sink.delta);
  }

  std::string name() override { return "cudamem"; }

 private:
  // The engine's events go to the trackers and torch's history while either listens; with
  // neither the hook is removed and the engine pays nothing.
  void update_hook() {
    bool want = trackers_.any() || g_history_on.load();
    std::lock_guard<std::mutex> g(hook_mutex_);
    if (want != hooked_) {
      check(g_api->set_trace_hook(this, want ? &CudamemAllocator::on_event : nullptr));
      hooked_ = want;
    }
  }

  static void on_event(void* self, int device, int action, uint64_t addr, uint64_t size, uint64_t stream) {
    auto* a = static_cast<CudamemAllocator*>(self);
    auto act = static_cast<CCA::TraceEntry::Action>(action);
    if (g_history_on.load(std::memory_order_relaxed)) {
      a->history_.on_event(act, device, addr, size, stream);
    }
    a->trackers_.call(act, device, addr, size, stream);
  }

  void* malloc(int device, size_t size, cudaStream_t stream) {
    cudamem_memory::bind_runtime_context(g_open.any());
    const bool profiling = c10::memoryProfilingEnabled();
    uint64_t info[3] = {profiling ? 1u : 0u, 0, 0};
    void* p = nullptr;
    cudamem_history::Scope scope(
        g_history_on.load(std::memory_order_relaxed) ? history_.gather(CCA::RecordContext::STATE) : nullptr);
    if (!g_open.any()) {
      p = g_api->malloc(device, size, stream, -1, info);
    } else {
      // While any capture is underway the driver refuses memory calls in the default
      // (global) capture mode. Allocating during capture is fine as long as the memory is not
      // freed before replay (a private pool keeps it), so allow it, as torch's allocator does.
      c10::cuda::CUDAStreamCaptureModeGuard relaxed{cudaStreamCaptureModeRelaxed};
      g_reuse.before_malloc(stream, g_api);
      p = g_api->malloc(device, size, stream, g_open.slot_for(device, stream), info);
    }
    if (p == nullptr) {
      int kind = 0;
      std::string msg = last_error_message(&kind);
      if (kind == cudamem_abi::ERR_OOM) {
        oom_.report(g_api, device, size);
        TORCH_CHECK_WITH(OutOfMemoryError, false, msg);
      }
      TORCH_CHECK(false, msg);
    }
    if (profiling) {
      c10::reportMemoryUsageToProfiler(p, static_cast<int64_t>(info[0]), info[1], info[2], cuda_device(device));
    }
    return p;
  }

  cudamem_oom::Observers oom_;
  cudamem_history::Trackers trackers_;
  std::mutex hook_mutex_;
  bool hooked_ = false;
  cudamem_ipc::Opened ipc_;

 public:
  cudamem_history::History history_;
  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};
};

}  // namespace

extern "C" {

// Makes cudamem torch's CUDA allocator. Returns 0, or 1 with the reason in `msg` (torch's
// allocator is initialised already, ...), or 2 when the function table does not match.
int cudamem_native_install(const void* api, void* last_error, char* msg, size_t len) {
  try {
    auto* a = static_cast<const NativeApi*>(api);
    if (a == nullptr || a->version != cudamem_abi::NATIVE_API_VERSION || a->size != sizeof(NativeApi)) {
      cudamem_engine::write_message(
          "cudamem: the native allocator library does not match the cudamem extension (rebuild it: "
          "remove the cached torch_native-*.so)",
          msg,
          len);
      return 2;
    }
    g_api = a;
    cudamem_engine::g_last_error = reinterpret_cast<cudamem_abi::LastErrorFn>(last_error);
    // Never destroyed, as torch's own allocator is not: static destructors at exit still free
    // tensors through it, and its history holds Python tracebacks that must not be released
    // once the interpreter is gone.
    static auto* allocator = new std::shared_ptr<CudamemAllocator>(std::make_shared<CudamemAllocator>());
    g_history = &(*allocator)->history_;
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(*allocator);
    // torch.accelerator's calls find the CUDA allocator through c10's registry.
    c10::SetAllocator(c10::DeviceType::CUDA, allocator->get(), /*priority=*/UINT8_MAX);
    return 0;
  } catch (const std::exception& e) {
    cudamem_engine::write_message(e.what(), msg, len);
    return 1;
  }
}

// cudamem.annotate while the class keeps torch's history: an annotation as torch's
// record_function ranges make them (name and stage) on `device` (-1: the current one). Returns 1
// when recorded (torch's history is on), else 0; never throws.
int cudamem_native_annotate(const char* name, const char* stage, int device) {
  return g_history != nullptr ? g_history->annotate_region(name, stage, device) : 0;
}

// The version of this file's interface to cudamem.torch.
int cudamem_native_version() { return kShimVersion; }

}  // extern "C"
