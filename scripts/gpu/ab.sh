#!/usr/bin/env bash
# A/B of builds on the GPU machine, alternated so that a machine's drift hits every build alike.
#   ROUNDS=2 bash scripts/gpu/ab.sh NAME=DIR [NAME=DIR ...]
# Each DIR holds a `gpu_bench` (crates/cudamem/examples/gpu_bench.rs) and, optionally, a
# `replay_gpu` (crates/replay/examples/replay_gpu.rs) built from the commit being compared: e.g.
# gpu-out/cudamem for the current build (scripts/gpu/build.sh) beside gpu-out/ab/base for an older
# one. Per round and build: the pair latency rows (ns: cudamem, cuMemAlloc+Free,
# cuMemAllocAsync+FreeAsync), the 1- and 8-thread rows of the three throughput tables (one lock,
# sharded:True, one allocator per thread: pairs/s, ÷ 1 thread, ÷ default's 1 thread), the
# sharded merges line, and the replay table. Full outputs go to $AB_OUT/ab-NAME-ROUND.txt if
# AB_OUT is set (not $OUT: a device call returns at most 8 files).
# replay_gpu runs REPLAY_ROUNDS rounds of its table per A/B round (default 1: the alternation is
# the rounds here; ROUNDS, this script's own, is not passed on). gpu_bench's thread rows are
# comparable only between builds that measure them the same way (rounds and window length).
set -uo pipefail
cd "$(dirname "$0")/../.."
rounds=${ROUNDS:-2}
[ $# -gt 0 ] || { echo "usage: ab.sh NAME=DIR [NAME=DIR ...]" >&2; exit 2; }
for spec in "$@"; do
    dir=${spec#*=}
    [ -x "$dir/gpu_bench" ] || { echo "ab.sh: no executable $dir/gpu_bench" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
    for spec in "$@"; do
        name=${spec%%=*} dir=${spec#*=}
        f=$tmp/ab-$name-$r.txt
        start=$(date +%s)
        "$dir/gpu_bench" --device cuda:0 >"$f" 2>&1
        [ -x "$dir/replay_gpu" ] && ROUNDS=${REPLAY_ROUNDS:-1} "$dir/replay_gpu" >>"$f" 2>&1
        echo "== round $r $name ($(( $(date +%s) - start )) s)"
        grep -E "^\| [0-9]+ (B|KiB|MiB) \| [0-9]+ \| [0-9]+ \|" "$f" | head -5
        grep -E "^\| [18] \| [0-9]+ \|" "$f"
        grep -E "merges" "$f" | head -2
        grep -E "^\| [a-z0-9_]+ \| (pytorch|cudamem) \|" "$f"
        grep -E "disagreements" "$f"
        [ -n "${AB_OUT:-}" ] && cp "$f" "$AB_OUT/"
    done
done
