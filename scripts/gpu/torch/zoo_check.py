"""Will it fit, on the zoo's jobs (scripts/gpu/torch/zoo): every prediction against the GPU.

    python3 scripts/gpu/torch/zoo_check.py [--out DIR] [--only a,b | --set validation] [--jobs 3]
    python3 scripts/gpu/torch/zoo_check.py --dry-run [--only unet_diffusion]   # no GPU needed
    python3 scripts/gpu/torch/zoo_check.py --report-only --out DIR               # table from DIR

For each job, in fresh processes (one per job, batch and allocator; the GPU-free ones see no GPU):

1. measured: torch.cuda.max_memory_reserved() at the job's check batch with torch's allocator
   and under cudamem.torch.install();
2. GPU-free: cudamem.estimate at the check batch (policies pytorch and cudamem), and
   cudamem.estimate.largest_batch for each capacity: the safe batch, the may-fit band and the
   first batch expected to fail, per policy;
3. capped: under torch.cuda.set_per_process_memory_fraction(capacity / total), with each
   allocator, the safe batch, the top of the band and the first expected failure, each
   ``--tries`` times (3 or more: the driver places segments differently from run to run).

Each job's results go to DIR/zoo-<job>.json as soon as it is done (a later run skips the jobs
found there unless --again), and DIR/zoo-check.json and DIR/zoo-check.md gather them all, so a
run with a time limit can do the zoo a few jobs at a time. The GPU-free answers need no
GPU: ``--gpu-free-only`` computes them ahead (DIR/zoo-<job>-gpufree.json, on any machine with
the same torch and libraries), and the GPU run then takes them from there. ``--dry-run`` builds each job
at its tiny size and stands a CPU recording in for every GPU run (the capacities shrink to
``DRY_CAPACITIES``): it tries the orchestration, and its figures agree by construction.
"""

import argparse
import importlib.util
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
GIB, MIB = 1 << 30, 1 << 20
CAPACITIES = (("24GiB", 24 * GIB), ("40GiB", 40 * GIB))
DRY_CAPACITIES = (("512MiB", 512 * MIB), ("1GiB", GIB))
# allocator -> the estimate's policy for it; "expandable" is torch's allocator with
# expandable_segments:True (set before torch is imported).
ALLOCATORS = {"native": "pytorch", "expandable": "pytorch-expandable", "cudamem": "cudamem"}


# --- child processes ---------------------------------------------------------------------------


def child(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["run", "estimate"])
    ap.add_argument("job")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--cap", type=int)
    ap.add_argument("--caps", default="")
    ap.add_argument("--allocator", choices=list(ALLOCATORS), default="native")
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--largest-only", action="store_true", help="estimate: only the largest batches")
    ap.add_argument("--steps", type=int, help="run: optimizer steps of a training job (default the zoo's)")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    if a.allocator == "expandable" and a.mode == "run":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if a.allocator == "cudamem" and not a.dry and a.mode == "run":
        import cudamem.torch

        cudamem.torch.install()
    import torch
    import zoo

    job = zoo.JOBS[a.job]
    t0 = time.perf_counter()
    if a.mode == "estimate":
        import cudamem.estimate as est

        out = {} if a.largest_only else est.estimate(job.run, a.batch, torch.device("cuda"), a.dry,
                                                      policies=list(ALLOCATORS.values())).as_dict()
        out["largest"] = {}
        for cap in filter(None, a.caps.split(",")):
            r = est.largest_batch(job.run, int(cap), torch.device("cuda"), a.dry,
                                  batches=list(job.dry_batches if a.dry else job.batches),
                                  policies=list(ALLOCATORS.values()))
            out["largest"][cap] = {"rows": r["largest"], "headline": r["headline"]}
        out["seconds"] = time.perf_counter() - t0
        out["cuda_available"] = torch.cuda.is_available()
        print("RESULT " + json.dumps(out))
        return 0
    if a.dry:
        return dry_run(job, a, t0)
    if a.cap:
        torch.cuda.set_per_process_memory_fraction(a.cap / torch.cuda.get_device_properties(0).total_memory, 0)
    from zoo import harness

    # The end of every optimizer step, after the GPU's work: step times are the differences.
    marks = []
    harness.on_step = lambda: (torch.cuda.synchronize(), marks.append(time.perf_counter()))
    if a.steps:
        harness.STEPS = a.steps
    ok, error = True, None
    try:
        job.run(a.batch, torch.device("cuda"))
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        ok, error = False, str(e)[:300]
    stats = torch.cuda.memory_stats()
    print("RESULT " + json.dumps({"ok": ok, "error": error, "peak_reserved": torch.cuda.max_memory_reserved(),
                                  "alloc_retries": stats.get("num_alloc_retries"),
                                  "step_s": [b - a_ for a_, b in zip(marks, marks[1:])],
                                  "seconds": time.perf_counter() - t0, "torch": torch.__version__}))
    return 0


