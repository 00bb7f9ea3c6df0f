"""PyTorch's allocator tests one test per process, with torch's allocator and with cudamem.

pytorch_tests.sh runs the selected tests of test_cuda.py in one pytest process per allocator,
where each test starts with what the ones before it left (cached segments, pools, cuBLAS
handles). A user's job starts fresh, so this runs every test in a fresh interpreter: one
``pytest <file>::<test>`` process per test and allocator, several at a time (``--jobs``), with
the same plugin (``cudamem_pytest_plugin``: cudamem installed before collection, or not).

Processes side by side share the GPU, which tests that read the device's free memory notice.
So every test whose outcome differs between the allocators runs again, alone, once per
allocator, and that serial run is its result.

    python3 scripts/gpu/torch/pytorch_tests_isolated.py --tests DIR --ids FILE [--jobs 12] \
        [--budget-s 400] [--out DIR]

``--ids``: a pytorch-tests.json of pytorch_tests.sh (its ``selected``) or a file of test ids, one
a line. Writes ``pytorch-tests-isolated.json`` to ``--out``. Exit 1 when a test passes with
torch's allocator and not with cudamem.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

from pytorch_tests_merge import summarize


def run_one(test_file, rootdir, test_id, install, work, limit):
    """(outcome, message, seconds) of one test in its own pytest process."""
    fd, events = tempfile.mkstemp(dir=work, suffix=".events")
    os.close(fd)
    cwd = tempfile.mkdtemp(dir=work)
    env = dict(os.environ, CUDAMEM_PYTEST_EVENTS=events, CUDAMEM_PYTEST_INSTALL="1" if install else "0",
               CUDAMEM_PYTEST_TEST_TIMEOUT=str(limit))
    name = test_id.split("::", 1)[1] if "::" in test_id else test_id
    cmd = ["timeout", "-k", "10", str(int(limit) + 60), sys.executable, "-m", "pytest", "-p", "cudamem_pytest_plugin",
           "-p", "no:cacheprovider", "-q", "--rootdir", rootdir, f"{test_file}::{name}"]  # fmt: skip
    t0 = time.time()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.time() - t0
    outcome, msg, segments = None, "", None
    for line in open(events):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("ev") == "result":
            outcome, msg = e["outcome"], e.get("msg", "")
        elif e.get("ev") == "segments":
            segments = e["segments"]
        elif e.get("ev") == "configure" and install and e.get("install_mode") != "native":
            outcome, msg = "error", f"cudamem install_mode() {e.get('install_mode')!r}, not native"
    if outcome is None:
        tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
        outcome, msg = ("timeout" if r.returncode in (124, 137) else "crash"), f"rc={r.returncode}: {' | '.join(tail)}"
    if segments is not None:  # CUDAMEM_PYTEST_SEGMENTS=1: what the test started with, in brief
        msg += f" [started with {len(segments)} segments: " + ", ".join(
            f"pool {tuple(g['pool'])} {g['size'] >> 20} MiB{' exp' if g['expandable'] else ''}" for g in segments[:6]) + "]"
    return outcome, msg[:500], took


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tests", required=True, help="the folder of test_cuda.py")
    ap.add_argument("--ids", required=True)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--test-timeout", type=float, default=120)
    ap.add_argument("--out")
    args = ap.parse_args()
    deadline = time.time() + args.budget_s
    tests = os.path.abspath(args.tests)
    test_file = os.path.join(tests, "test_cuda.py")
    text = open(args.ids).read()
    ids = json.loads(text)["selected"] if text.lstrip().startswith("{") else [l.strip() for l in text.splitlines() if l.strip()]
    work = tempfile.mkdtemp(prefix="pytorch-tests-isolated.")
    results = {"native": {}, "cudamem": {}}
    jobs = [(i, m) for i in ids for m in ("native", "cudamem")]
    print(f"{len(ids)} tests x 2 allocators, one process each, {args.jobs} at a time")
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {}
        for i, m in jobs:
            futures[pool.submit(lambda i=i, m=m: run_one(test_file, tests, i, m == "cudamem", work, args.test_timeout)
                                if time.time() < deadline - 30 else ("not run", "time budget spent", 0.0))] = (i, m)
        for f in concurrent.futures.as_completed(futures):
            i, m = futures[f]
            results[m][i] = f.result()[:2]
    print(f"side by side: {time.time() - t0:.0f} s")
    again = [i for i in ids if results["native"][i][0] != results["cudamem"][i][0]]
    print(f"{len(again)} tests again, alone (their outcomes differed side by side)")
    alone = set()
    for i in again:
        if time.time() > deadline - 2 * args.test_timeout:
            print(f"  time budget spent: {i} and the rest keep their side-by-side outcomes")
            break
        for m in ("native", "cudamem"):
            results[m][i] = run_one(test_file, tests, i, m == "cudamem", work, args.test_timeout)[:2]
        alone.add(i)
    w = max([len(i) for i in ids] + [20])
    print(f"\n{'test (one process each)':<{w}}  {'native':<9} {'cudamem':<9}")
    for i in ids:
        n, c = results["native"][i], results["cudamem"][i]
        mark = " (alone)" if i in alone else ""
        print(f"{i:<{w}}  {n[0]:<9} {c[0]:<9}{mark}")
        if n[0] != c[0]:
            print(f"{'':<{w}}    native: {n[1][:400]}\n{'':<{w}}    cudamem: {c[1][:400]}")
    _, both, regressions = summarize(ids, results["native"], results["cudamem"], " (one test per process)")
    if args.out:
        with open(os.path.join(args.out, "pytorch-tests-isolated.json"), "w") as f:
            json.dump({"selected": ids, "native": {i: list(v) for i, v in results["native"].items()},
                       "cudamem": {i: list(v) for i, v in results["cudamem"].items()}, "alone": sorted(alone),
                       "passed_both": both, "regressions": regressions}, f, indent=1)
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
