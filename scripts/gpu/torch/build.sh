#!/usr/bin/env bash
# Builds, on the development machine, the wheel of the Python package `cudamem` for the GPU run
# of scripts/gpu/torch/run.sh, and puts it in gpu-out/ (git-ignored; carried to the GPU
# machine, which has no Rust toolchain). An abi3 wheel: any CPython >= 3.9 (the GPU machine has
# 3.12). Uses the virtual environment of python/build_and_test.sh (target/pyenv) for maturin.
set -euo pipefail
cd "$(dirname "$0")/../../.."

venv=${CUDAMEM_PYENV:-target/pyenv}
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
[ -x "$venv/bin/maturin" ] || "$venv/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.7,<2"

mkdir -p gpu-out
rm -f gpu-out/cudamem-*.whl
"$venv/bin/maturin" build --release --strip -m python/Cargo.toml -o gpu-out -i "$venv/bin/python"
{
    echo "cudamem wheel for scripts/gpu/torch/run.sh"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$([ -z "$(git status --porcelain -- python crates 2>/dev/null)" ] || echo ' + uncommitted changes')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(rustc --version)"
    (cd gpu-out && sha256sum cudamem-*.whl)
} >gpu-out/MANIFEST-torch.txt
ls -l gpu-out/cudamem-*.whl
