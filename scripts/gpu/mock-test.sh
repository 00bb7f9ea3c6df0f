#!/usr/bin/env bash
# Runs the GPU tests, examples and benches of cudamem-cuda and cudamem on this machine against a
# mock libcuda (crates/cuda/tests/mock/mock_libcuda.c: host memory standing in for the GPU), so
# that the test and bench logic is checked before a scarce GPU run. It proves nothing about the
# real driver: scripts/gpu/run-all.sh on the GPU machine does that.
#
#   bash scripts/gpu/mock-test.sh            # tests, then the examples and benches
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/mock-libcuda
mkdir -p "$out"
gcc -O1 -g -shared -fPIC -Wall -Wextra -Wno-unused-parameter -o "$out/libcuda.so" \
    crates/cuda/tests/mock/mock_libcuda.c -lpthread
export LD_LIBRARY_PATH="$PWD/$out${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDAMEM_REQUIRE_GPU=1 MOCK_CUDA_TOTAL=${MOCK_CUDA_TOTAL:-4294967296}
cargo test -p cudamem-cuda --release -- --nocapture --test-threads=1
cargo run -p cudamem-cuda --release --example driver_pairs -- --iters 50
cargo test -p cudamem --release --test gpu_allocator --test api -- --nocapture --test-threads=1
cargo run -p cudamem --release --example quickstart -- cuda:0
cargo run -p cudamem --release --example gpu_bench -- --device cuda:0 --iters 500 --duration-ms 200
