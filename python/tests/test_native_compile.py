"""The native torch allocator class (cudamem/_shim/native_allocator.cpp and its headers) without a GPU.

* Its function table matches the Rust one (python/src/native.rs) field for field, in order.
* It compiles against real torch and CUDA runtime headers — those of an installed torch, or
  those that scripts/torch-headers.sh fetched into target/torch-headers/ (the test command does
  that) — so a pure virtual left out or a signature torch changed fails here, not at a user's
  install(). Without any such headers the compile test is skipped and says why.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CPP = HERE.parent / "cudamem" / "_shim" / "native_allocator.cpp"
API_H = CPP.parent / "native_api.h"
RUST = HERE.parent / "src" / "native.rs"


def _cpp_fields():
    body = re.search(r"struct NativeApi \{(.*?)\n\};", API_H.read_text(), re.S).group(1)
    return re.findall(r"(\w+)(?:\)\(|;)", "\n".join(l.split("//")[0] for l in body.splitlines()))


def _rust_fields():
    body = re.search(r"pub struct NativeApi \{(.*?)\n\}", RUST.read_text(), re.S).group(1)
    return re.findall(r"pub (\w+):", body)


def test_the_function_tables_match():
    cpp = [f for f in _cpp_fields() if f not in ("uint32_t",)]
    rust = _rust_fields()
    assert rust[:2] == ["version", "size"]
    assert cpp == rust, f"C++ {cpp}\nRust {rust}"


def _headers():
    """(torch include dirs, CUDA include dirs) or a reason to skip."""
    fetched = Path(os.environ.get("CUDAMEM_TORCH_HEADERS", ROOT / "target" / "torch-headers"))
    try:
        import torch  # noqa: F401

        from cudamem import _torch_native

        return _torch_native._torch_include_paths(torch), _torch_native.cuda_include_dirs()
    except Exception:
        pass
    inc = fetched / "torch" / "include"
    cuda = sorted(p for p in fetched.glob("nvidia/*/include") if (p / "cuda_runtime_api.h").is_file())
    if inc.is_dir() and cuda:
        return [str(inc), str(inc / "torch" / "csrc" / "api" / "include")], [str(c) for c in cuda]
    return None


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_the_class_compiles_against_torch_headers(tmp_path):
    found = _headers()
    if found is None:
        pytest.skip("no torch headers: neither an installed torch nor target/torch-headers "
                    "(bash scripts/torch-headers.sh fetches them)")
    torch_inc, cuda_inc = found
    cmd = ["g++", "-std=c++17", "-fPIC", "-c", "-D_GLIBCXX_USE_CXX11_ABI=1",
           *(f"-I{p}" for p in torch_inc + cuda_inc), str(CPP), "-o", str(tmp_path / "native.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    syms = subprocess.run(["nm", "-C", str(tmp_path / "native.o")], capture_output=True, text=True).stdout
    assert "cudamem_native_install" in syms and "cudamem_native_version" in syms
