"""Will it fit, checked on the GPU: cudamem's two predictions of a job's peak reserved memory
against torch's own, and the predicted largest batch run under a memory cap.

    python3 scripts/gpu/torch/fit_check.py [--out DIR] [--only gpt2,bert] [--jobs 4] [--with-cudamem]
    python3 scripts/gpu/torch/fit_check.py --dry-run     # no GPU: tries the script, not the GPU

For each workload of fit_models.py (GPT-2 small training, ResNet-50 with cudnn.benchmark,
variable-length BERT inference, generation with a growing KV cache, activation checkpointing):

1. records real traces at 2-3 small batch sizes (torch.cuda.memory._record_memory_history and
   _dump_snapshot, from before the model is built), each in a fresh process, and measures
   torch.cuda.max_memory_reserved() at the check batch in another (native allocator; with
   --with-cudamem also under cudamem.torch.install());
2. the GPU-free estimate at the check batch: cudamem.estimate in a process that sees no GPU
   (CUDA_VISIBLE_DEVICES empty);
3. the trace-scaling estimate at the check batch, and its guess of the largest batch for 24 GiB
   and 40 GiB (cudamem.estimate.scale, on the simulated GPU); the predicted largest batch is the
   GPU-free search's (cudamem.estimate.largest_batch: that guess from GPU-free recordings,
   verified by recording and replaying b and b + 1);
4. runs the predicted largest batch and the next one, each in a fresh process under
   torch.cuda.set_per_process_memory_fraction(capacity / total memory).

Targets: GPU-free estimate within 5% of the measured peak reserved, scaling estimate within 2%,
the predicted batch runs and the next one fails. Processes of one phase run side by side (--jobs;
the capped runs need 24+24+40+40 GiB together, which one H200 holds); --jobs 1 runs them one by
one. Writes fit-check.json and fit-check.md to --out (default: $OUT, else the current folder)
and prints the table.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB = 1 << 30
CAPACITIES = (("24GiB", 24 * GIB), ("40GiB", 40 * GIB))


# --- child processes ---------------------------------------------------------------------------


def child(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "estimate"])
    ap.add_argument("workload")
    ap.add_argument("batch", type=int)
    ap.add_argument("--trace")
    ap.add_argument("--cap", type=int)
    ap.add_argument("--cudamem", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if a.cudamem:
        import cudamem.torch

        cudamem.torch.install()
    import torch
    import fit_models

    fn = fit_models.WORKLOADS[a.workload][0]
    t0 = time.perf_counter()
    if a.mode == "estimate":
        import cudamem

        e = cudamem.estimate(fn, a.batch, torch.device("cuda"), policies=["pytorch", "cudamem"])
        if a.trace:
            e.save(a.trace)
        out = e.as_dict()
        # The GPU-free largest batch: recorded at the scaling batches and scaled for a first
        # guess, then recorded at candidate batches until b fits and b + 1 does not.
        batches = fit_models.WORKLOADS[a.workload][1]
        out["largest"] = {label: cudamem.estimate.largest_batch(fn, cap, torch.device("cuda"), batches=batches,
                                                                policies=["pytorch"])["largest"][0]
                          for label, cap in CAPACITIES}
        out["seconds"] = time.perf_counter() - t0
        out["cuda_available"] = torch.cuda.is_available()
        print("RESULT " + json.dumps(out))
        return 0
    if os.environ.get("FIT_CHECK_DRY") == "1":
        return dry_run(a, fn, t0)
    if a.cap:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(a.cap / total, 0)
    if a.trace:
        torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python")
    ok, error = True, None
    try:
        fn(a.batch, torch.device("cuda"))
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        ok, error = False, str(e)[:300]
    res = {"ok": ok, "error": error, "peak_reserved": torch.cuda.max_memory_reserved(),
           "peak_allocated": torch.cuda.max_memory_allocated(), "seconds": time.perf_counter() - t0,
           "num_ooms": torch.cuda.memory_stats().get("num_ooms", 0), "torch": torch.__version__}
    if a.trace:
        torch.cuda.memory._dump_snapshot(a.trace)
        torch.cuda.memory._record_memory_history(enabled=None)
    print("RESULT " + json.dumps(res))
    return 0


def dry_run(a, fn, t0):
    """--dry-run: a GPU run stood in for by the GPU-free recording and its replay, so that the
    orchestration can be tried on a machine without a GPU (its figures mean nothing)."""
    import torch
    import cudamem.estimate as est

    e = est.estimate(fn, a.batch, torch.device("cuda"), policies=["pytorch"], device_memory=a.cap)
    if a.trace:
        e.save(a.trace)
    row = e.rows[0]
    print("RESULT " + json.dumps({"ok": row["ooms"] == 0, "error": None, "peak_reserved": row["peak_reserved_bytes"],
                                  "peak_allocated": row["peak_allocated_bytes"], "seconds": time.perf_counter() - t0,
                                  "num_ooms": row["ooms"], "dry_run": True}))
    return 0


def spawn(args, timeout, env=None):
    """Runs this script as a child (see :mod:`children`), with a fixed cuBLAS workspace unless
    the caller set one."""
    from children import spawn as run_child

    env = dict(env or {})
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8"))
    return run_child(Path(__file__).resolve(), args, timeout, env)


# --- the check of one workload -----------------------------------------------------------------


def rel(pred, meas):
    return None if not pred or not meas else (pred - meas) / meas


def reduce_trace(path):
    """A snapshot's allocation events as compact JSON rows [action, addr, size, stream, frames],
    frames as the four innermost 'name file:line' strings (for comparing two traces offline)."""
    import pickle

    with open(path, "rb") as f:
        snap = pickle.load(f)
    rows = []
    for dev in snap.get("device_traces", []):
        for e in dev:
            fr = [f"{x.get('name')} {Path(str(x.get('filename'))).name}:{x.get('line')}" for x in (e.get("frames") or [])[:4]]
            rows.append([e.get("action"), e.get("addr"), e.get("size"), e.get("stream"), fr])
    return rows


def check(name, batches, at, jobs, tmp, with_cudamem, timeout, keep_traces=False):
    import cudamem.estimate as est

    r = {"workload": name, "batches": list(batches), "at": at}
    traces = [str(tmp / f"{name}-b{b}.pickle") for b in batches]
    phase1 = [("trace", ["run", name, b, "--trace", t], None) for b, t in zip(batches, traces)]
    kept = {"measured": ["--trace", str(tmp / f"{name}-measured.pickle")],
            "gpu_free": ["--trace", str(tmp / f"{name}-gpufree.pickle")]} if keep_traces else {}
    phase1.append(("measured", ["run", name, at, *kept.get("measured", [])], None))
    if with_cudamem:
        phase1.append(("measured_cudamem", ["run", name, at, "--cudamem"], None))
    phase1.append(("gpu_free", ["estimate", name, at, *kept.get("gpu_free", [])], {"CUDA_VISIBLE_DEVICES": ""}))
    # One more worker than --jobs: the GPU-free estimate runs on the CPU.
    with ThreadPoolExecutor(max(1, jobs) + 1) as pool:
        got = list(pool.map(lambda p: (p[0], spawn(p[1], timeout, p[2])), phase1))
    r["trace_runs"] = [g for k, g in got if k == "trace"]
    for k, g in got:
        if k != "trace":
            r[k] = g
    for k, (_, path) in kept.items():
        try:
            (tmp / "kept").mkdir(exist_ok=True)
            (tmp / "kept" / f"{name}-{k}.json").write_text(json.dumps(reduce_trace(path)))
        except (OSError, ValueError, EOFError) as e:
            r.setdefault("kept_errors", []).append(f"{k}: {e}")
    meas = r["measured"].get("peak_reserved")
    gf = r["gpu_free"]
    if "policies" in gf:
        gf["pytorch_error"] = rel(gf["policies"][0]["peak_reserved_bytes"], meas)
    if not all(t.get("ok") for t in r["trace_runs"]):
        r["scale"] = {"error": "a trace run failed: " + "; ".join(str(t.get("error"))[:200] for t in r["trace_runs"])}
        return r
    try:
        s = est.scale(traces, list(batches), at=at, policies=["pytorch", "cudamem"])
        s["pytorch_error"] = rel(s["at"][0]["peak_reserved_bytes"], meas)
        r["scale"] = s
        mc = r.get("measured_cudamem", {}).get("peak_reserved")
        if mc:  # cudamem's own policy, measured through cudamem.torch, against both estimates
            r["measured_cudamem"]["scale_error"] = rel(s["at"][1]["peak_reserved_bytes"], mc)
            if "policies" in gf:
                r["measured_cudamem"]["gpu_free_error"] = rel(gf["policies"][1]["peak_reserved_bytes"], mc)
        trials = []
        for label, cap in CAPACITIES:
            lg = est.scale(traces, list(batches), capacity=cap, policies=["pytorch"])["largest"][0]
            r.setdefault("largest", {})[label] = lg
            # The batch run under the cap: the GPU-free search's, verified by replaying
            # recordings at b and b + 1; the traces' scaled guess where that search failed.
            gl = gf.get("largest", {}).get(label, {})
            b = gl.get("largest_batch") if gl.get("verified") else lg["largest_batch"]
            r.setdefault("predicted", {})[label] = {"batch": b, "by": "gpu_free" if gl.get("verified") else "scale"}
            if b is not None:
                # The predicted batch, the next one, and every batch the estimate says may fit
                # as the driver places segments, with the first one past them.
                may = sorted(int(m) for m in gl.get("may_fit", {}) if gl.get("verified"))
                later = sorted({b + 1, *may, *(m + 1 for m in may[-1:])})
                trials += [(label, x, cap) for x in [b] + later]
    except ValueError as e:
        r["scale"] = {"error": str(e)}
        return r
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        runs = list(pool.map(lambda t: (t, spawn(["run", name, t[1], "--cap", t[2]], timeout)), trials))
    for (label, b, _), res in runs:
        res["batch"] = b
        r.setdefault("capped", {}).setdefault(label, []).append(res)
    return r


# --- report ------------------------------------------------------------------------------------


def gib(n):
    return f"{n / GIB:.2f}" if isinstance(n, (int, float)) else "-"


def pct(x):
    return "-" if x is None else f"{100 * x:+.2f}%"


def verdict(r):
    out = {}
    gf, sc = r.get("gpu_free", {}), r.get("scale", {})
    out["gpu_free_within_5pct"] = gf.get("pytorch_error") is not None and abs(gf["pytorch_error"]) <= 0.05
    out["scale_within_2pct"] = sc.get("pytorch_error") is not None and abs(sc["pytorch_error"]) <= 0.02
    for label, _ in CAPACITIES:
        runs = r.get("capped", {}).get(label, [])
        ok = {x.get("batch"): x.get("ok") for x in runs}
        b = r.get("predicted", {}).get(label, {}).get("batch")
        out[f"{label}_batch_fits_next_fails"] = ok.get(b) is True and ok.get(None if b is None else b + 1) is False
        # Past the batches the estimate says may fit, every one tried failed on the GPU.
        may = [int(m) for m in r.get("gpu_free", {}).get("largest", {}).get(label, {}).get("may_fit", {})]
        past = [x for x in ok if b is not None and x > max([b] + may)]
        out[f"{label}_fails_past_may_fit"] = bool(past) and all(ok[x] is False for x in past)
    return out


def table(results):
    rows = ["| workload | batch | measured peak reserved GiB | GPU-free estimate GiB (error) | scaling estimate GiB "
            "(error) | scaling confidence | 24 GiB: scaled guess; predicted batch / on the GPU | 40 GiB: "
            "scaled guess; predicted batch / on the GPU |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            rows.append(f"| {r['workload']} | {r.get('at', '')} | skipped: {r['skipped']} | | | | | |")
            continue
        meas = r.get("measured", {})
        gf, sc = r.get("gpu_free", {}), r.get("scale", {})
        gfs = (f"{gib(gf['policies'][0]['peak_reserved_bytes'])} ({pct(gf.get('pytorch_error'))})"
               if "policies" in gf else f"error: {gf.get('error', '')[:120]}")
        scs = (f"{gib(sc['at'][0]['peak_reserved_bytes'])} ({pct(sc.get('pytorch_error'))})"
               if "at" in sc else f"error: {sc.get('error', '')[:120]}")
        conf = sc.get("quality", {}).get("confidence", "-")
        caps = []
        for label, _ in CAPACITIES:
            runs = r.get("capped", {}).get(label, [])
            guess = r.get("largest", {}).get(label, {}).get("largest_batch", "-")
            pred = r.get("predicted", {}).get(label, {})
            by = "" if pred.get("by") == "gpu_free" else " (scaled)"
            gl = r.get("gpu_free", {}).get("largest", {}).get(label, {})
            if pred.get("by") == "gpu_free" and gl.get("may_fit"):
                may = sorted(int(m) for m in gl["may_fit"])
                by += f" (may fit: {may[0]}{'-' + str(may[-1]) if len(may) > 1 else ''})"
            # ok is False for an out-of-memory error; a run that failed otherwise has no ok.
            word = {True: "runs", False: "fails", None: "error"}
            if runs:
                seen = ", ".join(f"{x.get('batch')} {word[x.get('ok')]}" for x in runs)
                caps.append(f"{guess}; {pred.get('batch')}{by} / {seen}")
            else:
                caps.append(f"{guess}; {pred.get('batch', '-')}{by}")
        m = gib(meas.get("peak_reserved")) if meas.get("ok") else f"error: {str(meas.get('error'))[:120]}"
        rows.append(f"| {r['workload']} | {r['at']} | {m} | {gfs} | {scs} | {conf} | {caps[0]} | {caps[1]} |")
    return "\n".join(rows)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default=None, help="comma-separated workloads")
    ap.add_argument("--jobs", type=int, default=4, help="processes side by side within a phase")
    ap.add_argument("--with-cudamem", action="store_true", help="also measure under cudamem.torch.install()")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds; later workloads are skipped past it")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds for one process")
    ap.add_argument("--keep-traces", action="store_true",
                    help="also write $OUT/fit-traces.tar.gz: the measured and the GPU-free trace at the check batch")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU: the GPU runs replaced by recordings on the CPU (tries the script, not the GPU)")
    a = ap.parse_args()
    if a.dry_run:
        os.environ["FIT_CHECK_DRY"] = "1"
    sys.path.insert(0, str(HERE))
    import fit_models

    names = a.only.split(",") if a.only else list(fit_models.WORKLOADS)
    unknown = [n for n in names if n not in fit_models.WORKLOADS]
    if unknown:
        print(f"unknown workloads {unknown}; known: {list(fit_models.WORKLOADS)}", file=sys.stderr)
        return 2
    start, results = time.perf_counter(), []
    with tempfile.TemporaryDirectory(prefix="cudamem-fit-") as tmp:
        for n in names:
            _, batches, at = fit_models.WORKLOADS[n]
            if time.perf_counter() - start > a.budget:
                results.append({"workload": n, "at": at, "skipped": "out of time budget"})
                continue
            t0 = time.perf_counter()
            r = check(n, batches, at, a.jobs, Path(tmp), a.with_cudamem, a.timeout, a.keep_traces)
            r["seconds"] = time.perf_counter() - t0
            r["verdict"] = verdict(r)
            results.append(r)
            print(f"{n}: {r['seconds']:.0f} s, {r['verdict']}", flush=True)
        if a.keep_traces and (Path(tmp) / "kept").is_dir():
            import tarfile

            Path(a.out).mkdir(parents=True, exist_ok=True)
            with tarfile.open(Path(a.out) / "fit-traces.tar.gz", "w:gz") as tar:
                tar.add(Path(tmp) / "kept", arcname="fit-traces")
    md = table(results)
    print()
    print(md)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fit-check.json").write_text(json.dumps(results, indent=1))
    (out / "fit-check.md").write_text(f"# Will it fit: predictions vs torch on the GPU\n\n{md}\n")
    print(f"\nwrote {out / 'fit-check.json'} and {out / 'fit-check.md'} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
