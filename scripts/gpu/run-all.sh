#!/usr/bin/env bash
# Every GPU check of cudamem in one run, from the binaries scripts/gpu/build.sh put in gpu-out/
# (carry gpu-out with the run; the GPU machine has no Rust toolchain):
#   1. cudamem-cuda: unit tests, then the CUDA device's GPU tests (crates/cuda/tests/gpu_device.rs)
#   2. cudamem: the API tests (simulated device), then the allocator's GPU tests
#      (crates/cudamem/tests/gpu_allocator.rs)
#   3. both GPU test binaries again under compute-sanitizer memcheck with leak checking, if it is
#      on the PATH (API-error reports are off: tests provoke out-of-memory and other driver
#      errors on purpose and check each one themselves; the free-memory slack is widened to
#      64 MiB for the sanitizer's own allocations)
#   4. the quickstart example, the allocator bench (gpu_bench) and the driver-call benches
#      (driver_pairs, vmm_call_costs)
# Tests run one at a time with their output shown. Every step has a time limit
# (CUDAMEM_STEP_TIMEOUT seconds, default 300). A summary with PASS/FAIL per step ends the output;
# the exit status is non-zero if any step failed. If $OUT is set, the bench outputs are also
# saved there (gpu_bench.txt, driver_pairs.txt, vmm_call_costs.txt). For example:
#   bash scripts/gpu/run-all.sh 2>&1 | tee "$OUT/run-all.log"
#
# A missing GPU fails the GPU tests (CUDAMEM_REQUIRE_GPU=1 is the default here). To rehearse the
# script on a machine without a GPU: CUDAMEM_REQUIRE_GPU=0 bash scripts/gpu/run-all.sh — the GPU
# tests then print "SKIPPED: no CUDA device (...)" and pass, and the examples use the simulated
# device.
set -uo pipefail
cd "$(dirname "$0")/../.."
cuda_dir=gpu-out/cuda
mem_dir=gpu-out/cudamem
export CUDAMEM_REQUIRE_GPU=${CUDAMEM_REQUIRE_GPU:-1}
export RUST_BACKTRACE=1
limit=${CUDAMEM_STEP_TIMEOUT:-300}
if [ "$CUDAMEM_REQUIRE_GPU" != 0 ]; then device=cuda:0; else device=auto; fi

missing=0
for f in "$cuda_dir"/{cudamem_cuda-unit,gpu_device,driver_pairs,vmm_call_costs} "$mem_dir"/{api,gpu_allocator,gpu_bench,quickstart}; do
    if [ ! -x "$f" ]; then
        echo "run-all.sh: $f is missing: run scripts/gpu/build.sh on the development machine and carry gpu-out" >&2
        missing=1
    fi
done
[ $missing -eq 0 ] || exit 2

declare -a summary
status=0
save=  # set to a file name to keep a step's output in $OUT too
step() { # name, command...
    local name=$1
    shift
    echo
    echo "=== $name: $* ==="
    local t0=$SECONDS
    if [ -n "$save" ] && [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
        timeout --kill-after=15 "$limit" "$@" | tee "$OUT/$save"
    else
        timeout --kill-after=15 "$limit" "$@"
    fi
    local rc=$?
    save=
    local verdict=PASS
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        verdict="FAIL (timed out after ${limit} s)"
        status=1
    elif [ $rc -ne 0 ]; then
        verdict="FAIL (exit $rc)"
        status=1
    fi
    summary+=("$(printf '%-32s %s in %d s' "$name" "$verdict" $((SECONDS - t0)))")
}
not_run() {
    summary+=("$(printf '%-32s %s' "$1" "NOT RUN ($2)")")
}

echo "=== machine ==="
cat "$cuda_dir/MANIFEST.txt" "$mem_dir/MANIFEST.txt" 2>/dev/null
date -u +%Y-%m-%dT%H:%M:%SZ
uname -a
nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv 2>&1 || true
echo "CUDAMEM_REQUIRE_GPU=$CUDAMEM_REQUIRE_GPU; examples on $device; step limit ${limit} s"

step "cuda: unit tests" "$cuda_dir/cudamem_cuda-unit" --nocapture --test-threads=1
step "cuda: device GPU tests" "$cuda_dir/gpu_device" --nocapture --test-threads=1
step "cudamem: API tests (sim)" "$mem_dir/api" --test-threads=2
step "cudamem: allocator GPU tests" "$mem_dir/gpu_allocator" --nocapture --test-threads=1
if command -v compute-sanitizer >/dev/null; then
    memcheck=(compute-sanitizer --tool memcheck --leak-check full --report-api-errors no --error-exitcode 99)
    step "cuda: device tests, memcheck" env CUDAMEM_TEST_SLACK_MIB=64 "${memcheck[@]}" \
        "$cuda_dir/gpu_device" --test-threads=1
    step "cudamem: GPU tests, memcheck" env CUDAMEM_TEST_SLACK_MIB=64 "${memcheck[@]}" \
        "$mem_dir/gpu_allocator" --test-threads=1
else
    not_run "cuda: device tests, memcheck" "compute-sanitizer not on the PATH"
    not_run "cudamem: GPU tests, memcheck" "compute-sanitizer not on the PATH"
fi
step "cudamem: quickstart" "$mem_dir/quickstart" "$device"
save=gpu_bench.txt step "cudamem: gpu_bench" "$mem_dir/gpu_bench" --device "$device"
save=driver_pairs.txt step "cuda: driver_pairs bench" "$cuda_dir/driver_pairs"
save=vmm_call_costs.txt step "cuda: vmm_call_costs bench" "$cuda_dir/vmm_call_costs"

echo
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
if [ $status -eq 0 ]; then echo "ALL PASS"; else echo "SOME STEPS FAILED"; fi
exit $status
