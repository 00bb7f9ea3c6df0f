#!/usr/bin/env bash
# Every speed figure of issue #7 on the GPU machine, from the binaries scripts/gpu/build.sh put
# in gpu-out/ (carry gpu-out): the machine (lscpu, nvidia-smi), then
#   gpu_bench   x RUNS  cache-hit pair latency through the CUDA device beside cuMemAlloc/
#                       cuMemAllocAsync, and 1/2/4/8-thread throughput, one lock and sharded
#                       (5 rounds of 500 ms each; medians of the rounds)
#   sharded_cost x RUNS one thread: one lock / sharded on one stream / sharded, two streams
#                       seen; then `threads`: 1-8 threads of immediate alloc+free pairs
#   replay_gpu          every shared trace on the simulated device and cuda:0, warm ns per op
#                       (5 rounds of the whole table; medians of the rounds)
# Outputs go to $OUT (or gpu-out/bench) as one file per run; a summary of the threads rows and
# the targets' verdicts (scripts/gpu/targets.py) end the output. RUNS defaults to 3: these
# virtual machines vary a lot from minute to minute.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-out/bench}
runs=${RUNS:-3}
mkdir -p "$out"
{ lscpu | head -20; nvidia-smi -L; } >"$out/machine.txt" 2>&1
for i in $(seq 1 "$runs"); do
    gpu-out/cudamem/gpu_bench --device cuda:0 >"$out/gpu_bench-$i.txt" 2>&1
    { gpu-out/cudamem/sharded_cost; gpu-out/cudamem/sharded_cost threads; } >"$out/sharded_cost-$i.txt" 2>&1
done
gpu-out/replay/replay_gpu >"$out/replay_gpu.txt" 2>&1
for i in $(seq 1 "$runs"); do
    echo "== gpu_bench run $i"
    grep -E "^\| (512 B|64 MiB) \|" "$out/gpu_bench-$i.txt" | head -2
    grep -A7 "throughput, sharded" "$out/gpu_bench-$i.txt" | grep -E "^\| [18] \|"
    grep "merges" "$out/gpu_bench-$i.txt"
    grep -A2 "single lock" "$out/sharded_cost-$i.txt"
    grep "thread(s)" "$out/sharded_cost-$i.txt"
done
echo "== replay_gpu"
cat "$out/replay_gpu.txt"
echo "== issue #7's targets, run by run (scripts/gpu/targets.py)"
if command -v python3 >/dev/null; then python3 scripts/gpu/targets.py "$out"; else echo "python3 not found: not judged"; fi
