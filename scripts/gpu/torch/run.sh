#!/usr/bin/env bash
# The PyTorch run of cudamem on the GPU machine (one H200; Python 3.12, torch 2.11, no network,
# no cargo). Build the wheel first on the development machine:
#     bash scripts/gpu/torch/build.sh          # -> gpu-out/cudamem-*.whl
# then, on the GPU machine, from the repository root (gpu-out/ carried along):
#     bash scripts/gpu/torch/run.sh
# Steps (each bounded by a timeout; the whole run takes about 5 minutes, at most ~8):
#   (a) compile the C++ shim against the installed torch and print its path (errors show here)
#   (b) the basic examples with cudamem installed, with cudamem's stats after each step
#   (c) out of memory through torch, caught as torch.OutOfMemoryError, then training goes on;
#       plus: install() after CUDA init, the no-compiler fallback, memory fraction, streams
#   (d) GPT-2 small training, ResNet-50 training, variable-length BERT inference: native torch
#       vs cudamem, each in its own process; a table and JSON
# Output: the log on stdout; when $OUT is set, $OUT/torch-log.txt, $OUT/torch-workloads.md and
# $OUT/torch-workloads.json.
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=scripts/gpu/torch
. $here/common.sh

main() {
    start=$(date +%s)
    step "setup"
    install_wheel || return 1
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    echo "compiler: $(command -v "${CXX:-g++}" || echo none) $(${CXX:-g++} --version 2>/dev/null | head -n 1)"

    rc=0
    step "(a) compile the torch shim"
    timeout 180 python3 $here/shim_check.py || { echo "shim check FAILED (rc=$?)"; rc=1; }

    step "(b, c) examples, out of memory, hooks"
    timeout 240 python3 $here/examples.py || { echo "examples FAILED (rc=$?)"; rc=1; }

    step "(d) workloads: native vs cudamem"
    # Seconds left for the workloads: the whole script must stay within ~8 minutes.
    left=$(( 450 - ($(date +%s) - start) ))
    [ "$left" -gt 60 ] || left=60
    timeout $(( left + 30 )) python3 $here/workloads.py --budget "$left" ${OUT:+--out "$OUT"} || { echo "workloads FAILED (rc=$?)"; rc=1; }

    step "(e) memory history and snapshots: PyTorch's _memory_viz on cudamem's snapshot"
    timeout 120 python3 $here/history_check.py || { echo "history check FAILED (rc=$?)"; rc=1; }

    step "done (rc=$rc)"
    rm -rf "$CUDAMEM_CACHE_DIR"
    return $rc
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    main 2>&1 | tee "$OUT/torch-log.txt"
    exit "${PIPESTATUS[0]}"
fi
main
