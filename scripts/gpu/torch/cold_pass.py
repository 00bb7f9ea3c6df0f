"""The cold pass against PyTorch's own allocator: a real trace replayed through torch's allocator
interface, side by side with cudamem installed as torch's allocator.

    python3 scripts/gpu/torch/cold_pass.py [--rounds 3] [--out DIR] [TRACE.pickle.gz ...]
    (default traces: tests/data/{gpt2_train,resnet50_train,bert_varlen_infer,multistream_prefetch})

Each trace's allocations and frees (alloc / free_requested, on their streams) are made through
torch.cuda.caching_allocator_alloc / caching_allocator_delete, the thinnest path torch offers to
its CUDA allocator, in a fresh process: once with torch's native allocator, once after
cudamem.torch.install() (the policy of CUDAMEM_POLICY, default cudamem). Both pay the same
Python per call, so the ratio is of the allocators plus that shared cost: it understates the
allocators' own difference, never reverses it. The CUDA context is made before the passes (its
time is in the JSON as context_ms). Pass 1 is the cold pass (an empty allocator: every segment
is made); pass 2 repeats the trace on the now-warm cache. The two kinds of process
alternate, --rounds of each; the figure is the median per kind.

Reported per trace: ns per operation in the cold and the warm pass, cudamem / native, and the
device allocations of each pass (memory_stats()["num_device_alloc"]: cudaMalloc calls for torch,
segment growths for cudamem, each of one or more mappings). Writes cold-pass.json and prints a
table. With --slow-ops each operation is also timed on its own (both kinds pay the two clock
reads): the cold pass's operations that took more than 20 µs, their count and total time, say
whether the pass's cost lies in its device allocations or is spread over every operation, and
a histogram of every allocation's and free's time shows where. With --diag each pass also
records the process's minor page faults, its context switches and the thread's CPU time, and a
third pass follows torch.cuda.empty_cache() (every segment released, so it makes its segments
again with the code and the allocator's own structures already warm): a cost that returns in
that pass lies in making segments; one that does not, in the process's first use of something.
"""

import argparse
import bisect
import gzip
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = ["gpt2_train", "resnet50_train", "bert_varlen_infer", "multistream_prefetch"]


