#!/usr/bin/env bash
# The zoo's will-it-fit check, on the GPU machine (torch 2.11 installed, no network, no cargo).
# On the development machine first:
#     bash scripts/gpu/torch/build.sh                  # -> gpu-out/cudamem-*.whl
#     bash scripts/gpu/torch/zoo_check.sh --wheels     # -> gpu-out/zoo-wheels/ (the zoo's libraries)
# (--wheels --with-numpy also fetches numpy, for a GPU machine without it: 16 MB more.)
# then, on the GPU machine, from the repository root (gpu-out/ carried along):
#     bash scripts/gpu/torch/zoo_check.sh [zoo_check.py options, e.g. --set validation --budget 500]
#     bash scripts/gpu/torch/zoo_check.sh --cap-check [cap_check.py options]   # the zoo under caps
# Results go to $OUT (zoo-<job>.json per job, zoo-check.json, zoo-check.md); run it again with
# the previous results in $OUT to go on with the jobs not done yet.
set -uo pipefail
cd "$(dirname "$0")/../../.."

# The zoo's libraries and what they need beyond torch, as tested with torch 2.11 (no
# dependencies resolved: torch and its own are on the GPU machine already; hf-xet, which only
# downloads, is left out).
ZOO_WHEELS="transformers==5.25.0 peft==0.21.2 timm==1.0.31 torchvision==0.26.0 torchaudio==2.11.0
accelerate==1.16.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0 regex==2026.12.2
PyYAML==6.0.4 tqdm==4.70.1 psutil==7.2.2 pillow==13.0.0 httpx2==2.17.0 httpcore2==2.17.0 h11==0.16.0
anyio==4.16.0 idna==3.20 typer==0.29.2 click==8.5.1 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2
shellingham==1.5.4 annotated-doc==0.0.7 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0
typing-inspection==0.4.5 kernels==0.19.1 tomlkit==0.15.3 truststore==0.10.5"

if [ "${1:-}" = "--wheels" ]; then
    [ "${2:-}" = "--with-numpy" ] && ZOO_WHEELS="$ZOO_WHEELS numpy==2.4.6"
    rm -rf gpu-out/zoo-wheels
    mkdir -p gpu-out/zoo-wheels
    # shellcheck disable=SC2086 # one package a word
    exec python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        -d gpu-out/zoo-wheels $ZOO_WHEELS
fi

runner=zoo_check.py
if [ "${1:-}" = "--cap-check" ]; then
    runner=cap_check.py
    shift
fi

main() {
    wheel=$(ls -t gpu-out/cudamem-*.whl 2>/dev/null | head -n 1)
    if [ -z "$wheel" ]; then
        echo "no gpu-out/cudamem-*.whl: run scripts/gpu/torch/build.sh on the development machine first"
        return 1
    fi
    site=/tmp/site-zoo-$$
    python3 -m pip install -q --no-index --no-deps --target "$site" "$wheel" || return 1
    if ls gpu-out/zoo-wheels/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target "$site" gpu-out/zoo-wheels/*.whl || return 1
    else
        echo "no gpu-out/zoo-wheels: the jobs that need transformers, timm, torchvision, torchaudio or peft are skipped"
    fi
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    export CUDAMEM_CACHE_DIR=/tmp/cudamem-cache-zoo-$$
    unset CUDAMEM_DEVICE CUDAMEM_POLICY CUDAMEM_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
    timeout 580 python3 "scripts/gpu/torch/$runner" ${OUT:+--out "$OUT"} "$@"
    rc=$?
    rm -rf "$site" "$CUDAMEM_CACHE_DIR"
    return $rc
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    main "$@" 2>&1 | tee -a "$OUT/${runner%.py}-log.txt"
    exit "${PIPESTATUS[0]}"
fi
main "$@"
