"""Steps (2)-(5) of pytorch_tests.sh: collect PyTorch's test_cuda.py, keep the allocator-related
tests, run them with torch's allocator and then with cudamem (each in one pytest process under a
watchdog), and print the table of outcomes and the summary.

Usage (from pytorch_tests.sh, which sets up PYTHONPATH and the plugin):
    python3 pytorch_tests_compare.py TESTS_DIR WORK_DIR DEADLINE_EPOCH_S OUT_DIR_OR_EMPTY
The exit status is 1 when a test passes with torch's allocator and not with cudamem, or when
nothing was selected.
"""

import collections, glob, json, os, re, subprocess, sys, time

from pytorch_tests_merge import summarize  # the summary both print (scripts/gpu/torch on PYTHONPATH)

tests, work, deadline, out = os.path.abspath(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
test_file = os.path.join(tests, "test_cuda.py")
extensions = os.path.join(work, "torch-extensions")  # torch's load_inline builds, for both runs
compiles = []  # the selected tests that build C++ extensions (found below)
per_test = float(os.environ.get("CUDAMEM_PYTEST_TEST_TIMEOUT", "60"))
SELECT = re.compile(os.environ.get("PYTORCH_TESTS_SELECT") or
                    r"memory|caching_allocator|allocator|graph|mempool|mem_pool|snapshot|memory_stats"
                    r"|empty_cache|record_stream|fraction|expandable|cudnn", re.I)


def pytest(phase, args, install, limit):
    """One pytest process under `timeout`; returns (rc, events, seconds). Its output goes to a log."""
    events = os.path.join(work, f"{phase}.events")
    cwd = os.path.join(work, f"{phase}.cwd")
    os.makedirs(cwd, exist_ok=True)
    env = dict(os.environ, CUDAMEM_PYTEST_EVENTS=events, CUDAMEM_PYTEST_INSTALL="1" if install else "0",
               CUDAMEM_PYTEST_TEST_TIMEOUT=str(per_test), TORCH_EXTENSIONS_DIR=extensions,
               CUDAMEM_PYTEST_SLOW_TESTS=",".join(compiles))
    # A build killed with its process (a watchdog, `timeout`) leaves its lock file, and every
    # later load_inline of that extension waits on it for ever; one pytest runs at a time, so
    # a lock present now is such a leftover.
    for lock in glob.glob(os.path.join(extensions, "*", "lock")):
        os.remove(lock)
    cmd = ["timeout", "-k", "10", str(max(1, int(limit))), sys.executable, "-m", "pytest",
           "-p", "cudamem_pytest_plugin", "-p", "no:cacheprovider", "--rootdir", tests] + args
    t0 = time.time()
    with open(os.path.join(work, f"{phase}.log"), "a") as log:
        log.write(f"\n$ {' '.join(cmd[:12])} ... ({len(args)} args)\n")
        log.flush()
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    evs = []
    if os.path.exists(events):
        for line in open(events):
            try:
                evs.append(json.loads(line))
            except ValueError:
                pass
        os.rename(events, events + f".{int(t0 * 1000)}")
    return rc, evs, time.time() - t0


def tail(phase, n=25):
    path = os.path.join(work, f"{phase}.log")
    lines = open(path, errors="replace").read().splitlines() if os.path.exists(path) else []
    print(f"--- last {min(n, len(lines))} lines of pytest's output ({phase}):")
    for ln in lines[-n:]:
        print("    " + ln[:240])


# (2) collect, with torch's allocator
rc, evs, secs = pytest("collect", ["--collect-only", "-q", test_file], False, min(120, deadline - time.time() - 60))
collected = next((e["ids"] for e in evs if e["ev"] == "collected"), [])
print(f"collection: {len(collected)} tests in {secs:.0f}s (pytest rc={rc})")
for e in evs:
    if e["ev"] == "configure":
        print("filled in for this torch:", ", ".join(e.get("compat") or []) or "nothing")
if not collected:
    tail("collect", 40)
selected = [i for i in collected if SELECT.search(i.split("::")[-1])]
part = os.environ.get("PYTORCH_TESTS_PART", "")
if part:
    m = re.fullmatch(r"(\d+)/(\d+)", part)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        sys.exit(f"PYTORCH_TESTS_PART={part!r}: expected K/N with 1 <= K <= N, e.g. 1/2")
    k, n = int(m.group(1)), int(m.group(2))
    size = -(-len(selected) // n)
    print(f"part {k} of {n}: tests {(k - 1) * size + 1}-{min(k * size, len(selected))} of the {len(selected)} selected")
    selected = selected[(k - 1) * size:k * size]
print(f"selected {len(selected)} of {len(collected)} (test name matches {SELECT.pattern}):")
for i in selected:
    print("   ", i)
json.dump({"selected": selected}, open(os.path.join(work, "selected.json"), "w"))
in_process = os.environ.get("PYTORCH_TESTS_MODE", "process") in ("process", "both")


def run(mode, ids, until):
    """Runs ids in one pytest process, again on the rest after a hang or crash, until `until`."""
    results, remaining, attempt = {}, list(ids), 0
    install_modes = set()
    while remaining:
        left = until - time.time()
        if left < 20:
            for i in remaining:
                results[i] = ("not run", "time budget spent")
            break
        rc, evs, secs = pytest(mode, ["-v", "--tb=short"] + [os.path.join(tests, i) for i in remaining],
                               mode == "cudamem", left)
        started = [e["id"] for e in evs if e["ev"] == "start"]
        start_t = {e["id"]: e["t"] for e in evs if e["ev"] == "start"}
        conf = [e for e in evs if e["ev"] == "configure"]
        install_modes.update(str(e.get("install_mode")) for e in conf)
        for e in evs:
            if e["ev"] == "result" and e["id"] in remaining:
                results[e["id"]] = (e["outcome"], e.get("msg", ""))
        print(f"  {mode} pytest #{attempt + 1}: rc={rc}, {secs:.0f}s, {len(started)} started, "
              f"{sum(1 for e in evs if e['ev'] == 'result')} finished")
        remaining = [i for i in remaining if i not in results]
        if not remaining:
            break
        hung = [i for i in started if i not in results]
        if hung:
            # The process ended inside this test: the watchdog (timeout), `timeout`, or a crash.
            culprit = hung[-1]
            ran = time.time() - start_t.get(culprit, time.time())
            kind = "timeout" if rc in (124, 137) or ran >= per_test - 1 else "crash"
            results[culprit] = (kind, f"pytest rc={rc} after {ran:.0f}s in this test")
            remaining.remove(culprit)
        else:
            # Nothing started: pytest could not configure or collect (see its output).
            why = "cudamem install failed" if conf and conf[0].get("error") else f"pytest rc={rc}, no test started"
            for i in remaining:
                results[i] = ("error", why)
            tail(mode, 40)
            break
        attempt += 1
    if mode == "cudamem" and install_modes != {"native"}:
        print(f"  WARNING: cudamem install_mode() in the pytest processes: {sorted(install_modes)}")
    return results, sorted(install_modes)


# Some tests build a C++ extension with torch's load_inline (a dummy pluggable allocator, a
# snapshot binding). On an empty extension cache a build outlasts the per-test watchdog, and two
# variants of the dummy allocator share one build folder, so switching between them rebuilds. So
# these tests get the longer CUDAMEM_PYTEST_BUILD_TIMEOUT in both runs, and run first, once, with
# torch's allocator, outside the comparison, to fill the cache.
src = open(test_file).read()
bodies = dict(re.findall(r"\n    def (test_\w+)\(self[^)]*\):(.*?)(?=\n    (?:@|def )|\nclass |\Z)", src, re.S))
compiles = [i.split("::")[-1] for i in selected
            if re.search(r"load_inline|get_dummy_allocator", bodies.get(i.split("::")[-1], ""))]
if compiles:
    print(f"\n(2b) {len(compiles)} tests that build C++ extensions, run once with torch's allocator to fill torch's extension cache")
    built, _ = run("prebuild", [i for i in selected if i.split("::")[-1] in compiles],
                   min(time.time() + 600, deadline - 120))
    print(f"  outcomes (not compared): {sorted(collections.Counter(o for o, _ in built.values()).items())}")

native = cudamem = {}
modes = {}
if selected and not in_process:
    print("\n(3), (4) skipped: PYTORCH_TESTS_MODE=isolated")
    sys.exit(0)
if selected:
    now = time.time()
    # Half of what is left each, keeping some seconds for the report.
    half = now + (deadline - now - 10) / 2
    print("\n(3) torch's allocator")
    native, modes["native"] = run("native", selected, half)
    print("\n(4) cudamem installed")
    cudamem, modes["cudamem"] = run("cudamem", selected, deadline - 10)
    for m in ("native", "cudamem"):
        tail(m, 12)

print("\n(5) results")
w = max([len(i) for i in selected] + [20])
print(f"{'test':<{w}}  {'native':<9} {'cudamem':<9}")
for i in selected:
    n, c = native.get(i, ("-", ""))[0], cudamem.get(i, ("-", ""))[0]
    print(f"{i:<{w}}  {n:<9} {c:<9}")
    if c != n and c != "passed":
        print(f"{'':<{w}}    cudamem: {cudamem.get(i, ('', ''))[1][:200]}")
    if n not in ("passed", "skipped") and n != c:
        print(f"{'':<{w}}    native: {native.get(i, ('', ''))[1][:200]}")
passed_native, both, regressions = summarize(selected, native, cudamem)
if out:
    json.dump({"selected": selected, "collected": len(collected), "install_modes": modes,
               "native": {i: list(v) for i, v in native.items()},
               "cudamem": {i: list(v) for i, v in cudamem.items()},
               "passed_native": passed_native, "passed_both": both, "regressions": regressions},
              open(os.path.join(out, "pytorch-tests.json"), "w"), indent=1)
    for phase in ("collect", "prebuild", "native", "cudamem"):
        src = os.path.join(work, f"{phase}.log")
        if os.path.exists(src):
            with open(os.path.join(out, f"pytorch-tests-{phase}.log"), "w") as f:
                f.write(open(src, errors="replace").read())
                stacks = os.path.join(work, f"{phase}.events.stacks")  # the watchdog's dumps
                if os.path.exists(stacks):
                    f.write("\n===== per-test watchdog\n" + open(stacks, errors="replace").read())
sys.exit(1 if regressions or not selected else 0)
