#!/usr/bin/env bash
# GPU pattern replay (crates/replay/examples/gpu_pattern_replay.rs): the shared traces replayed
# through the allocator on cuda:0 with a pattern written into every allocation and checked before
# every free — an overlap of live allocations or a premature reuse shows up as a mismatch.
#
#   bash scripts/gpu/pattern.sh --build   on the development machine: builds the example
#                                         (release) into gpu-out/replay/ (git-ignored; carry
#                                         gpu-out to the GPU machine, which has no Rust toolchain)
#   bash scripts/gpu/pattern.sh           on the GPU machine, from the repository root's copy:
#     1. the replay, plainly: at least PATTERN_OPS trace operations (default 1,000,000);
#     2. the replay under compute-sanitizer --tool memcheck with leak checking (PATTERN_SANITIZER_OPS
#        operations, default 1,000,000 as well: on an H200 memcheck ran 100,000 in 6 s);
#     3. under --tool racecheck and --tool synccheck (PATTERN_SANITIZER_OPS / 5 operations).
#        These two check shared-memory hazards and barrier use *inside kernels*; this program
#        launches no kernel of its own (only cuMemsetD8Async and cuMemcpyDtoH), so they have
#        nothing to check and a clean result there is vacuous. They run to show exactly that;
#        memcheck is the sanitizer that applies (out-of-bounds and misaligned accesses of the
#        driver's memset/copy work, API errors, leaks).
#   Steps 2-3 are reported NOT RUN when compute-sanitizer is not on the PATH.
# Every step has a time limit (CUDAMEM_STEP_TIMEOUT seconds, default 540). A summary with PASS/FAIL
# per step ends the output; the exit status is non-zero if any step failed. A missing GPU fails
# (CUDAMEM_REQUIRE_GPU=1 is the default here; CUDAMEM_REQUIRE_GPU=0 lets it print SKIPPED and
# pass). For example:
#   bash scripts/gpu/pattern.sh 2>&1 | tee "$OUT/pattern.log"
# The traces are read from tests/data (tracked, so present in the carried work tree).
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=gpu-out/replay
exe=$dir/gpu_pattern_replay

if [ "${1:-}" = "--build" ]; then
    set -e
    cargo build -p cudamem-replay --release --example gpu_pattern_replay
    rm -f "$exe" "$dir/MANIFEST.txt" # keep the other binaries of gpu-out/replay (scripts/gpu/build.sh)
    mkdir -p "$dir"
    objcopy --strip-debug target/release/examples/gpu_pattern_replay "$exe"
    {
        echo "cudamem GPU pattern replay"
        echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$([ -z "$(git status --porcelain -- crates 2>/dev/null)" ] || echo ' + uncommitted changes in crates/')"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
        (cd "$dir" && sha256sum gpu_pattern_replay)
    } >"$dir/MANIFEST.txt"
    ls -l "$dir"
    exit 0
fi

if [ ! -x "$exe" ]; then
    echo "pattern.sh: $exe is missing: run 'bash scripts/gpu/pattern.sh --build' on the development machine and carry gpu-out" >&2
    exit 2
fi
export CUDAMEM_REQUIRE_GPU=${CUDAMEM_REQUIRE_GPU:-1}
export RUST_BACKTRACE=1
limit=${CUDAMEM_STEP_TIMEOUT:-540}
ops=${PATTERN_OPS:-1000000}
sops=${PATTERN_SANITIZER_OPS:-1000000}
if [ "$CUDAMEM_REQUIRE_GPU" != 0 ]; then device=cuda:0; else device=${PATTERN_DEVICE:-cuda:0}; fi

declare -a summary
status=0
step() { # name, command...
    local name=$1
    shift
    echo
    echo "=== $name: $* ==="
    local t0=$SECONDS
    timeout --kill-after=15 "$limit" "$@"
    local rc=$?
    local verdict=PASS
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        verdict="FAIL (timed out after ${limit} s)"
        status=1
    elif [ $rc -ne 0 ]; then
        verdict="FAIL (exit $rc)"
        status=1
    fi
    summary+=("$(printf '%-28s %s in %d s' "$name" "$verdict" $((SECONDS - t0)))")
}
not_run() {
    summary+=("$(printf '%-28s %s' "$1" "NOT RUN ($2)")")
}

echo "=== machine ==="
cat "$dir/MANIFEST.txt" 2>/dev/null
date -u +%Y-%m-%dT%H:%M:%SZ
nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv 2>&1 || true
echo "device $device; $ops ops plain, $sops under memcheck, $((sops / 5)) under racecheck and synccheck; step limit ${limit} s"

step "pattern replay" "$exe" --device "$device" --min-ops "$ops"
if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --version | tail -n 1
    step "pattern replay, memcheck" compute-sanitizer --tool memcheck --leak-check full --error-exitcode 99 \
        "$exe" --device "$device" --min-ops "$sops"
    echo "(racecheck and synccheck check kernels; this program launches none of its own)"
    step "pattern replay, racecheck" compute-sanitizer --tool racecheck --error-exitcode 99 \
        "$exe" --device "$device" --min-ops $((sops / 5))
    step "pattern replay, synccheck" compute-sanitizer --tool synccheck --error-exitcode 99 \
        "$exe" --device "$device" --min-ops $((sops / 5))
else
    for t in memcheck racecheck synccheck; do not_run "pattern replay, $t" "compute-sanitizer not on the PATH"; done
fi

echo
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
if [ $status -eq 0 ]; then echo "ALL PASS"; else echo "SOME STEPS FAILED"; fi
exit $status