def dry_run(job, a, t0):
    """A GPU run stood in for by the job's recording at its tiny size, replayed at the cap."""
    import torch
    import cudamem.estimate as est

    pol = ALLOCATORS[a.allocator]
    e = est.estimate(job.run, a.batch, torch.device("cuda"), True, policies=[pol], device_memory=a.cap)
    print("RESULT " + json.dumps({"ok": e.fits(pol) is not False, "error": None, "dry_run": True,
                                  "peak_reserved": e.peak_reserved[pol], "seconds": time.perf_counter() - t0}))
    return 0


def spawn(args, timeout, env=None):
    """This script run as a child (see :mod:`children`)."""
    from children import spawn as run_child

    return run_child(Path(__file__).resolve(), args, timeout, env, tail=8)


# --- one job -----------------------------------------------------------------------------------


def check(name, a, caps):
    import zoo

    job = zoo.JOBS[name]
    at = job.dry_at if a.dry_run else job.at
    dry = ["--dry"] if a.dry_run else []
    r = {"job": name, "set": "validation" if name in zoo.VALIDATION else "development", "family": job.family,
         "exercises": list(job.exercises), "at": at, "dry_run": a.dry_run}
    missing = [lib for lib in job.needs if importlib.util.find_spec(lib) is None]
    if missing:
        r["skipped"] = f"needs {', '.join(missing)} (see zoo_check.sh for carrying their wheels)"
        return r
    allocators = [x for x in a.allocators.split(",") if x]
    # The GPU-free estimate runs on the CPU beside the measured runs (one more worker).
    with ThreadPoolExecutor(max(1, a.jobs) + 1) as pool:
        free = pool.submit(gpu_free, name, a, caps, at)
        got = list(pool.map(lambda al: (("measured", al), spawn(["run", name, "--batch", at, "--allocator", al, *dry],
                                                                a.timeout)), allocators))
        got.append((("gpu_free", None), free.result()))
    r["measured"] = {al: res for (kind, al), res in got if kind == "measured"}
    gf = r["gpu_free"] = next(res for (kind, _), res in got if kind == "gpu_free")
    for al in allocators:
        meas = r["measured"][al].get("peak_reserved")
        pred = {row["policy"]: row["peak_reserved_bytes"] for row in gf.get("policies", [])}.get(ALLOCATORS[al])
        r["measured"][al]["estimate"] = pred
        r["measured"][al]["error"] = None if not meas or not pred else (pred - meas) / meas
    trials = []
    for label, cap in caps:
        rows = {row["policy"]: row for row in gf.get("largest", {}).get(str(cap), {}).get("rows", [])}
        for al in allocators:
            row = rows.get(ALLOCATORS[al])
            if not row:
                continue
            for role, b in answers(row).items():
                if b is not None:
                    trials += [(label, cap, al, role, b, i) for i in range(a.tries)]
    # Fresh processes, --jobs at a time (each capped, so that they share the GPU).
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        runs = list(pool.map(lambda t: (t, spawn(["run", name, "--batch", t[4], "--cap", t[1], "--allocator", t[2],
                                                   *dry], a.timeout)), trials))
    for (label, _, al, role, b, _), res in runs:
        slot = r.setdefault("capped", {}).setdefault(label, {}).setdefault(al, {}).setdefault(role, {"batch": b,
                                                                                                    "runs": []})
        slot["runs"].append({k: res.get(k) for k in ("ok", "error", "peak_reserved", "seconds")})
    r["verdict"] = verdict(r, caps, allocators)
    return r


def gpu_free(name, a, caps, at):
    """The GPU-free answers for one job: from DIR/zoo-<job>-gpufree.json when that holds these
    capacities (made ahead with --gpu-free-only, on any machine: no GPU is needed), else from
    CPU processes side by side, one for the estimate at the check batch and one per capacity."""
    path = Path(a.out) / f"zoo-{name}-gpufree.json"
    want = [str(c) for _, c in caps]
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("dry_run") == a.dry_run and set(want) <= set(saved.get("largest", {})):
            saved["from_file"] = path.name
            return saved
    dry = ["--dry"] if a.dry_run else []
    parts = [["estimate", name, "--batch", at, *dry]]
    parts += [["estimate", name, "--batch", at, "--caps", c, "--largest-only", *dry] for c in want]
    with ThreadPoolExecutor(len(parts)) as pool:
        got = list(pool.map(lambda p: spawn(p, a.cpu_timeout, {"CUDA_VISIBLE_DEVICES": ""}), parts))
    out = dict(got[0], largest={}, dry_run=a.dry_run)
    for res in got[1:]:
        if "error" in res:
            out.setdefault("largest_errors", []).append(res["error"])
        out["largest"].update(res.get("largest", {}))
        out["seconds"] = max(out.get("seconds", 0), res.get("seconds", 0))
    return out


