"""Sleep and wake side by side: cudamem against torch_memory_saver, on one GPU.

    python3 sleep_compare.py [--rounds 3] [--weights-mib 512] [--kv-mib 1536] [--json out.json]

Each side runs in its own process (each replaces or wraps torch's allocator), alternated
`--rounds` times: a model's weights and a KV-cache-sized buffer are allocated under a tag, one
forward pass and one CUDA graph are recorded, then the tag is slept with its bytes kept in host
memory, a second workload fills the memory returned, and the tag is woken. Reported per side:
the device's free memory before and after the sleep, sleep and wake time (and per GiB), whether
the outputs after wake and the graph replayed after wake are bitwise equal to before.

Sides: `cudamem` (cudamem.torch.install(); cudamem.tag/sleep/wake_up), `tms-preload`
(torch_memory_saver's documented mode: LD_PRELOAD of its hook, region(enable_cpu_backup=True),
pause/resume, graphs through torch_memory_saver.cuda_graph) and `tms-torch` (its
CUDAPluggableAllocator mode, which it documents as not supporting graphs). A side whose package
is missing is reported as skipped.
"""

import argparse
import json
import os
import subprocess
import sys
import time

MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))


def child(side, weights_mib, kv_mib):
    import torch

    if side == "cudamem":
        import cudamem
        import cudamem.torch as ct

        ct.install(native=True)
        region = lambda tag: cudamem.tag(tag)  # noqa: E731
        sleep = lambda: cudamem.sleep(["weights", "kv"], offload=True)  # noqa: E731
        wake = lambda: cudamem.wake_up(["weights", "kv"])  # noqa: E731
        graph_ctx = lambda g: torch.cuda.graph(g)  # noqa: E731
    else:
        from torch_memory_saver import torch_memory_saver as tms

        tms.hook_mode = "preload" if side == "tms-preload" else "torch"
        region = lambda tag: tms.region(tag=tag, enable_cpu_backup=True)  # noqa: E731
        sleep = lambda: (tms.pause("weights"), tms.pause("kv"))  # noqa: E731
        wake = lambda: (tms.resume("weights"), tms.resume("kv"))  # noqa: E731
        graph_ctx = (lambda g: tms.cuda_graph(g, tag="graph", enable_cpu_backup=True)) if side == "tms-preload" else None
    torch.manual_seed(0)
    n = max(1, weights_mib // 64)  # Linear(4096, 4096) in fp32 is 64 MiB
    with region("weights"):
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(n)]).cuda()
    with region("kv"):
        kv = torch.randn(kv_mib * MIB // 4, device="cuda")
    x = torch.randn(64, 4096, device="cuda")
    res = {"side": side, "torch": torch.__version__, "bytes": n * 64 * MIB + kv_mib * MIB}
    with torch.no_grad():
        before = model(x).clone()
        g, static_out = None, None
        if graph_ctx is not None:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                model(x)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with graph_ctx(g):
                static_out = model(x)
    kv_sum = kv.double().sum().item()
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    t0 = time.perf_counter()
    sleep()
    torch.cuda.synchronize()
    res["sleep_s"] = time.perf_counter() - t0
    free1, _ = torch.cuda.mem_get_info()
    res["free_before"], res["free_asleep"] = free0, free1
    other = torch.empty(max(0, free1 - free0 - 64 * MIB), dtype=torch.uint8, device="cuda")
    other.fill_(7)  # a second workload uses what was returned
    torch.cuda.synchronize()
    del other
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    wake()
    torch.cuda.synchronize()
    res["wake_s"] = time.perf_counter() - t0
    with torch.no_grad():
        res["outputs_equal"] = bool(torch.equal(model(x), before)) and kv.double().sum().item() == kv_sum
    if g is not None:
        g.replay()
        torch.cuda.synchronize()
        res["graph_equal"] = bool(torch.equal(static_out, before))
    print("RESULT " + json.dumps(res), flush=True)


def spawn(side, a):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if side == "tms-preload":
        try:
            from torch_memory_saver.utils import get_binary_path_from_package

            env["LD_PRELOAD"] = str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))
        except Exception as e:  # missing package or binary: the side is skipped
            return {"side": side, "skipped": f"{type(e).__name__}: {e}"}
    if side.startswith("tms"):
        try:
            import torch_memory_saver  # noqa: F401
        except ImportError as e:
            return {"side": side, "skipped": f"torch_memory_saver not installed ({e})"}
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side, str(a.weights_mib), str(a.kv_mib)],
                       capture_output=True, text=True, timeout=240, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    tail = " | ".join((r.stdout + r.stderr).strip().splitlines()[-8:])
    if not lines:
        return {"side": side, "error": tail}
    res = json.loads(lines[-1][7:])
    if r.returncode != 0:  # measured, but the process failed afterwards (at teardown)
        res["exit_error"] = f"rc={r.returncode}: " + tail[-300:]
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--weights-mib", type=int, default=512)
    ap.add_argument("--kv-mib", type=int, default=1536)
    ap.add_argument("--sides", default="cudamem,tms-preload,tms-torch")
    ap.add_argument("--json", default="")
    ap.add_argument("--from-json", default="", help="only print the table of an earlier run's --json")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            runs = json.load(f)
        for r in runs:  # results printed before a teardown failure was told apart
            if "error" in r and r["error"].startswith("RESULT "):
                got = json.loads(r["error"][7:].split(" | ")[0])
                got.update(round=r.get("round"), exit_error=r["error"].split(" | ", 1)[1][-300:])
                r.clear()
                r.update(got)
        return report(runs, a)
    runs = []
    for rnd in range(a.rounds):
        for side in a.sides.split(","):
            r = spawn(side, a)
            r["round"] = rnd
            runs.append(r)
            print(json.dumps(r), flush=True)
    return report(runs, a)


def report(runs, a):
    print("\n| side | GiB slept | free before → asleep GiB | sleep ms (per GiB) | wake ms (per GiB) | outputs equal | graph equal |")
    print("|---|---|---|---|---|---|---|")
    for side in a.sides.split(","):
        ok = [r for r in runs if r["side"] == side and "sleep_s" in r]
        if not ok:
            bad = next((r for r in runs if r["side"] == side), {})
            print(f"| {side} | {bad.get('skipped') or bad.get('error', '')[:200]} | | | | | |")
            continue
        med = lambda k: sorted(r[k] for r in ok)[len(ok) // 2]  # noqa: E731
        gib = ok[0]["bytes"] / 2**30
        f0, f1 = med("free_before") / 2**30, med("free_asleep") / 2**30
        ge = {True: "yes", False: "no"}
        graphs = "/".join(ge[r["graph_equal"]] for r in ok) if "graph_equal" in ok[0] else "not supported"
        print(f"| {side} | {gib:.2f} | {f0:.2f} → {f1:.2f} (+{(f1 - f0) * 1024:.0f} MiB) | {med('sleep_s') * 1e3:.0f} "
              f"({med('sleep_s') * 1e3 / gib:.0f}) | {med('wake_s') * 1e3:.0f} ({med('wake_s') * 1e3 / gib:.0f}) | "
              f"{'/'.join(ge[r['outputs_equal']] for r in ok)} | {graphs} |"
              + (f" exits with an error after the measurement: {ok[0]['exit_error'][-120:]}" if "exit_error" in ok[0] else ""))
    if a.json and not a.from_json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
