"""Step (d) of scripts/gpu/torch/run.sh: native torch vs cudamem on real workloads.

Runs workload_run.py once per (workload, variant), each in a fresh process (same seeds, same
environment, CUBLAS_WORKSPACE_CONFIG=:4096:8), in priority order, within a time budget; then
prints a markdown table and writes it, with the raw results as JSON, to --out.

Variants: native (PyTorch's own caching allocator), cudamem (cudamem's default policy),
cudamem:pytorch (cudamem running PyTorch's algorithm: its peaks should equal native's), and a
second native run (the control for run-to-run differences: with deterministic algorithms the
losses should be bitwise equal to the first native run's).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ["gpt2", "resnet50", "bert", "alloc"]
PLAN = (
    [(w, v) for w in WORKLOADS for v in ("native", "cudamem")]
    + [(w, "cudamem:pytorch") for w in WORKLOADS]
    + [(w, "native#2") for w in WORKLOADS]
)


def run_one(workload, variant, timeout):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONWARNINGS="ignore")
    arg = variant.split("#")[0]
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, str(HERE / "workload_run.py"), workload, arg],
                           capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"workload": workload, "variant": variant, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
        return {"workload": workload, "variant": variant, "error": f"rc={r.returncode}: " + " | ".join(tail)}
    res = json.loads(lines[-1][len("RESULT "):])
    res["variant"] = variant
    res["process_s"] = time.perf_counter() - t0
    return res


def gb(n):
    return f"{n / 1e9:.2f}" if isinstance(n, (int, float)) else "-"


def table(results):
    by = {(r["workload"], r["variant"]): r for r in results}
    rows = [
        "| workload | variant | median | peak allocated GB | peak reserved GB | device allocs | losses vs native |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['workload']} | {r['variant']} | error: {r['error'][:300]} | | | | |")
            continue
        unit, scale = ("µs/op", 1e6) if r["workload"] == "alloc" else ("ms", 1e3)
        if r["workload"] == "bert":
            unit = "ms/batch"
        native = by.get((r["workload"], "native"))
        if r["workload"] == "alloc" or not r["losses"]:
            same = "n/a"
        elif r["variant"] == "native":
            same = "(reference)"
        elif native is None or "error" in native:
            same = "no native run"
        elif r["losses_hex"] == native["losses_hex"]:
            same = "bitwise equal"
        else:
            diffs = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(r["losses"], native["losses"])]
            same = f"differ (max rel {max(diffs):.1e})"
        rows.append(
            f"| {r['workload']} | {r['variant']} | {r['median_s'] * scale:.2f} {unit} | {gb(r['peak_allocated'])} "
            f"| {gb(r['peak_reserved'])} | {r.get('num_device_alloc', '-')} | {same} |"
        )
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=360.0, help="seconds for all runs")
    ap.add_argument("--out", default=None, help="folder for torch-workloads.{md,json}")
    ap.add_argument("--only", default=None, help="comma-separated workloads")
    ap.add_argument("--alternate", type=int, default=0,
                    help="instead of the default plan: native and cudamem alternated N times per workload")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="torch.backends.cudnn.benchmark = True (autotuning; not deterministic)")
    args = ap.parse_args()
    if args.cudnn_benchmark:
        os.environ["CUDAMEM_WORKLOAD_CUDNN_BENCHMARK"] = "1"
    if args.alternate:
        names = args.only.split(",") if args.only else WORKLOADS
        plan = [(w, v if i == 1 else f"{v}#{i}") for i in range(1, args.alternate + 1) for w in names
                for v in ("native", "cudamem")]
    else:
        plan = [(w, v) for w, v in PLAN if args.only is None or w in args.only.split(",")]
    start = time.perf_counter()
    results = []
    for workload, variant in plan:
        left = args.budget - (time.perf_counter() - start)
        if left < 25:
            results.append({"workload": workload, "variant": variant, "error": "skipped: out of time budget"})
            print(f"skip {workload} {variant}: out of time", flush=True)
            continue
        r = run_one(workload, variant, timeout=min(left, 150))
        results.append(r)
        if "error" in r:
            print(f"{workload:9} {variant:16} ERROR {r['error']}", flush=True)
        else:
            print(f"{workload:9} {variant:16} median {r['median_s'] * 1e3:9.3f} ms  peak alloc {gb(r['peak_allocated'])} GB"
                  f"  peak reserved {gb(r['peak_reserved'])} GB  device allocs {r.get('num_device_alloc')}"
                  f"  process {r['process_s']:.1f} s  losses {[round(v, 6) for v in r['losses'][:12]]}", flush=True)
    order = {v: i for i, v in enumerate(["native", "cudamem", "cudamem:pytorch", "native#2"])}
    results.sort(key=lambda r: (WORKLOADS.index(r["workload"]), r["variant"].split("#")[0] != "native",
                                order.get(r["variant"], 9), r["variant"]))
    md = table(results)
    print()
    print(md)
    for r in results:
        if "error" not in r and r["workload"] != "alloc" and r["losses"]:
            print(f"{r['workload']} {r['variant']} losses: {r['losses']}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        header = (f"# cudamem vs native torch\n\n{time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
                  f"{results[0].get('torch', '?') if results else '?'}; produced by scripts/gpu/torch/run.sh\n\n")
        (out / "torch-workloads.md").write_text(header + md + "\n")
        (out / "torch-workloads.json").write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
