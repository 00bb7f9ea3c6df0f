#!/usr/bin/env bash
# Every test of the repository: the Rust workspace (unit, property, golden, fidelity, misuse,
# stress, report tests; GPU tests skip without a GPU and say so), the Python package's tests on
# the simulated GPU, and the offline viewer rendered in headless Chromium.
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== Rust workspace tests"
cargo test --workspace --profile ci --locked
echo "== The GPU tests again, with their output (without a GPU each one says SKIPPED and why)"
cargo test --profile ci --locked -p cudamem-cuda --test gpu_device -p cudamem --test gpu_allocator \
    -- --nocapture --test-threads=1 2>&1 | grep -E "^test |SKIPPED|^test result"
echo "== The GPU targets' judge (scripts/gpu/targets.py) on recorded H200 outputs"
python3 scripts/gpu/targets.py --self-test
echo "== Python package tests"
bash python/build_and_test.sh
echo "== The HTML viewer in headless Chromium"
CUDAMEM=target/ci/cudamem bash scripts/viz/browser-test.sh tests/data/bert_varlen_infer.pickle.gz target/viz-browser-test.png
echo "== A short fuzz run of every target (20 s each; any failing input fails the run)"
bash scripts/fuzz.sh 20
