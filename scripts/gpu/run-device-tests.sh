#!/usr/bin/env bash
# Runs cudamem-cuda's device checks on the GPU machine, from the binaries that
# scripts/gpu/build.sh put in gpu-out/cuda/ (carry gpu-out with the run):
#   1. the crate's unit tests and the GPU tests (crates/cuda/tests/gpu_device.rs), one test at a
#      time, output shown;
#   2. the GPU tests again under compute-sanitizer memcheck with leak checking, if it is on the
#      PATH (API-error reports are off there: several tests provoke driver errors on purpose,
#      and the tests themselves check each error they get);
#   3. the driver-call bench (crates/cuda/examples/driver_pairs.rs).
# Prints everything, then a summary; exits non-zero if any step failed. For example:
#   bash scripts/gpu/run-device-tests.sh 2>&1 | tee "$OUT/cuda-device.log"
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=gpu-out/cuda
# A missing GPU fails the tests here instead of skipping them.
export CUDAMEM_REQUIRE_GPU=1
export RUST_BACKTRACE=1

for f in cudamem_cuda-unit gpu_device driver_pairs; do
    if [ ! -x "$dir/$f" ]; then
        echo "run-device-tests.sh: $dir/$f is missing: run scripts/gpu/build.sh on the development machine and carry gpu-out" >&2
        exit 2
    fi
done

declare -a summary
status=0
step() { # name, command...
    local name=$1
    shift
    echo
    echo "=== $name: $* ==="
    local t0=$SECONDS
    "$@"
    local rc=$?
    local verdict=PASS
    [ $rc -eq 0 ] || { verdict="FAIL (exit $rc)"; status=1; }
    summary+=("$name: $verdict in $((SECONDS - t0)) s")
}

echo "=== machine ==="
cat "$dir/MANIFEST.txt" 2>/dev/null
date -u +%Y-%m-%dT%H:%M:%SZ
nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv 2>&1 || true

step "unit tests" "$dir/cudamem_cuda-unit" --nocapture --test-threads=1
step "gpu tests" "$dir/gpu_device" --nocapture --test-threads=1
if command -v compute-sanitizer >/dev/null; then
    # The sanitizer's own device allocations move cuMemGetInfo: widen the tests' slack.
    step "gpu tests under memcheck" env CUDAMEM_TEST_SLACK_MIB=64 compute-sanitizer --tool memcheck --leak-check full \
        --report-api-errors no --error-exitcode 99 "$dir/gpu_device" --test-threads=1
else
    summary+=("gpu tests under memcheck: not run (compute-sanitizer not on the PATH)")
fi
step "bench driver_pairs" "$dir/driver_pairs"

echo
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
exit $status
