#!/usr/bin/env bash
# Every test of the repository: the Rust workspace (unit, property, golden, fidelity tests; GPU
# tests skip without a GPU and say so), then the Python package's tests on the simulated GPU.
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== Rust workspace tests"
cargo test --workspace --release --locked
if [ -f python/build_and_test.sh ]; then
  echo "== Python package tests"
  bash python/build_and_test.sh
fi
