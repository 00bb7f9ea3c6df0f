#!/usr/bin/env python3
"""The compile matrix: cudamem's C++ for torch, compiled against the headers of each torch release.

For every release asked for (default: every one in ``cudamem/_torch_versions.py``), fetches its
headers if they are not there yet (``scripts/torch_headers.py``: pip downloads the wheel, keeps
the headers) and compiles, with the command and C++ standard that ``cudamem.torch.install()``
uses, the native allocator class (``_shim/native_allocator.cpp``) and the pluggable path's shim
(``_shim/torch_shim.cpp``) to object files. Prints one table row per release and exits 1 if any
compile failed, printing the first errors of each failure.

    python3 scripts/torch_matrix.py                      # every supported release
    python3 scripts/torch_matrix.py 2.9.0 2.11.0 2.15.0  # these
    python3 scripts/torch_matrix.py --markdown docs/torch-versions.md   # also write the table
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIM = ROOT / "python" / "cudamem" / "_shim"

import torch_headers as headers_mod  # noqa: E402  (beside this script)

versions_mod = headers_mod.load_module("_torch_versions", ROOT / "python/cudamem/_torch_versions.py")
build_mod = headers_mod.load_module("_torch_build", ROOT / "python/cudamem/_torch_build.py")

TARGETS = (("native class", SHIM / "native_allocator.cpp"), ("shim", SHIM / "torch_shim.cpp"))


def compile_one(cxx: str, version: str, src: Path, cuda: list) -> tuple:
    """(ok, seconds, first error lines) for one source against one release's headers."""
    inc = headers_mod.dest_root() / version / "torch" / "include"
    includes = [str(inc), str(inc / "torch" / "csrc" / "api" / "include"), *cuda]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = build_mod.compile_command(cxx, versions_mod.cxx_standard(version), 1, includes, src, Path(tmp) / "o.o",
                                        optimize="-O0")
        t = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        took = time.monotonic() - t
    errors = [line for line in r.stderr.splitlines() if "error" in line][:8]
    return r.returncode == 0, took, errors


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="torch releases (default: every supported one)")
    ap.add_argument("--markdown", type=Path, help="also write the table to this Markdown file")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    versions = args.versions or list(versions_mod.RELEASES)
    cxx = build_mod.compiler()
    if cxx is None:
        print("torch_matrix.py: no C++ compiler (looked for $CXX, g++, c++)", file=sys.stderr)
        return 2
    start = time.monotonic()
    cuda = headers_mod.cuda_include_dirs()
    for v in versions:
        headers_mod.fetch(v)
    fetched = time.monotonic() - start
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for v in versions:
            for name, src in TARGETS:
                jobs[v, name] = pool.submit(compile_one, cxx, v, src, cuda)
    results = {k: f.result() for k, f in jobs.items()}
    cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    rows, timed = [], []
    for v in versions:
        cells = [("compiles" if results[v, name][0] else "FAILS") for name, _ in TARGETS]
        rows.append((v, versions_mod.cxx_standard(v), *cells))
        timed.append((v, versions_mod.cxx_standard(v),
                      *(f"{c} ({results[v, name][1]:.0f} s)" for c, (name, _) in zip(cells, TARGETS))))
    header = ("torch", "C++", *(name for name, _ in TARGETS))
    widths = [max(len(str(r[i])) for r in [header, *timed]) for i in range(len(header))]
    for r in [header, *timed]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    failed = [(k, r[2]) for k, r in results.items() if not r[0]]
    for (v, name), errors in failed:
        print(f"\n{name} against torch {v}:", *errors, sep="\n  ")
    total = time.monotonic() - start
    print(f"\n{len(versions)} releases, {len(failed)} failures; headers fetched in {fetched:.0f} s, "
          f"everything in {total:.0f} s ({cxx_version})")  # fmt: skip
    if args.markdown:
        day = datetime.date.today().isoformat()
        lines = [
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows),
        ]
        args.markdown.write_text(
            f"<!-- written by scripts/torch_matrix.py; do not edit by hand -->\n"
            f"Compiled {day} on {platform.machine()} with {cxx_version}, against each release's headers "
            f"(`python3 scripts/torch_matrix.py --markdown {args.markdown}`):\n\n" + "\n".join(lines) + "\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
