"""Compiling a C++ library against the installed torch, once, into the trusted build cache.

Both of cudamem's C++ libraries for torch are built here: the native allocator class
(:mod:`cudamem._torch_native`) and the pluggable path's shim (:func:`cudamem.torch.build_shim`).
One ``g++`` command (``$CXX``, else ``g++`` or ``c++``; :func:`compile_command`, which the
compile matrix ``scripts/torch_matrix.py`` uses too), with torch's ``_GLIBCXX_USE_CXX11_ABI`` and
the C++ standard that torch's release requires (:func:`cudamem._torch_versions.cxx_standard`). The
library's cache name carries torch's version and a hash of the source (with the headers beside
it), torch's version, the ABI flag and the caller's interface version, so a change of any of
them builds anew; the cache
(:mod:`cudamem._cache`) checks who could have written a library before it is loaded.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Type


def compiler() -> Optional[str]:
    """``$CXX`` (a name on the PATH or a path), else ``g++``, else ``c++``; None if none."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or (cxx if os.path.exists(cxx) else None)
    return shutil.which("g++") or shutil.which("c++")


def torch_include_paths(torch: Any) -> List[str]:
    """The header folders of the installed torch (every torch wheel ships them)."""
    try:
        from torch.utils.cpp_extension import include_paths

        paths = list(include_paths())
        if paths:
            return paths
    except Exception:  # cpp_extension needs setuptools; the headers are there regardless
        pass
    root = Path(torch.__file__).resolve().parent / "include"
    return [str(root), str(root / "torch" / "csrc" / "api" / "include")]


def compile_command(
    cxx: str,
    std: str,
    abi: int,
    includes: Sequence[str],
    src: Path,
    out: Path,
    libdir: Optional[Path] = None,
    libraries: Sequence[str] = (),
    optimize: str = "-O2",
) -> List[str]:
    """The compiler command for ``src``: a shared library linked to ``libraries`` of ``libdir``,
    or, without ``libdir``, an object file only (the compile checks have headers, no libraries;
    they pass ``optimize="-O0"``: whether it compiles does not depend on it)."""
    cmd = [cxx, optimize, "-fPIC", f"-std={std}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in includes)]
    if libdir is None:
        return [*cmd, "-c", str(src), "-o", str(out)]
    return [*cmd, "-shared", str(src), "-o", str(out), f"-L{libdir}", *(f"-l{lib}" for lib in libraries),
            f"-Wl,-rpath,{libdir}"]  # fmt: skip


def build_for_torch(
    torch: Any,
    src: Path,
    prefix: str,
    interface_version: int,
    includes: List[str],
    libraries: List[str],
    error: Type[Exception],
    what: str,
    verbose: bool = False,
) -> str:
    """The cached library for ``src`` (``<prefix>-torch<version>-<hash>.so``), compiled first if
    needed, linked to the named libraries of torch's ``lib`` folder. Raises ``error`` with the
    command and the compiler's output when it cannot be built."""
    from cudamem import _cache, _torch_versions

    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    # The headers beside the source are part of it (the native class includes its own).
    sources = [src.read_bytes(), *(h.read_bytes() for h in sorted(src.parent.glob("*.h")))]
    key = hashlib.sha256(
        b"\0".join([*sources, torch.__version__.encode(), str(abi).encode(), str(interface_version).encode()])
    ).hexdigest()[:16]
    tag = re.sub(r"[^A-Za-z0-9_.+-]", "_", torch.__version__)
    name = f"{prefix}-torch{tag}-{key}.so"
    cached = _cache.cached_artifact(name)
    if cached is not None:
        return str(cached)
    cxx = compiler()
    if cxx is None:
        raise error("no C++ compiler found (looked for $CXX, g++, c++)")
    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    std = _torch_versions.cxx_standard(torch.__version__)

    def build(tmp: Path) -> None:
        cmd = compile_command(cxx, std, abi, includes, src, tmp, torch_lib, libraries)
        if verbose:
            print(f"cudamem: compiling {what}:", " ".join(cmd), file=sys.stderr)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise error(f"compiling {what} failed:\n$ {' '.join(cmd)}\n{(r.stdout + r.stderr)[-6000:]}".rstrip())

    # Stored atomically with its digest: concurrent processes (ranks) may race here.
    return str(_cache.build_artifact(name, build))
