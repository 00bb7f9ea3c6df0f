#!/usr/bin/env python3
"""Fetches the headers that cudamem's C++ for torch compiles against, one torch release at a time.

For each release asked for, pip downloads the torch wheel (no dependencies, nothing installed)
and only its ``torch/include/`` tree is unpacked into ``target/torch-headers/<version>/``; the
CUDA runtime headers that torch's c10/cuda headers include (``nvidia-cuda-runtime``,
``nvidia-cuda-crt``) are unpacked once into ``target/torch-headers/cuda/``. A release already
unpacked (its ``.ok`` marker exists) is not fetched again, and pip's cache keeps the wheels.
A torch wheel is about 550 MB; its headers are about 60 MB.

    python3 scripts/torch_headers.py                 # 2.11.0
    python3 scripts/torch_headers.py 2.9.0 2.15.0    # those releases
    python3 scripts/torch_headers.py --all           # every release cudamem supports

Prints, last, one line per release: ``<version> <include folder>``.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_module(name: str, path: Path):
    """A module of the package by its path, without importing cudamem itself (which needs its
    build): the modules the scripts use import nothing of cudamem's at load time."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RELEASES = load_module("_torch_versions", ROOT / "python/cudamem/_torch_versions.py").RELEASES

DEFAULT = "2.11.0"


def dest_root() -> Path:
    return ROOT / "target" / "torch-headers"


def _download(spec: list, tmp: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", "-d", tmp, *spec]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"torch_headers.py: pip download {' '.join(spec)} failed:\n{r.stderr[-2000:]}")


def _unpack(tmp: str, dest: Path, keep) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for whl in glob.glob(f"{tmp}/*.whl"):
        with zipfile.ZipFile(whl) as z:
            z.extractall(dest, [n for n in z.namelist() if keep(n)])


def fetch_cuda() -> Path:
    """The CUDA runtime headers (shared by every release), fetched once."""
    dest = dest_root() / "cuda"
    if not (dest / ".ok").is_file():
        print("downloading nvidia-cuda-runtime and nvidia-cuda-crt (headers only are kept)", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            _download(["nvidia-cuda-runtime", "nvidia-cuda-crt"], tmp)
            _unpack(tmp, dest, lambda n: n.startswith("nvidia/") and "/include/" in n)
        (dest / ".ok").touch()
    return dest


def cuda_include_dirs() -> list:
    dest = fetch_cuda()
    return sorted(str(p) for p in dest.glob("nvidia/*/include") if p.is_dir())


def fetch(version: str) -> Path:
    """``target/torch-headers/<version>/torch/include``, fetched first if it is not there."""
    dest = dest_root() / version
    if not (dest / ".ok").is_file():
        print(f"downloading torch=={version} (about 550 MB; headers only are kept)", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            _download([f"torch=={version}"], tmp)
            _unpack(tmp, dest, lambda n: n.startswith("torch/include/"))
        (dest / ".ok").touch()
    return dest / "torch" / "include"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help=f"torch releases (default {DEFAULT})")
    ap.add_argument("--all", action="store_true", help="every release in cudamem._torch_versions.RELEASES")
    args = ap.parse_args()
    versions = list(RELEASES) if args.all else (args.versions or [DEFAULT])
    fetch_cuda()
    for v in versions:
        print(v, fetch(v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
