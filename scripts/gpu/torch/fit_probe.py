"""Real traces of fit_models.py's workloads for the will-it-fit models, recorded on the GPU.

    python3 scripts/gpu/torch/fit_probe.py cudnn --batches 8,16,24,64 [--out DIR]
    python3 scripts/gpu/torch/fit_probe.py capped bert --batches 1066,1067 --cap 40GiB [--out DIR]

`cudnn`: ResNet-50 with cudnn.benchmark (fit_models.resnet50) at each batch, each in a fresh
process, with torch.cuda.memory._record_memory_history, and a dispatch mode that, before every
convolution and batch norm (forward and backward), allocates and frees a marker block on a side
stream and logs the op's argument shapes. In the trace, the allocations between two markers that
are freed before the next one are that op's transient memory: cuDNN's workspaces and
cudnn.benchmark's trial allocations, which cudamem.estimate cannot see. Writes, per batch,
`resnet50-b{B}.pickle.gz` (the snapshot) and `resnet50-b{B}.ops.json` (marker index -> op, shapes).

`capped`: the workload at each batch under torch.cuda.set_per_process_memory_fraction(cap / total),
with the history, for comparing the out-of-memory retry path with the simulated one. Writes
`{workload}-b{B}-cap.pickle.gz` and prints each run's outcome and peak reserved.

Everything goes into DIR/fit-probe.tar.gz (default DIR: $OUT, else the current folder).
"""

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKED = ("convolution", "batch_norm")


def size_arg(s):
    u = {"gib": 1 << 30, "mib": 1 << 20}
    for k, v in u.items():
        if s.lower().endswith(k):
            return int(float(s[: -len(k)]) * v)
    return int(s)


def describe(x):
    import torch

    if isinstance(x, torch.Tensor):
        return {"shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""), "stride": list(x.stride())}
    if isinstance(x, (list, tuple)):
        return [describe(v) for v in x]
    if isinstance(x, (int, float, bool, str)) or x is None:
        return x
    return str(x)


def save(snap, path):
    """The snapshot, gzipped, with each event's and block's stack cut to its three innermost frames."""
    for dev in snap.get("device_traces", []):
        for e in dev:
            e["frames"] = (e.get("frames") or [])[:3]
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            b["frames"] = (b.get("frames") or [])[:3]
    with gzip.open(path, "wb") as f:
        pickle.dump(snap, f)


def child_cudnn(batch, tmp):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    sys.path.insert(0, str(HERE))
    import fit_models

    side = torch.cuda.Stream()
    ops = []

    class Marker(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if any(k in name for k in MARKED):
                i = len(ops)
                ops.append({"i": i, "op": str(func), "args": describe(args)})
                with torch.cuda.stream(side):
                    m = torch.empty(512 * (i + 1), dtype=torch.uint8, device="cuda")
                    del m
            return func(*args, **(kwargs or {}))

    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    with Marker():
        fit_models.resnet50(batch, torch.device("cuda"))
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    save(snap, Path(tmp) / f"resnet50-b{batch}.pickle.gz")
    side_id = side.cuda_stream
    (Path(tmp) / f"resnet50-b{batch}.ops.json").write_text(json.dumps({"marker_stream": side_id, "ops": ops}))
    print(f"resnet50 b{batch}: peak reserved {torch.cuda.max_memory_reserved()}, "
          f"peak allocated {torch.cuda.max_memory_allocated()}, {len(ops)} marked ops", flush=True)


def child_capped(workload, batch, cap, tmp):
    import torch

    sys.path.insert(0, str(HERE))
    import fit_models

    fn = fit_models.WORKLOADS[workload][0]
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    ok, err = True, None
    try:
        fn(batch, torch.device("cuda"))
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        ok, err = False, str(e).splitlines()[0][:160]
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    save(snap, Path(tmp) / f"{workload}-b{batch}-cap.pickle.gz")
    st = torch.cuda.memory_stats()
    print(f"{workload} b{batch} cap {cap}: ok={ok} peak reserved {torch.cuda.max_memory_reserved()} "
          f"peak allocated {torch.cuda.max_memory_allocated()} num_ooms {st.get('num_ooms', 0)} "
          f"num_alloc_retries {st.get('num_alloc_retries', 0)} {err or ''}", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, rest = sys.argv[2], sys.argv[3:]
        if kind == "cudnn":
            return child_cudnn(int(rest[0]), rest[1])
        return child_capped(rest[0], int(rest[1]), int(rest[2]), rest[3])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["cudnn", "capped"])
    ap.add_argument("workload", nargs="?", default="resnet50")
    ap.add_argument("--batches", required=True)
    ap.add_argument("--cap", type=size_arg, default=None)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    if a.mode == "capped" and not a.cap:
        ap.error("capped needs --cap")
    batches = [int(b) for b in a.batches.split(",")]
    env = dict(os.environ, PYTHONWARNINGS="ignore",
               CUBLAS_WORKSPACE_CONFIG=os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cudamem-probe-") as tmp:
        procs = []
        for b in batches:
            args = (["cudnn", str(b), tmp] if a.mode == "cudnn" else ["capped", a.workload, str(b), str(a.cap), tmp])
            procs.append(subprocess.Popen([sys.executable, __file__, "--child", *args], env=env))
            if len(procs) >= a.jobs:
                procs.pop(0).wait()
        for p in procs:
            p.wait()
        name = out / f"fit-probe-{a.mode}{'-' + a.workload if a.mode == 'capped' else ''}.tar.gz"
        with tarfile.open(name, "w:gz") as tar:
            tar.add(tmp, arcname="fit-probe")
        print(f"wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
