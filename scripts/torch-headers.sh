#!/usr/bin/env bash
# Fetches the headers that cudamem's native torch allocator class compiles against — torch's
# (from the torch wheel) and the CUDA runtime's (nvidia-cuda-runtime, nvidia-cuda-crt) — into
# target/torch-headers/, so that a machine without torch or CUDA can compile-check the class
# (python/tests/test_native_compile.py). Downloads about 550 MB once (pip's cache keeps it).
#     bash scripts/torch-headers.sh            # torch 2.11.0
#     TORCH_VERSION=2.12.0 bash scripts/torch-headers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version=${TORCH_VERSION:-2.11.0}
dest=target/torch-headers
if [ -f "$dest/torch-$version.ok" ]; then
    echo "torch $version headers already in $dest"
    exit 0
fi
rm -rf "$dest" && mkdir -p "$dest"
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
echo "downloading torch==$version, nvidia-cuda-runtime, nvidia-cuda-crt (wheels only, no dependencies; ~550 MB)"
python3 -m pip download -q --no-deps --disable-pip-version-check -d "$dl" "torch==$version" nvidia-cuda-runtime nvidia-cuda-crt
python3 - "$dl" "$dest" <<'PY'
import glob, sys, zipfile
dl, dest = sys.argv[1], sys.argv[2]
for whl in glob.glob(f"{dl}/*.whl"):
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if n.startswith("torch/include/") or "/include/" in n and n.startswith("nvidia/")]
        z.extractall(dest, names)
PY
touch "$dest/torch-$version.ok"
echo "headers in $dest: $(du -sh "$dest" | cut -f1)"