def answers(row):
    """The batches a largest-batch row names: safe, the top of the may-fit band, the first
    expected failure (the largest verified batch stands in for a band that is empty)."""
    band = row.get("may_fit_band")
    return {"safe": row.get("safe_batch"), "band_top": band[1] if band else None,
            "first_failing": row.get("first_failing_batch")}


def verdict(r, caps, allocators):
    out = {}
    for al in allocators:
        err = r["measured"].get(al, {}).get("error")
        out[f"{al}_estimate_within_5pct"] = err is not None and abs(err) <= 0.05
        for label, _ in caps:
            roles = r.get("capped", {}).get(label, {}).get(al, {})
            safe = [x.get("ok") for x in roles.get("safe", {}).get("runs", [])]
            fail = [x.get("ok") for x in roles.get("first_failing", {}).get("runs", [])]
            out[f"{al}_{label}_safe_ran_every_time"] = bool(safe) and all(x is True for x in safe)
            out[f"{al}_{label}_failure_failed_every_time"] = bool(fail) and all(x is False for x in fail)
    return out


# --- report ------------------------------------------------------------------------------------


def gib(n):
    return f"{n / GIB:.2f}" if isinstance(n, (int, float)) else "-"


def pct(x):
    return "-" if x is None else f"{100 * x:+.1f}%"


def cap_cell(r, label, al):
    roles = r.get("capped", {}).get(label, {}).get(al, {})
    if not roles:
        return "-"
    parts = []
    for role, short in (("safe", "safe"), ("band_top", "band top"), ("first_failing", "fail")):
        slot = roles.get(role)
        if slot:
            runs = slot["runs"]
            ran = sum(x.get("ok") is True for x in runs)
            errs = sum(x.get("ok") is None for x in runs)
            parts.append(f"{short} {slot['batch']}: {ran}/{len(runs)} ran" + (f" ({errs} errors)" if errs else ""))
    return "; ".join(parts)


def table(results, caps, allocators):
    head = ["job", "set", "batch"]
    for al in allocators:
        head += [f"{al}: measured GiB", f"{al}: estimate (error)"]
    head += [f"{label} {al}" for label, _ in caps for al in allocators]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        cells = [r["job"], r["set"], str(r["at"])]
        if "skipped" in r:
            rows.append("| " + " | ".join(cells + [f"skipped: {r['skipped']}"] + [""] * (len(head) - 4)) + " |")
            continue
        for al in allocators:
            m = r.get("measured", {}).get(al, {})
            cells.append(gib(m.get("peak_reserved")) if m.get("ok") else f"error: {str(m.get('error'))[:80]}")
            cells.append(f"{gib(m.get('estimate'))} ({pct(m.get('error'))})" if m.get("estimate") else
                         f"error: {str(r.get('gpu_free', {}).get('error', ''))[:80]}")
        cells += [cap_cell(r, label, al) for label, _ in caps for al in allocators]
        rows.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(rows)


def summary(results, allocators):
    lines = []
    for s in ("development", "validation"):
        rs = [r for r in results if r["set"] == s and "skipped" not in r]
        for al in allocators:
            errs = [abs(r["measured"][al]["error"]) for r in rs if r.get("measured", {}).get(al, {}).get("error")
                    is not None]
            v = [r["verdict"] for r in rs]
            mine = [(k, x) for vv in v for k, x in vv.items() if k.startswith(al + "_")]
            safe = [x for k, x in mine if k.endswith("safe_ran_every_time")]
            fail = [x for k, x in mine if k.endswith("failure_failed_every_time")]
            lines.append(f"- {s}, {al}: {len(errs)} of {len(rs)} jobs estimated, mean |error| "
                         f"{pct(sum(errs) / len(errs)) if errs else '-'}, largest {pct(max(errs)) if errs else '-'}; "
                         f"safe batch ran every time at {sum(safe)} of {len(safe)} capacities; first expected "
                         f"failure failed every time at {sum(fail)} of {len(fail)}")
    return "\n".join(lines)