def load_ops(path):
    """The trace as [(is_alloc, trace_addr, size, stream)], frees of unseen blocks dropped."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        snap = pickle.load(f)
    ops, live = [], set()
    for e in snap["device_traces"][0]:
        a = e["action"]
        if a == "alloc":
            ops.append((True, e["addr"], e["size"], e["stream"]))
            live.add(e["addr"])
        elif a == "free_requested" and e["addr"] in live:
            ops.append((False, e["addr"], 0, e["stream"]))
            live.discard(e["addr"])
    return ops


SLOW_NS = 20_000
# With --slow-ops, every operation's time is also counted in these buckets (upper edges, ns).
BUCKETS_NS = (1_000, 2_000, 5_000, 10_000, 20_000, float("inf"))


def child(kind, trace, slow_ops, diag=False):
    if kind == "cudamem":
        import cudamem.torch

        cudamem.torch.install()
    import torch

    ops = load_ops(trace)
    torch.cuda.init()
    # The CUDA context is made before the passes, in both kinds of process: torch's allocator
    # would make it inside its first cudaMalloc and cudamem when it opens the device, and it
    # costs about a tenth of a second, which is neither allocator's. Its time is reported apart.
    c0 = time.perf_counter_ns()
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    context_ms = (time.perf_counter_ns() - c0) / 1e6
    streams = {s: (0 if s == 0 else torch.cuda.Stream().cuda_stream) for s in {op[3] for op in ops}}
    alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    out = {"kind": kind, "ops": len(ops), "allocator": torch.cuda.memory.get_allocator_backend(),
           "context_ms": context_ms}
    for name in ("cold", "warm", "recold") if diag else ("cold", "warm"):
        if name == "recold":
            torch.cuda.empty_cache()
        before = torch.cuda.memory_stats().get("num_device_alloc", 0)
        ru0, cpu0 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time_ns()
        ptrs = {}
        slow = []
        hist = {k: [[0, 0] for _ in BUCKETS_NS] for k in ("alloc", "free")}
        clock = time.perf_counter_ns
        t0 = clock()
        if slow_ops:
            for is_alloc, addr, size, stream in ops:
                s0 = clock()
                if is_alloc:
                    ptrs[addr] = alloc(size, 0, streams[stream])
                else:
                    delete(ptrs.pop(addr))
                d = clock() - s0
                if d > SLOW_NS:
                    slow.append((d, is_alloc, size))
                cell = hist["alloc" if is_alloc else "free"][bisect.bisect_left(BUCKETS_NS, d)]
                cell[0] += 1
                cell[1] += d
        else:
            for is_alloc, addr, size, stream in ops:
                if is_alloc:
                    ptrs[addr] = alloc(size, 0, streams[stream])
                else:
                    delete(ptrs.pop(addr))
        t1 = clock()
        ru1, cpu1 = resource.getrusage(resource.RUSAGE_SELF), time.thread_time_ns()
        for p in ptrs.values():  # blocks the trace never freed: freed untimed, for the next pass
            delete(p)
        torch.cuda.synchronize()
        out[name] = {"ns_per_op": (t1 - t0) / len(ops),
                     "device_allocs": torch.cuda.memory_stats().get("num_device_alloc", 0) - before,
                     "peak_reserved": torch.cuda.max_memory_reserved(),
                     "cpu_ns_per_op": (cpu1 - cpu0) / len(ops),
                     "minor_faults": ru1.ru_minflt - ru0.ru_minflt,
                     "context_switches": ru1.ru_nvcsw - ru0.ru_nvcsw + ru1.ru_nivcsw - ru0.ru_nivcsw}
        if slow_ops:
            slow.sort(reverse=True)
            out[name]["slow_ops"] = {"count": len(slow), "total_ns": sum(d for d, _, _ in slow),
                                     "largest": [{"ns": d, "alloc": a, "size": z} for d, a, z in slow[:8]],
                                     "buckets_ns": list(BUCKETS_NS[:-1]) + ["inf"], "histogram": hist}
    print("RESULT " + json.dumps(out))
    return 0


def spawn(kind, trace, slow_ops, diag):
    r = subprocess.run([sys.executable, __file__, "--child", kind, str(trace), "1" if slow_ops else "0",
                        "1" if diag else "0"],
                       capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        return {"error": f"rc={r.returncode}: " + " | ".join((r.stdout + r.stderr).strip().splitlines()[-8:])}
    return json.loads(lines[-1][7:])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5] == "1")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--slow-ops", action="store_true", help="time each operation; report those over 20 µs")
    ap.add_argument("--diag", action="store_true",
                    help="page faults, context switches and CPU time per pass, and a pass after empty_cache")
    a = ap.parse_args()
    if a.rounds < 1:
        print("--rounds: at least 1", file=sys.stderr)
        return 2
    traces = [Path(t) for t in a.traces] or [ROOT / "tests" / "data" / f"{n}.pickle.gz" for n in DEFAULT]
    missing = [str(t) for t in traces if not t.is_file()]
    if missing:
        print(f"no such trace: {missing}", file=sys.stderr)
        return 2
    results = []
    for t in traces:
        runs = {"native": [], "cudamem": []}
        for _ in range(a.rounds):
            for kind in ("native", "cudamem"):  # alternated, each in a fresh process
                runs[kind].append(spawn(kind, t, a.slow_ops, a.diag))
        results.append({"trace": t.name.split(".")[0], "runs": runs})
        print(f"{t.name}: done", flush=True)
    rows = ["| trace | ops | cold ns/op native / cudamem (ratio) | warm ns/op native / cudamem (ratio) | device allocs "
            "cold native / cudamem | device allocs warm native / cudamem |", "|---|---|---|---|---|---|"]
    for r in results:
        ok = {k: [x for x in v if "error" not in x] for k, v in r["runs"].items()}
        if not ok["native"] or not ok["cudamem"]:
            errs = [x["error"] for v in r["runs"].values() for x in v if "error" in x]
            rows.append(f"| {r['trace']} | error: {errs[0][:200]} | | | | |")
            continue
        med = {k: {p: statistics.median(x[p]["ns_per_op"] for x in v) for p in ("cold", "warm")} for k, v in ok.items()}
        allocs = {k: {p: v[0][p]["device_allocs"] for p in ("cold", "warm")} for k, v in ok.items()}
        r["median_ns_per_op"], r["device_allocs"] = med, allocs
        r["ratio"] = {p: med["cudamem"][p] / med["native"][p] for p in ("cold", "warm")}
        cells = [f"{med['native'][p]:.0f} / {med['cudamem'][p]:.0f} ({r['ratio'][p]:.2f})" for p in ("cold", "warm")]
        rows.append(f"| {r['trace']} | {ok['native'][0]['ops']} | {cells[0]} | {cells[1]} | "
                    f"{allocs['native']['cold']} / {allocs['cudamem']['cold']} | "
                    f"{allocs['native']['warm']} / {allocs['cudamem']['warm']} |")
    if a.slow_ops:
        rows.append("")
        rows.append("| trace | cold-pass operations over 20 µs, native / cudamem: count, ms in all (median) |")
        rows.append("|---|---|")
        for r in results:
            cell = []
            for k in ("native", "cudamem"):
                v = [x["cold"]["slow_ops"] for x in r["runs"][k] if "error" not in x]
                if v:
                    cell.append(f"{statistics.median(x['count'] for x in v):.0f}, "
                                f"{statistics.median(x['total_ns'] for x in v) / 1e6:.1f}")
            rows.append(f"| {r['trace']} | {' / '.join(cell)} |")
        rows.append("")
        edges = [f"≤ {e // 1000} µs" for e in BUCKETS_NS[:-1]] + ["more"]
        rows.append("Each operation of the cold pass by its time (count, ms in all; the first process of each kind):")
        rows.append("")
        rows.append("| trace | allocator | op | " + " | ".join(edges) + " |")
        rows.append("|---|---|---|" + "---|" * len(edges))
        for r in results:
            for k in ("native", "cudamem"):
                v = [x for x in r["runs"][k] if "error" not in x]
                if not v:
                    continue
                for op in ("alloc", "free"):
                    h = v[0]["cold"]["slow_ops"]["histogram"][op]
                    rows.append(f"| {r['trace']} | {k} | {op} | "
                                + " | ".join(f"{c}, {t / 1e6:.1f}" for c, t in h) + " |")
    if a.diag:
        rows.append("")
        rows.append("Per pass, medians of the processes of each kind: ns per operation (wall / the thread's CPU), "
                    "minor page faults, context switches, device allocations:")
        rows.append("")
        rows.append("| trace | allocator | cold | warm | after empty_cache |")
        rows.append("|---|---|---|---|---|")
        for r in results:
            for k in ("native", "cudamem"):
                v = [x for x in r["runs"][k] if "error" not in x]
                if not v:
                    continue
                cells = []
                for p in ("cold", "warm", "recold"):
                    def m(f):
                        return statistics.median(x[p][f] for x in v)
                    cells.append(f"{m('ns_per_op'):.0f} / {m('cpu_ns_per_op'):.0f} ns, {m('minor_faults'):.0f} faults, "
                                 f"{m('context_switches'):.0f} switches, {m('device_allocs'):.0f} allocs")
                rows.append(f"| {r['trace']} | {k} | " + " | ".join(cells) + " |")
    md = "\n".join(rows)
    print(md)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cold-pass.json").write_text(json.dumps(results, indent=1))
    (out / "cold-pass.md").write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
