#!/usr/bin/env bash
# Builds the Python package `cudamem` (a wheel, with maturin) and runs its tests on the
# simulated GPU. No GPU and no torch needed. Used by CI (.ci/run via scripts/test-all.sh).
#
#   bash python/build_and_test.sh            # venv in target/pyenv, wheel in target/wheels
#
# Environment:
#   PYTHON          the interpreter to create the venv with (default: python3; >= 3.9)
#   CUDAMEM_PYENV   the venv to use or create (default: target/pyenv)
#   PYTEST_ARGS     extra pytest arguments (e.g. "-k shim -x")
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
TORCH_FOR_TESTS=2.11.0
venv=${CUDAMEM_PYENV:-target/pyenv}
wheels=target/wheels

if [ ! -x "$venv/bin/python" ]; then
    echo "== creating the virtual environment $venv"
    "$PYTHON" -m venv "$venv"
fi
py="$(cd "$venv/bin" && pwd)/python"  # absolute (not resolved: it must stay the venv's)
if ! "$py" -c 'import maturin, pytest' 2>/dev/null && ! { [ -x "$(dirname "$py")/maturin" ] && "$py" -c 'import pytest' 2>/dev/null; }; then
    echo "== installing maturin and pytest"
    "$py" -m pip install -q --disable-pip-version-check "maturin>=1.7,<2" pytest
fi

echo "== building the wheel"
rm -f "$wheels"/cudamem-*.whl
"$(dirname "$py")/maturin" build --release --strip -m python/Cargo.toml -o "$wheels" -i "$py"
wheel=$(ls -t "$wheels"/cudamem-*.whl | head -n 1)
echo "built $wheel ($(du -h "$wheel" | cut -f1))"

echo "== installing it"
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"

echo "== torch $TORCH_FOR_TESTS (CPU use only), for the estimator's recorder tests"
# The GPU-free estimate records a job with torch on the meta device; its tests need torch but no
# GPU. The release the GPU checks run on; about 1 minute and 4 GB with its CUDA library wheels.
if "$py" -c 'import torch' 2>/dev/null || "$py" -m pip install -q --disable-pip-version-check "torch==$TORCH_FOR_TESTS"; then
    export CUDAMEM_TORCH_REQUIRED=1
else
    echo "could not install torch: test_estimate.py's recorder tests will skip and say so"
fi

echo "== torch and CUDA runtime headers of the oldest, the GPU-tested and the newest supported torch, for the compile test"
# The compile test fails rather than skips when these were fetched (CUDAMEM_TORCH_HEADERS_REQUIRED).
if python3 scripts/torch_headers.py 2.9.0 2.11.0 2.15.0; then
    export CUDAMEM_TORCH_HEADERS_REQUIRED=1
else
    echo "could not fetch them: test_native_compile.py will skip its compile tests and say so"
fi

echo "== testing it (CUDAMEM_DEVICE=sim)"
# Run from the tests folder so that `import cudamem` is the installed wheel, not the source tree.
cd python/tests
CUDAMEM_DEVICE=sim exec "$py" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-} .