def each_job(names, out, prefix, a, check_one, start, tell=lambda r: ""):
    """``check_one(name)`` for each job, its result written to OUT/PREFIX-<job>.json: a job
    whose file exists is skipped unless ``a.again``, none starts after ``a.budget`` seconds
    from ``start``, and a job skipped for a missing library is not written (a later run with
    the library runs it) but returned."""
    skipped = []
    for n in names:
        path = out / f"{prefix}-{n}.json"
        if path.exists() and not a.again:
            print(f"{n}: results found in {path}, skipped (--again reruns it)", flush=True)
            continue
        if time.perf_counter() - start > a.budget:
            print(f"{n}: out of time budget, not started", flush=True)
            continue
        t0 = time.perf_counter()
        r = check_one(n)
        r["seconds"] = time.perf_counter() - t0
        if "skipped" in r:
            print(f"{n}: skipped, {r['skipped']}", flush=True)
            skipped.append(r)
            continue
        path.write_text(json.dumps(r, indent=1))
        print(f"{n}: {r['seconds']:.0f} s{tell(r)}", flush=True)
    return skipped


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", help="comma-separated jobs")
    ap.add_argument("--set", choices=["all", "development", "validation"], default="all")
    ap.add_argument("--allocators", default="native,cudamem", help="comma-separated: native, expandable, cudamem")
    ap.add_argument("--caps", help="comma-separated labels of the capacities to check (default: all)")
    ap.add_argument("--tries", type=int, default=3, help="fresh processes per capped batch")
    ap.add_argument("--jobs", type=int, default=3, help="processes side by side")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds for one GPU process")
    ap.add_argument("--cpu-timeout", type=float, default=1800.0, help="seconds for one GPU-free process")
    ap.add_argument("--gpu-free-only", action="store_true",
                    help="only the GPU-free answers, to DIR/zoo-<job>-gpufree.json (no GPU needed)")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds; no job starts past it")
    ap.add_argument("--again", action="store_true", help="rerun jobs whose results are in --out")
    ap.add_argument("--report-only", action="store_true", help="only gather --out's results into the table")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: tiny jobs, CPU recordings for the GPU runs")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    import zoo

    names = a.only.split(",") if a.only else [n for n in zoo.JOBS if a.set == "all" or
                                               (n in zoo.VALIDATION) == (a.set == "validation")]
    unknown = [n for n in names if n not in zoo.JOBS]
    if unknown:
        print(f"unknown jobs {unknown}; known: {list(zoo.JOBS)}", file=sys.stderr)
        return 2
    allocators = [x for x in a.allocators.split(",") if x]
    if not allocators or any(x not in ALLOCATORS for x in allocators):
        print(f"--allocators: from {list(ALLOCATORS)}, got {a.allocators!r}", file=sys.stderr)
        return 2
    if a.tries < 1:
        print(f"--tries: 1 or more, got {a.tries}", file=sys.stderr)
        return 2
    caps = DRY_CAPACITIES if a.dry_run else CAPACITIES
    if a.caps:
        caps = tuple(c for c in caps if c[0] in a.caps.split(","))
    a.allocators = ",".join(allocators)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    start, results_skipped = time.perf_counter(), []
    if a.gpu_free_only:
        import zoo as registry

        for n in names:
            job = registry.JOBS[n]
            missing = [lib for lib in job.needs if importlib.util.find_spec(lib) is None]
            if missing:
                print(f"{n}: skipped, needs {', '.join(missing)}", flush=True)
                continue
            path = out / f"zoo-{n}-gpufree.json"
            path.unlink(missing_ok=True)
            t0 = time.perf_counter()
            res = gpu_free(n, a, caps, job.dry_at if a.dry_run else job.at)
            path.write_text(json.dumps(res, indent=1))
            print(f"{n}: GPU-free answers in {time.perf_counter() - t0:.0f} s -> {path}"
                  + (f" (error: {res['error'][:200]})" if "error" in res else ""), flush=True)
        return 0
    if not a.report_only:
        results_skipped = each_job(names, out, "zoo", a, lambda n: check(n, a, caps), start,
                                   lambda r: f", {r['verdict']}")
    results = [json.loads(p.read_text()) for p in sorted(out.glob("zoo-*.json"))
               if p.name != "zoo-check.json" and not p.name.endswith("-gpufree.json")]
    results = [r for r in results if r["job"] in names or a.report_only] + results_skipped
    results.sort(key=lambda r: (r["set"] != "development", list(zoo.JOBS).index(r["job"]) if r["job"] in zoo.JOBS
                                else 0))
    md = table(results, caps, allocators) + "\n\n" + summary(results, allocators)
    print("\n" + md)
    (out / "zoo-check.json").write_text(json.dumps(results, indent=1))
    title = "Will it fit, on the zoo" + (" (dry run: CPU recordings, not the GPU)" if a.dry_run else "")
    (out / "zoo-check.md").write_text(f"# {title}\n\n{md}\n")
    print(f"\nwrote {out / 'zoo-check.json'} and {out / 'zoo-check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
