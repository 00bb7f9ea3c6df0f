"""Under a memory cap: the largest batch that runs, and the step time, per allocator.

    python3 scripts/gpu/torch/cap_check.py [--out DIR] [--only a,b] [--caps 24GiB,40GiB]
    python3 scripts/gpu/torch/cap_check.py --dry-run [--only moe_switch]   # no GPU needed

For each job of the zoo (scripts/gpu/torch/zoo; by default :data:`DEFAULT_JOBS`, fixed and
variable shapes) and each cap (``torch.cuda.set_per_process_memory_fraction``), with torch's
allocator (``native``), torch's with ``expandable_segments:True`` and cudamem:

1. **The largest batch that runs.** Starting from the GPU-free ``largest_batch`` of the
   allocator's policy (zoo_check.py's answers, computed on the CPU), batches are tried in fresh
   processes: upwards in growing steps until one fails, then halving the gap. The largest that
   ran is tried ``--tries`` times in all; if any try fails, the next lower batch is confirmed
   the same way. A process is one job's whole run (build, three steps), under its cap, so caps
   side by side share the GPU (``--jobs``).
2. **Step time at a batch all three fit** (the smallest of their largest batches): processes
   alone on the GPU, the allocators alternated for ``--rounds`` rounds, each process running
   ``--steps`` optimizer steps; a process's figure is the median of its steps after the first.
   The ratios to torch's allocator are per round (the machine's speed drifts between rounds),
   reported as the median and the range over rounds. Jobs that make no optimizer steps
   (inference) use the whole run's time.

Each job's results go to DIR/cap-<job>.json when it is done (a later run skips the jobs found
there unless --again); DIR/cap-check.json and DIR/cap-check.md gather them. ``--dry-run``
builds each job at its tiny size and stands a CPU recording in for every GPU run, at caps of
:data:`zoo_check.DRY_CAPACITIES`: it tries the orchestration; its figures are not the GPU's.
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import zoo_check  # noqa: E402 (the child processes, the GPU-free answers, the capacities)

ORDER = ("native", "expandable", "cudamem")
#: Fixed and variable shapes, training and inference, several families.
DEFAULT_JOBS = ("gpt2_train", "llama_ckpt", "t5_translation", "deeplab_seg", "resnet_streams", "moe_switch",
                "bert_varlen", "llama_generate", "unet_diffusion", "whisper_speech", "convnext_cl")
#: What makes a job's shapes vary from step to step (the jobs where defragmenting should pay).
VARIABLE = ("variable-length batches", "KV-cache generation", "MoE routing")
#: The most batches tried upwards or downwards before giving up on a bound.
MAX_PROBES = 12


def search(runs, start, hi_limit=1 << 20):
    """The largest batch for which ``runs(batch)`` holds, from a first guess ``start``: upwards
    (or downwards) in doubling steps to a bracket, then bisection. Returns (largest that ran or
    0, first that failed or None, the batches tried in order). Assumes a batch runs when every
    larger one that ran does (memory grows with the batch); a job too large for batch 1
    returns 0."""
    tried, ok, bad = [], 0, None
    b, step = max(1, start), max(1, start // 50)
    for _ in range(MAX_PROBES):
        tried.append(b)
        if runs(b):
            ok = b
            if bad is not None or b >= hi_limit:
                break
            b, step = b + step, step * 2
        else:
            bad = b
            if ok or b == 1:
                break
            b, step = max(1, b - step), step * 2
    while bad is not None and bad - ok > 1 and len(tried) < 3 * MAX_PROBES:
        mid = (ok + bad) // 2
        tried.append(mid)
        if runs(mid):
            ok = mid
        else:
            bad = mid
    return ok, bad, tried


def largest_that_runs(name, a, cap, allocator, start):
    """`search` with one fresh process per try, then ``--tries`` in all at the answer (one
    lower while a try fails)."""
    dry = ["--dry"] if a.dry_run else []
    log = []

    def runs(b):
        r = zoo_check.spawn(["run", name, "--batch", b, "--cap", cap, "--allocator", allocator, *dry], a.timeout)
        log.append({"batch": b, **{k: r.get(k) for k in ("ok", "error", "peak_reserved", "alloc_retries")}})
        return bool(r.get("ok"))

    ok, bad, _ = search(runs, start)
    # Every try at the answer must run; a batch that fails once is not the answer.
    while ok > 0 and not all(runs(ok) for _ in range(a.tries - 1)):
        bad, ok = ok, ok - 1
        while ok > 0 and not runs(ok):
            bad, ok = ok, ok - 1
    return {"largest": ok, "first_failed": bad, "start": start, "tries": log}


def step_times(name, a, cap, batch):
    """Per round, each allocator's median step time at ``batch`` (processes alone, allocators
    alternated, the first of each round rotated)."""
    dry = ["--dry"] if a.dry_run else []
    rounds = []
    for k in range(a.rounds):
        order = ORDER[k % 3:] + ORDER[:k % 3]
        row = {}
        for al in order:
            r = zoo_check.spawn(["run", name, "--batch", batch, "--cap", cap, "--allocator", al, "--steps", a.steps,
                                 *dry], a.timeout)
            steps = r.get("step_s") or []
            row[al] = {"ok": r.get("ok"), "error": r.get("error"), "alloc_retries": r.get("alloc_retries"),
                       "s": statistics.median(steps) if steps else r.get("seconds"), "per_step": bool(steps)}
        rounds.append(row)
    ratios = {}
    for al in ("expandable", "cudamem"):
        rs = [r[al]["s"] / r["native"]["s"] for r in rounds
              if r[al]["ok"] and r["native"]["ok"] and r[al]["s"] and r["native"]["s"]]
        ratios[al] = {"median": statistics.median(rs), "min": min(rs), "max": max(rs)} if rs else None
    return {"batch": batch, "rounds": rounds, "ratio_to_native": ratios}


def check(name, a, caps):
    import zoo

    job = zoo.JOBS[name]
    r = {"job": name, "family": job.family, "exercises": list(job.exercises),
         "variable": any(x in VARIABLE for x in job.exercises), "dry_run": a.dry_run}
    missing = [lib for lib in job.needs if importlib.util.find_spec(lib) is None]
    if missing:
        r["skipped"] = f"needs {', '.join(missing)}"
        return r
    at = job.dry_at if a.dry_run else job.at
    free = zoo_check.gpu_free(name, a, caps, at)
    for label, cap in caps:
        rows = {row["policy"]: row for row in free.get("largest", {}).get(str(cap), {}).get("rows", [])}
        starts = {al: (rows.get(zoo_check.ALLOCATORS[al]) or {}).get("largest_batch") or at for al in ORDER}
        with ThreadPoolExecutor(max(1, a.jobs)) as pool:
            found = dict(zip(ORDER, pool.map(lambda al: largest_that_runs(name, a, cap, al, starts[al]), ORDER)))
        c = r.setdefault("caps", {})[label] = {"cap": cap, "largest": found}
        common = min(f["largest"] for f in found.values())
        if common > 0 and a.rounds > 0:
            c["time"] = step_times(name, a, cap, common)
    return r


def pct(x):
    return "-" if x is None else f"{100 * x:+.1f}%"


def table(results, caps):
    head = ["job", "shapes"]
    for label, _ in caps:
        head += [f"{label}: largest batch native / expandable / cudamem", "cudamem vs expandable",
                 "step time ÷ native: expandable, cudamem (median, range)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['job']} | skipped: {r['skipped']} |")
            continue
        cells = [r["job"], "variable" if r["variable"] else "fixed"]
        for label, _ in caps:
            c = r.get("caps", {}).get(label)
            if not c:
                cells += ["-", "-", "-"]
                continue
            big = {al: c["largest"][al]["largest"] for al in ORDER}
            cells.append(" / ".join(str(big[al]) for al in ORDER))
            cells.append(pct(big["cudamem"] / big["expandable"] - 1) if big["expandable"] else "-")
            t = (c.get("time") or {}).get("ratio_to_native") or {}
            cells.append(", ".join(
                "-" if not t.get(al) else f"{t[al]['median']:.3f} ({t[al]['min']:.3f}–{t[al]['max']:.3f})"
                for al in ("expandable", "cudamem")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", help="comma-separated jobs (default: DEFAULT_JOBS)")
    ap.add_argument("--caps", help="comma-separated labels of the caps (default: all)")
    ap.add_argument("--tries", type=int, default=3, help="fresh processes at the largest batch")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of step timing (0: none)")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps of a timed process")
    ap.add_argument("--jobs", type=int, default=3, help="capped processes side by side")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds for one GPU process")
    ap.add_argument("--cpu-timeout", type=float, default=1800.0, help="seconds for one GPU-free process")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds; no job starts past it")
    ap.add_argument("--again", action="store_true", help="rerun jobs whose results are in --out")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: tiny jobs, CPU recordings for the GPU runs")
    a = ap.parse_args()
    import zoo

    names = a.only.split(",") if a.only else list(DEFAULT_JOBS)
    unknown = [n for n in names if n not in zoo.JOBS]
    if unknown:
        print(f"unknown jobs {unknown}; known: {list(zoo.JOBS)}", file=sys.stderr)
        return 2
    for flag, v, low in (("--tries", a.tries, 1), ("--rounds", a.rounds, 0), ("--steps", a.steps, 3)):
        if v < low:
            print(f"{flag}: {low} or more, got {v}", file=sys.stderr)
            return 2
    caps = zoo_check.DRY_CAPACITIES if a.dry_run else zoo_check.CAPACITIES
    if a.caps:
        wanted = a.caps.split(",")
        bad = [c for c in wanted if c not in dict(caps)]
        if bad:
            print(f"--caps: from {[c for c, _ in caps]}, got {bad}", file=sys.stderr)
            return 2
        caps = tuple(c for c in caps if c[0] in wanted)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    zoo_check.each_job(names, out, "cap", a, lambda n: check(n, a, caps), time.perf_counter())
    results = [json.loads((out / f"cap-{n}.json").read_text()) for n in names if (out / f"cap-{n}.json").exists()]
    md = table(results, caps)
    print("\n" + md)
    (out / "cap-check.json").write_text(json.dumps(results, indent=1))
    title = "Largest batch and step time under a cap" + (" (dry run: CPU recordings, not the GPU)"
                                                          if a.dry_run else "")
    (out / "cap-check.md").write_text(f"# {title}\n\n{md}\n")
    print(f"\nwrote {out / 'cap-check.json'} and {out / 'cap-check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
