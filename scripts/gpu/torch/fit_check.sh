#!/usr/bin/env bash
# Will it fit, on the GPU machine (one H200; Python 3.12, torch 2.11, no network, no cargo).
# Build the wheel first on the development machine:
#     bash scripts/gpu/torch/build.sh          # -> gpu-out/cudamem-*.whl
# then, on the GPU machine, from the repository root (gpu-out/ carried along):
#     bash scripts/gpu/torch/fit_check.sh [fit_check.py options, e.g. --only gpt2,bert --with-cudamem]
# Runs scripts/gpu/torch/fit_check.py within ~8 minutes. Output: the log on stdout; with $OUT
# set, $OUT/fit-check-log.txt, $OUT/fit-check.md and $OUT/fit-check.json.
set -uo pipefail
cd "$(dirname "$0")/../../.."

main() {
    wheel=$(ls -t gpu-out/cudamem-*.whl 2>/dev/null | head -n 1)
    if [ -z "$wheel" ]; then
        echo "no gpu-out/cudamem-*.whl: run scripts/gpu/torch/build.sh on the development machine first"
        return 1
    fi
    echo "wheel: $wheel"
    site=/tmp/site-fit-$$
    python3 -m pip install -q --no-index --no-deps --target "$site" "$wheel" || return 1
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    export CUDAMEM_CACHE_DIR=/tmp/cudamem-cache-fit-$$
    unset CUDAMEM_DEVICE CUDAMEM_POLICY CUDAMEM_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    timeout 540 python3 scripts/gpu/torch/fit_check.py ${OUT:+--out "$OUT"} "$@"
    rc=$?
    rm -rf "$site" "$CUDAMEM_CACHE_DIR"
    return $rc
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    main "$@" 2>&1 | tee "$OUT/fit-check-log.txt"
    exit "${PIPESTATUS[0]}"
fi
main "$@"
