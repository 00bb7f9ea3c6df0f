#!/usr/bin/env bash
# PyTorch's own allocator tests (its test/test_cuda.py) with torch's allocator and with cudamem,
# on the GPU machine (one H200, Python 3.12, torch 2.11, pytest; no network). PyTorch's file is
# not part of this repository: it lies in gpu-out/pytorch-tests/ (git-ignored), or in
# $PYTORCH_TESTS_DIR. From the repository root, with the wheel installed to a folder on PYTHONPATH:
#     python3 -m pip install -q --no-index --no-deps --target "${TMPDIR:-/tmp}/site" gpu-out/cudamem-*.whl
#     PYTHONPATH="${TMPDIR:-/tmp}/site" bash scripts/gpu/torch/pytorch_tests.sh
# Without network, fetch torch's test dependencies first on a machine with it:
#     python3 -m pip download -d gpu-out/pywheels --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 --platform any expecttest psutil hypothesis
# PYTORCH_TESTS_MODE: "process" (default: all selected tests in one pytest process per allocator),
# "isolated" (one process per test and allocator: pytorch_tests_isolated.py), or "both".
# PYTORCH_TESTS_SELECT replaces the regular expression that picks tests by name;
# PYTORCH_TESTS_PART=K/N runs the K-th of N equal slices of the selection (a full run on a machine
# with an empty extension cache needs about 10 minutes; two parts fit calls of 600 s each), and
# scripts/gpu/torch/pytorch_tests_merge.py combines the parts' pytorch-tests.json.
# Environment passes through, e.g. PYTORCH_TEST_CUDA_MEM_LEAK_CHECK=1 adds torch's leak check to
# every test (off unless set). The stored test_cuda.py predates torch 2.11: the plugin fills in the
# names it imports that 2.11 lacks (listed in the log), so tests relying on those fail in both runs.
# Steps:
#   (1) load cudamem's native allocator once outside pytest (compiles it if not cached; errors show here)
#   (2) collect test_cuda.py's ids (--collect-only -q) and keep the allocator-related names;
#   (2b) run those that build C++ extensions (load_inline) once, to fill torch's extension cache
#   (3) run them with torch's allocator, then (4) with cudamem installed by cudamem_pytest_plugin
#       before collection; each pytest process under `timeout`, each test under a 60 s watchdog
#       (those of (2b): CUDAMEM_PYTEST_BUILD_TIMEOUT, 300 s)
#       (a hang or crash costs that test and pytest restarts on the rest)
#   (5) the table (test, native, cudamem) and the summary
# The whole run stays within $PYTORCH_TESTS_BUDGET_S seconds (default 470).
# Output: the log on stdout; with $OUT set, $OUT/pytorch-tests.txt (the log),
# $OUT/pytorch-tests.json and $OUT/pytorch-tests-<phase>.log (pytest's own output).
set -uo pipefail
cd "$(dirname "$0")/../../.."
here=scripts/gpu/torch
. $here/common.sh

main() {
    start=$(date +%s)
    tests=${PYTORCH_TESTS_DIR:-gpu-out/pytorch-tests}
    [ -f "$tests/test_cuda.py" ] || { echo "no $tests/test_cuda.py: fetch PyTorch's test/test_cuda.py there first"; return 1; }
    python3 -c 'import cudamem' 2>/dev/null || {
        echo "cudamem is not importable: install the wheel to a folder and put it on PYTHONPATH (see the top of this script)"
        return 1
    }
    python3 -c 'import pytest' 2>/dev/null || { echo "pytest is not installed"; return 1; }
    # torch's test helpers need expecttest (and test_cuda.py psutil, hypothesis), which a machine
    # without network may lack: wheels fetched beforehand into $PYTORCH_TEST_WHEELS install here.
    wheels=${PYTORCH_TEST_WHEELS:-gpu-out/pywheels}
    if ! python3 -c 'import expecttest' 2>/dev/null && ls "$wheels"/*.whl >/dev/null 2>&1; then
        deps=$(mktemp -d "${TMPDIR:-/tmp}/pytorch-test-deps.XXXXXX")
        python3 -m pip install -q --no-index --no-deps --target "$deps" "$wheels"/*.whl || return 1
        export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$deps"
        echo "test dependencies from $wheels: $(ls "$wheels" | tr '\n' ' ')"
    fi
    python3 -c 'import sys, torch, pytest, cudamem; print("python", sys.version.split()[0], "torch", torch.__version__,
        "cuda", torch.version.cuda, "pytest", pytest.__version__, "cudamem", getattr(cudamem, "__version__", "?"), "from", cudamem.__file__)'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    echo "test file: $tests/test_cuda.py ($(wc -c < "$tests/test_cuda.py") bytes)"
    # The plugin must be importable from pytest's working directory (a scratch one: tests write files there).
    export PYTHONPATH="$(pwd)/$here${PYTHONPATH:+:$PYTHONPATH}"
    # Only our plugin: an auto-loaded third-party plugin could touch CUDA before install().
    export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
    clean_env
    work=$(mktemp -d "${TMPDIR:-/tmp}/pytorch-tests.XXXXXX")
    budget=${PYTORCH_TESTS_BUDGET_S:-470}

    step "(1) cudamem's native allocator, outside pytest"
    timeout 180 python3 "$here/install_check.py" || { echo "cudamem.torch.install(native=True) FAILED: no point running the tests with cudamem"; return 1; }

    step "(2)-(5) collect, run with torch's allocator, run with cudamem, compare"
    python3 "$here/pytorch_tests_compare.py" "$tests" "$work" "$(( start + budget ))" "${OUT:-}"
    rc=$?
    case "${PYTORCH_TESTS_MODE:-process}" in
    isolated | both)
        step "(6) one test per process (pytorch_tests_isolated.py)"
        left=$(( budget - ($(date +%s) - start) ))
        [ -f "$work/selected.json" ] && TORCH_EXTENSIONS_DIR="$work/torch-extensions" \
            timeout $(( left + 30 )) python3 "$here/pytorch_tests_isolated.py" \
            --tests "$tests" --ids "$work/selected.json" --budget-s "$left" ${OUT:+--out "$OUT"} || rc=1
        ;;
    esac
    step "done (rc=$rc)"
    rm -rf "$work"
    return $rc
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    main 2>&1 | tee "$OUT/pytorch-tests.txt"
    exit "${PIPESTATUS[0]}"
fi
main
