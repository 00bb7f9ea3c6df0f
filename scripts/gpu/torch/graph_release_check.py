"""Repeated CUDA graph captures leave device memory flat: what destroyed graphs held goes back.

PyTorch's ``test_repeat_graph_capture_cublas_workspace_memory`` captures one ``torch.mm`` 100
times and fails if the device's used memory (``torch.cuda.mem_get_info``) grew by more than
0.1 GB. This check does the same with ``--captures`` graphs (default 1,000), in a fresh process,
with torch's allocator or with cudamem, and prints the device's used memory, reserved memory and
the snapshot's segments per pool at checkpoints, so that a growth shows where it sits.

The first capture of a process pays a one-time cost with either allocator (the capture
stream's cuBLAS workspace in the graph's pool, and the driver's own graph resources outside any
allocator), so "flat" is measured from after the first capture to after the last; the first
capture's cost is printed beside it. (PyTorch's test measures from before the first capture, so
in a fresh process it fails wherever that one-time cost exceeds 0.1 GB, with torch's allocator
too.)

    python3 scripts/gpu/torch/graph_release_check.py --allocator cudamem --captures 1000 [--json F]

Exit status 1 when used memory grew by more than ``--limit-gb`` (default 0.1, the test's bound)
from after the first capture to after the last.
"""

import argparse
import collections
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocator", choices=("torch", "cudamem"), required=True)
    ap.add_argument("--captures", type=int, default=1000)
    ap.add_argument("--limit-gb", type=float, default=0.1)
    ap.add_argument("--blas", choices=("default", "cublas", "cublaslt"), default="cublas",
                    help="torch.backends.cuda.preferred_blas_library (PyTorch's test uses cublas)")
    ap.add_argument("--json")
    args = ap.parse_args()

    import torch

    if args.allocator == "cudamem":
        import cudamem.torch

        cudamem.torch.install()
    if args.blas != "default":
        torch.backends.cuda.preferred_blas_library(args.blas)
    a = torch.rand((1024, 512), device="cuda")
    b = torch.rand((512, 64), device="cuda")
    torch.mm(a, b)  # warm-up: cuBLAS's handle and workspace outside any graph
    torch.cuda.synchronize()

    def state(i):
        free, total = torch.cuda.mem_get_info()
        pools = collections.Counter(str(tuple(s["segment_pool_id"])) for s in torch.cuda.memory_snapshot())
        return {"captures": i, "used_gb": (total - free) / 1e9, "reserved_gb": torch.cuda.memory_reserved() / 1e9,
                "segments": sum(pools.values()), "pools": len(pools), "default_pool_segments": pools.get("(0, 0)", 0)}

    rows = [state(0)]
    marks = {1, 2, 10, 100, args.captures}
    t0 = time.time()
    for i in range(1, args.captures + 1):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            torch.mm(a, b)
        g.replay()
        if i in marks:
            torch.cuda.synchronize()
            rows.append(state(i))
    del g
    torch.cuda.synchronize()
    rows.append(dict(state(args.captures), captures=f"{args.captures}, last graph deleted"))
    first = rows[1]["used_gb"] - rows[0]["used_gb"]
    grew = rows[-2]["used_gb"] - rows[1]["used_gb"]
    print(f"{args.allocator}: {args.captures} captures of torch.mm in {time.time() - t0:.1f} s")
    print(f"{'captures':>28} {'used GB':>9} {'reserved GB':>12} {'segments':>9} {'pools':>6} {'in (0,0)':>9}")
    for r in rows:
        print(f"{str(r['captures']):>28} {r['used_gb']:9.3f} {r['reserved_gb']:12.3f} {r['segments']:9d} "
              f"{r['pools']:6d} {r['default_pool_segments']:9d}")
    ok = grew <= args.limit_gb
    print(f"the first capture took {first:.3f} GB; from then to the last, used memory grew by {grew:.3f} GB "
          f"(limit {args.limit_gb} GB): {'FLAT' if ok else 'GREW'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"allocator": args.allocator, "captures": args.captures, "first_capture_gb": first,
                       "grew_gb": grew, "flat": ok,
                       "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
