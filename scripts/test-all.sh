#!/usr/bin/env bash
# Every test of the repository: the Rust workspace (unit, property, golden, fidelity, misuse,
# stress, report tests; GPU tests skip without a GPU and say so), the Python package's tests on
# the simulated GPU, the offline viewer rendered in headless Chromium, and a short fuzz run.
# This is the README's test command and what CI runs (.ci/run).
#
# What it installs when missing, each announced before it starts: Debian's chromium and
# fonts-dejavu-core (apt-get, needs root; scripts/viz/browser-test.sh), cargo-fuzz
# (cargo install, into ~/.cargo/bin; scripts/fuzz.sh), and a virtual environment in
# target/pyenv with maturin, pytest and torch (CPU use only, for the estimator's recorder tests)
# from PyPI (python/build_and_test.sh); it also downloads,
# once, the wheels of torch 2.9.0, 2.11.0 and 2.15.0 and the CUDA runtime (about 1.7 GB) whose
# headers it unpacks into target/torch-headers (scripts/torch_headers.py; nothing is installed).
set -euo pipefail
cd "$(dirname "$0")/.."

PHASES=6
START=$(date +%s)
phase_start=$START
k=0

elapsed() {
    local s=$(($(date +%s) - $1))
    printf '%dm%02ds' $((s / 60)) $((s % 60))
}

phase() {
    if [ "$k" -gt 0 ]; then
        echo "[$k/$PHASES] done in $(elapsed "$phase_start")"
    fi
    k=$((k + 1))
    phase_start=$(date +%s)
    echo
    echo "[$k/$PHASES] $1"
}

echo "test-all.sh: $PHASES phases; from a fresh clone on 2 cores roughly 9-15 minutes, most of it compiling"
echo "(the first phase compiles the workspace; a phase may print nothing for a minute or two)."
installs=()
command -v chromium >/dev/null 2>&1 ||
    installs+=("chromium and fonts-dejavu-core, with apt-get (needs root), for the viewer test (phase 5)")
(cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz --version >/dev/null 2>&1) ||
    installs+=("cargo-fuzz, with 'cargo install cargo-fuzz' into ~/.cargo/bin (a few minutes), for phase 6")
venv=${CUDAMEM_PYENV:-target/pyenv}
if [ ! -x "$venv/bin/python" ]; then
    installs+=("a Python virtual environment in $venv with maturin and pytest from PyPI, for phase 4")
elif ! "$venv/bin/python" -c 'import pytest' 2>/dev/null || [ ! -x "$venv/bin/maturin" ]; then
    installs+=("maturin and pytest from PyPI into $venv, for phase 4")
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
    installs+=("torch 2.11.0 into $venv with pip (about 1 minute and 4 GB with its CUDA library wheels; used on the CPU only), for phase 4's estimator tests")
fi
for v in 2.9.0 2.11.0 2.15.0; do
    [ -f "target/torch-headers/$v/.ok" ] ||
        installs+=("the torch $v wheel, downloaded with pip (about 550 MB), headers unpacked into target/torch-headers/$v (not installed), for phase 4's compile test")
done
[ -f target/torch-headers/cuda/.ok ] ||
    installs+=("the CUDA runtime wheels (nvidia-cuda-runtime, nvidia-cuda-crt), headers unpacked into target/torch-headers/cuda, for phase 4's compile test")
if [ ${#installs[@]} -gt 0 ]; then
    echo "It will install or download:"
    printf '  - %s\n' "${installs[@]}"
else
    echo "Nothing to install: chromium, cargo-fuzz, $venv and the torch headers are present."
fi

phase "Rust workspace tests (cargo test --workspace --profile ci)"
cargo test --workspace --profile ci --locked

phase "The GPU tests again, with their output (without a GPU each one says SKIPPED and why)"
gpu_log=$(mktemp)
cargo test --profile ci --locked -p cudamem-cuda --test gpu_device -p cudamem --test gpu_allocator \
    -- --nocapture --test-threads=1 2>&1 | tee "$gpu_log" | grep -E "^test |SKIPPED|^test result"
# A skipped GPU test passes (libtest has no "skipped" outcome); count them here instead.
gpu_total=$(grep -cE '^test .* \.\.\. ' "$gpu_log" || true)
gpu_skipped=$(grep -cE '^test .* \.\.\. SKIPPED' "$gpu_log" || true)
rm -f "$gpu_log"
echo "GPU tests: $((gpu_total - gpu_skipped)) ran on a GPU, $gpu_skipped skipped (no usable CUDA device), of $gpu_total"

phase "The GPU targets' judge (scripts/gpu/targets.py) on recorded H200 outputs"
python3 scripts/gpu/targets.py --self-test

phase "Python package: build the wheel with maturin, run its tests on the simulated GPU"
bash python/build_and_test.sh

phase "The HTML viewer in headless Chromium"
CUDAMEM=target/ci/cudamem bash scripts/viz/browser-test.sh tests/data/bert_varlen_infer.pickle.gz target/viz-browser-test.png

phase "A short fuzz run of every target (20 s each, 5 targets; any failing input fails the run)"
bash scripts/fuzz.sh 20

echo "[$k/$PHASES] done in $(elapsed "$phase_start")"
echo
echo "test-all.sh: all $PHASES phases passed in $(elapsed "$START")"
