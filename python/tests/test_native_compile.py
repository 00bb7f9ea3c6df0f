"""The native torch allocator class (cudamem/_shim/native_allocator.cpp and its headers) without a GPU.

* Its function table matches the Rust one (python/src/native.rs) field for field, in order.
* It and the pluggable path's shim compile against the real headers of the oldest supported
  torch, the one the GPU checks run on and the newest (scripts/torch_headers.py fetches them into
  target/torch-headers/; the test command does, and then sets CUDAMEM_TORCH_HEADERS_REQUIRED=1 so
  that missing headers fail instead of skip), with the command and C++ standard install() uses,
  so a pure virtual left out or a signature torch changed fails here, not at a user's install().
  scripts/torch_matrix.py compiles against every supported release.
* A torch older than the supported range is refused by name at compile time.
"""

import importlib.util
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
RUST = HERE.parent / "src" / "abi.rs"


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


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The modules the real build uses: the same command, the same C++ standard per release.
VERSIONS = _load("_torch_versions", HERE.parent / "cudamem" / "_torch_versions.py")
BUILD = _load("_torch_build", HERE.parent / "cudamem" / "_torch_build.py")
HEADERS = ROOT / "target" / "torch-headers"
# The oldest supported release, the one the GPU checks run on, and the newest.
CHECKED = (VERSIONS.RELEASES[0], "2.11.0", VERSIONS.RELEASES[-1])


def test_the_checked_releases_span_the_supported_range():
    assert VERSIONS.parse(CHECKED[0]) == VERSIONS.OLDEST
    assert VERSIONS.parse(CHECKED[-1]) == VERSIONS.NEWEST


def _headers(version):
    """(include dirs) of scripts/torch_headers.py's folders, or None."""
    inc = HEADERS / version / "torch" / "include"
    cuda = sorted(p for p in (HEADERS / "cuda").glob("nvidia/*/include") if (p / "cuda_runtime_api.h").is_file())
    if (HEADERS / version / ".ok").is_file() and cuda:
        return [str(inc), str(inc / "torch" / "csrc" / "api" / "include"), *map(str, cuda)]
    return None


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
@pytest.mark.parametrize("version", CHECKED)
@pytest.mark.parametrize("src", [CPP, CPP.parent / "torch_shim.cpp"], ids=["native-class", "shim"])
def test_compiles_against_the_release(tmp_path, version, src):
    includes = _headers(version)
    if includes is None:
        reason = (f"no torch {version} headers in target/torch-headers "
                  f"(python3 scripts/torch_headers.py {version} fetches them)")
        if os.environ.get("CUDAMEM_TORCH_HEADERS_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    out = tmp_path / "o.o"
    cmd = BUILD.compile_command("g++", VERSIONS.cxx_standard(version), 1, includes, src, out, optimize="-O0")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    if src == CPP:
        syms = subprocess.run(["nm", "-C", str(out)], capture_output=True, text=True).stdout
        assert "cudamem_native_install" in syms and "cudamem_native_version" in syms


def test_an_older_torch_is_refused_at_compile_time(tmp_path):
    """native_versions.h refuses a torch older than the oldest supported one, by name."""
    includes = _headers(CHECKED[0])
    if includes is None:
        pytest.skip("no torch headers (python3 scripts/torch_headers.py fetches them)")
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "version.h").write_text("#define TORCH_VERSION_MAJOR 2\n#define TORCH_VERSION_MINOR 8\n")
    cmd = ["g++", "-std=c++17", "-fsyntax-only", f"-I{tmp_path}", *(f"-I{p}" for p in includes), str(CPP)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "supports torch 2.9 and newer" in r.stderr
