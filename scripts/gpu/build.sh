#!/usr/bin/env bash
# Builds, on the development machine, what the GPU run needs, and puts it in gpu-out/
# (git-ignored; carried to the GPU machine, which has no Rust toolchain). All release builds.
#   gpu-out/cuda/cudamem_cuda-unit  cudamem-cuda's unit tests
#   gpu-out/cuda/gpu_device         the CUDA device's GPU tests (crates/cuda/tests/gpu_device.rs)
#   gpu-out/cuda/driver_pairs       the driver-call bench (crates/cuda/examples/driver_pairs.rs)
#   gpu-out/cuda/vmm_call_costs     each VMM driver call timed (crates/cuda/examples/vmm_call_costs.rs)
#   gpu-out/cuda/MANIFEST.txt       commit, date, sizes and checksums
#   gpu-out/cudamem/api             the Rust API's tests (crates/cudamem/tests/api.rs, simulated device)
#   gpu-out/cudamem/gpu_allocator   the allocator's GPU tests (crates/cudamem/tests/gpu_allocator.rs)
#   gpu-out/cudamem/gpu_bench       the allocator bench (crates/cudamem/examples/gpu_bench.rs)
#   gpu-out/cudamem/quickstart      the quickstart example (crates/cudamem/examples/quickstart.rs)
#   gpu-out/cudamem/MANIFEST.txt    the same for these
# Debug info is stripped from the copies (symbols stay, so backtraces still name functions) to
# keep the carried folder small (about 20 MB in all). Then, on the GPU machine:
#   bash scripts/gpu/run-all.sh            (everything: tests, sanitizer, examples, benches)
#   bash scripts/gpu/run-device-tests.sh   (the CUDA device's checks only)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=gpu-out/cuda
json=$(mktemp)
trap 'rm -f "$json"' EXIT

cargo build -p cudamem-cuda --release --example driver_pairs --example vmm_call_costs
cargo build -p cudamem --release --example gpu_bench --example quickstart
cargo build -p cudamem-sharded --release --example sharded_cost
# Test binaries in the `ci` profile (release without LTO: same code, minutes less linking).
cargo test -p cudamem-cuda --profile ci --no-run --message-format=json >"$json"
cargo test -p cudamem --profile ci --no-run --message-format=json >>"$json"

# Test executables from cargo's JSON messages: one per test target (lib unit tests, gpu_device).
exe_of() { # $1 = target name, $2 = target kind
    jq -r --arg n "$1" --arg k "$2" 'select(.reason == "compiler-artifact" and .profile.test == true
        and .target.name == $n and (.target.kind | index($k)) and .executable != null) | .executable' \
        "$json" | tail -n 1
}
unit= gpu= api= galloc=
if command -v jq >/dev/null; then
    unit=$(exe_of cudamem_cuda lib)
    gpu=$(exe_of gpu_device test)
    api=$(exe_of api test)
    galloc=$(exe_of gpu_allocator test)
fi
# Fallback without jq: the newest matching file, excluding dep-info files.
newest() { ls -t target/ci/deps/"$1"-* | grep -v '\.d$' | head -n 1; }
[ -n "$unit" ] || unit=$(newest cudamem_cuda)
[ -n "$gpu" ] || gpu=$(newest gpu_device)
[ -n "$api" ] || api=$(newest api)
[ -n "$galloc" ] || galloc=$(newest gpu_allocator)
bench=target/release/examples/driver_pairs
vmm=target/release/examples/vmm_call_costs
gbench=target/release/examples/gpu_bench
quick=target/release/examples/quickstart
for f in "$unit" "$gpu" "$bench" "$vmm" "$api" "$galloc" "$gbench" "$quick"; do
    [ -x "$f" ] || { echo "build.sh: missing executable $f" >&2; exit 1; }
done

rm -rf "$out"
mkdir -p "$out"
objcopy --strip-debug "$unit" "$out/cudamem_cuda-unit"
objcopy --strip-debug "$gpu" "$out/gpu_device"
objcopy --strip-debug "$bench" "$out/driver_pairs"
objcopy --strip-debug "$vmm" "$out/vmm_call_costs"
{
    echo "cudamem-cuda GPU binaries"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$([ -z "$(git status --porcelain -- crates/cuda 2>/dev/null)" ] || echo ' + uncommitted changes in crates/cuda')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
    (cd "$out" && sha256sum cudamem_cuda-unit gpu_device driver_pairs vmm_call_costs)
} >"$out/MANIFEST.txt"
ls -l "$out"

out2=gpu-out/cudamem
rm -rf "$out2"
mkdir -p "$out2"
objcopy --strip-debug "$api" "$out2/api"
objcopy --strip-debug "$galloc" "$out2/gpu_allocator"
objcopy --strip-debug "$gbench" "$out2/gpu_bench"
objcopy --strip-debug "$quick" "$out2/quickstart"
objcopy --strip-debug target/release/examples/sharded_cost "$out2/sharded_cost"
{
    echo "cudamem GPU binaries"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$([ -z "$(git status --porcelain -- crates/cuda crates/cudamem crates/alloc crates/device 2>/dev/null)" ] || echo ' + uncommitted changes in crates/{cuda,cudamem,alloc,device}')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
    (cd "$out2" && sha256sum api gpu_allocator gpu_bench quickstart sharded_cost)
} >"$out2/MANIFEST.txt"
ls -l "$out2"
du -shc "$out" "$out2"

# The side-by-side replay of the shared traces on the simulated GPU and on cuda:0.
# And what mappings cost there (vmm_costs: map/unmap timings, cold and warm passes per policy).
# And slow_state: the allocator's CPU-side figures beside probes of the core, sampled together.
cargo build -p cudamem-replay --features cuda --release --example replay_gpu --example vmm_costs --example slow_state
mkdir -p gpu-out/replay
objcopy --strip-debug target/release/examples/replay_gpu gpu-out/replay/replay_gpu
objcopy --strip-debug target/release/examples/vmm_costs gpu-out/replay/vmm_costs
objcopy --strip-debug target/release/examples/slow_state gpu-out/replay/slow_state
