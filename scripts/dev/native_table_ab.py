"""malloc+free through the native class's function table, two builds of the extension
alternated in one run, on the simulated GPU:

    python3 scripts/dev/native_table_ab.py OLD.so NEW.so [--rounds 12] [--pairs 1000000]

Each .so is a built `_cudamem` extension (`cargo build --release -p cudamem-python` makes
target/release/lib_cudamem.so; copy it aside before building the other side). A C++ loop
(native_table_bench.cpp, compiled here with g++ against the generated header) times 1 MiB
malloc+free pairs through the table with the profiler's usage off and on, and through the
pluggable path's C functions. Each round runs both builds in fresh processes, in alternating
order; the ratios NEW/OLD are per round (the machine's speed drifts), reported as the median and
the range over rounds.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM = HERE.parents[1] / "python" / "cudamem" / "_shim"
PATHS = ("table, usage off", "table, usage on", "C functions")


def child(lib, bench, pairs):
    import ctypes

    so = ctypes.CDLL(lib)
    b = ctypes.CDLL(bench)
    out = (ctypes.c_double * 3)()
    b.bench(ctypes.cast(so.cudamem_native_api, ctypes.c_void_p), ctypes.cast(so.cudamem_malloc, ctypes.c_void_p),
            ctypes.cast(so.cudamem_free, ctypes.c_void_p), ctypes.c_long(pairs), out)
    print(" ".join(f"{x:.2f}" for x in out))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--pairs", type=int, default=1_000_000)
    a = ap.parse_args()
    for so in (a.old, a.new):
        if not Path(so).is_file():
            print(f"no such build: {so}", file=sys.stderr)
            return 2
    tmp = tempfile.mkdtemp()
    bench = os.path.join(tmp, "bench.so")
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", f"-I{SHIM}", "-o", bench,
                    str(HERE / "native_table_bench.cpp")], check=True)
    env = dict(os.environ, CUDAMEM_DEVICE="sim")
    got = {"old": [], "new": []}
    for r in range(a.rounds):
        for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
            so = a.old if side == "old" else a.new
            out = subprocess.run([sys.executable, __file__, "--child", os.path.abspath(so), bench, str(a.pairs)],
                                 capture_output=True, text=True, env=env, check=True).stdout
            got[side].append([float(x) for x in out.split()])
    print(f"# ns per malloc+free pair, {a.rounds} alternated rounds of {a.pairs} pairs, OLD={a.old} NEW={a.new}")
    print(f"{'path':18} {'old':>7} {'new':>7} {'new/old':>8} {'round ratios':>14}")
    for i, name in enumerate(PATHS):
        o = [x[i] for x in got["old"]]
        n = [x[i] for x in got["new"]]
        rs = [y / x for x, y in zip(o, n)]
        print(f"{name:18} {statistics.median(o):7.1f} {statistics.median(n):7.1f} {statistics.median(rs):8.3f}"
              f" {min(rs):6.3f}-{max(rs):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
