"""Step (e) of scripts/gpu/torch/run.sh: memory history and snapshots with cudamem installed,
opened by PyTorch's own tools.

1. cudamem installed; history recorded through torch's own (patched) API,
   `torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python")`;
   a few training steps of a small MLP and a tiny CNN (AdamW), an out-of-memory caught as
   torch.OutOfMemoryError, one more step; `torch.cuda.memory._dump_snapshot()` to
   $OUT/cudamem_snapshot.pickle (must stay < 10 MB).
2. Checks on the snapshot: PyTorch's keys, alloc entries carry Python frames naming this file
   and its functions, the oom entry, blocks adding up to their segments.
3. PyTorch's tools on it, each PASS or FAIL (a tool that raises: FAIL with its traceback):
   `python3 -m torch.cuda._memory_viz stats FILE`, `... trace FILE`,
   `torch.cuda._memory_viz.trace_plot(snapshot)` and `segment_plot(snapshot)` written as HTML
   (non-empty, and the snapshot embedded in it unpickles to the same events).
4. cudamem's own reports on it (report_leaks, report_why, viz).
5. The same workload in a subprocess with PyTorch's own allocator and its own
   `_record_memory_history` / `_dump_snapshot` ($OUT/native_snapshot.pickle); both `stats`
   outputs side by side (first lines) and the event counts per action.

Usage: python3 history_check.py            (output files in $OUT, else a temporary folder)
       python3 history_check.py --native FILE   (internal: step 5's subprocess)
Exit status 1 if any check failed.
"""

import base64
import collections
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
import traceback

MAX_SNAPSHOT_BYTES = 10 * 1000 * 1000
STEPS = 4


# --------------------------------------------------------------------------------------------
# The workload (run the same way with cudamem and with PyTorch's allocator)
# --------------------------------------------------------------------------------------------


def build_models(torch):
    nn = torch.nn
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    cnn = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10),
    ).cuda()  # fmt: skip
    opt = torch.optim.AdamW(list(mlp.parameters()) + list(cnn.parameters()), lr=1e-3)
    return mlp, cnn, opt


def train_step(torch, mlp, cnn, opt):
    x = torch.randn(256, 512, device="cuda")
    img = torch.randn(32, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    loss = torch.nn.functional.cross_entropy(mlp(x), y) + torch.nn.functional.cross_entropy(cnn(img), y[:32])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def provoke_oom(torch):
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
    except torch.OutOfMemoryError as e:
        return f"torch.OutOfMemoryError: {str(e).splitlines()[0][:100]}"
    except RuntimeError as e:
        return f"RuntimeError (not torch.OutOfMemoryError): {str(e).splitlines()[0][:100]}"
    return None


def workload(torch):
    mlp, cnn, opt = build_models(torch)
    losses = [train_step(torch, mlp, cnn, opt) for _ in range(STEPS - 1)]
    oom = provoke_oom(torch)
    losses.append(train_step(torch, mlp, cnn, opt))
    torch.cuda.synchronize()
    return losses, oom


def native_main(path):
    """Step 5: PyTorch's own allocator, history and dump."""
    import torch

    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
    losses, oom = workload(torch)
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"native: losses {[round(v, 4) for v in losses]}; oom: {oom}; snapshot {os.path.getsize(path)} bytes")


# --------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------

failures = []
passes = []


def check(ok, what, detail=None):
    print(("PASS " if ok else "FAIL ") + what)
    if not ok and detail:
        print(detail.rstrip())
    (passes if ok else failures).append(what)
    return ok


def head(text, n):
    return "\n".join(text.splitlines()[:n])


def run_memviz(args, out_file, timeout=90):
    """`python3 -m torch.cuda._memory_viz ARGS`: (ok, stdout, detail)."""
    cmd = [sys.executable, "-m", "torch.cuda._memory_viz", *args]
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "", f"  $ {' '.join(cmd)}\n  timed out after {timeout} s"
    dt = time.perf_counter() - t0
    if out_file:
        with open(out_file, "w") as f:
            f.write(r.stdout)
            if r.stderr:
                f.write("\n--- stderr\n" + r.stderr)
    detail = f"  $ {' '.join(cmd)}  (rc {r.returncode}, {dt:.1f} s)\n" + "\n".join("  " + l for l in r.stderr.splitlines()[-40:])
    return r.returncode == 0, r.stdout, detail


def action_counts(snap):
    c = collections.Counter()
    for dev in snap["device_traces"]:
        for e in dev:
            c[e["action"]] += 1
    return c


def embedded_snapshot(html):
    """The snapshot that _memory_viz's HTML embeds: a JSON list [{"name": ..., "base64": ...}]
    holding the pickle (zero-padded to a multiple of 3 bytes, after the pickle's STOP)."""
    m = re.search(r'(\[\{"name": "[^"]*", "base64": "[A-Za-z0-9+/=]*"\}\])', html)
    if m is None:
        raise ValueError("no embedded [{name, base64}] snapshot found in the HTML")
    files = json.loads(m.group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def check_snapshot(snap, path, here_file):
    check(set(snap) >= {"segments", "device_traces", "allocator_settings", "external_annotations"},
          f"snapshot has PyTorch's keys ({sorted(snap)})")  # fmt: skip
    size = os.path.getsize(path)
    check(size < MAX_SNAPSHOT_BYTES, f"dumped snapshot is {size / 1e6:.2f} MB (< 10 MB)")
    counts = action_counts(snap)
    print(f"  events per action: {dict(sorted(counts.items()))}")
    allocs = [e for dev in snap["device_traces"] for e in dev if e["action"] == "alloc"]
    with_frames = [e for e in allocs if e.get("frames")]
    check(len(allocs) > 0, f"history recorded {len(allocs)} alloc entries")
    print(f"  {len(with_frames)} of {len(allocs)} alloc entries carry Python frames "
          "(allocations on autograd's engine threads have none, as with PyTorch's allocator)")  # fmt: skip
    ours = [e for e in with_frames if any(os.path.basename(f["filename"]) == here_file for f in e["frames"])]
    names = collections.Counter(f["name"] for e in ours for f in e["frames"] if os.path.basename(f["filename"]) == here_file)
    check(bool(ours) and names["train_step"] > 0 and names["workload"] > 0,
          f"alloc frames name this file and its functions: {dict(names.most_common(6))}")  # fmt: skip
    if ours:
        e = ours[0]
        print("  e.g. alloc of", e["size"], "bytes at", hex(e["addr"]), "from:")
        for f in e["frames"][:8]:
            print(f"      {f['filename']}:{f['line']} {f['name']}")
    ooms = [e for dev in snap["device_traces"] for e in dev if e["action"] == "oom"]
    check(len(ooms) == 1 and ooms[0]["size"] >= 1 << 50 and "device_free" in ooms[0],
          f"the out-of-memory is an oom entry ({[(e['size'], e.get('device_free')) for e in ooms]})")  # fmt: skip
    if ooms:
        check("provoke_oom" in [f["name"] for f in ooms[0].get("frames", [])], "the oom entry's frames name provoke_oom")
    bad = [s["address"] for s in snap["segments"] if sum(b["size"] for b in s["blocks"]) != s["total_size"]]
    check(not bad and snap["segments"], f"{len(snap['segments'])} segments, blocks add up to each segment's size")


def check_tools(snap, path, out, tag):
    """PyTorch's tools on the snapshot at `path`. Returns the `stats` output."""
    ok, stats_out, detail = run_memviz(["stats", path], os.path.join(out, f"{tag}_memviz_stats.txt"))
    check(ok and "total_reserved" in stats_out, f"[{tag}] python3 -m torch.cuda._memory_viz stats", detail)
    if ok:
        print(head(stats_out, 8))
    ok, trace_out, detail = run_memviz(["trace", path], os.path.join(out, f"{tag}_memviz_trace.txt"))
    n_entries = sum(len(d) for d in snap["device_traces"])
    ok = ok and re.search(r"^\d+ entries$", trace_out, re.M) is not None and "TOTAL MEM" in trace_out
    check(ok, f"[{tag}] python3 -m torch.cuda._memory_viz trace ({n_entries} entries)", detail)
    if ok:
        print(head(trace_out, 6))
        oom_lines = [l for l in trace_out.splitlines() if "OutOfMemoryError" in l]
        check(bool(oom_lines), f"[{tag}] trace shows the OOM: {oom_lines[:1]}")
    from torch.cuda import _memory_viz

    for name, fn in (("trace_plot", _memory_viz.trace_plot), ("segment_plot", _memory_viz.segment_plot)):
        try:
            html = fn(snap)
        except Exception:
            check(False, f"[{tag}] torch.cuda._memory_viz.{name}(snapshot)", traceback.format_exc())
            continue
        file = os.path.join(out, f"{tag}_{name}.html")
        with open(file, "w") as f:
            f.write(html)
        check(isinstance(html, str) and len(html) > 1000,
              f"[{tag}] torch.cuda._memory_viz.{name}(snapshot): {len(html) / 1e3:.0f} kB of HTML ({os.path.basename(file)})")  # fmt: skip
        try:
            back = embedded_snapshot(html)
            same = [len(d) for d in back["device_traces"]] == [len(d) for d in snap["device_traces"]]
            same = same and len(back["segments"]) == len(snap["segments"])
            check(same, f"[{tag}] the snapshot embedded in the {name} HTML has the same events and segments")
        except Exception:
            check(False, f"[{tag}] the snapshot embedded in the {name} HTML", traceback.format_exc())
    return stats_out


def side_by_side(left, right, title_l, title_r, n=14, width=62):
    print(f"  {title_l:<{width}} | {title_r}")
    print(f"  {'-' * width}-+-{'-' * width}")
    ll, rl = left.splitlines()[:n], right.splitlines()[:n]
    for i in range(max(len(ll), len(rl))):
        a = ll[i] if i < len(ll) else ""
        b = rl[i] if i < len(rl) else ""
        a = a if len(a) <= width else a[: width - 1] + "…"
        b = b if len(b) <= width else b[: width - 1] + "…"
        print(f"  {a:<{width}} | {b}")


def main():
    out = os.environ.get("OUT") or tempfile.mkdtemp(prefix="cudamem-history-")
    os.makedirs(out, exist_ok=True)
    here_file = os.path.basename(__file__)
    t_start = time.perf_counter()

    import cudamem
    import cudamem.torch

    cudamem.torch.install()
    import torch

    print(f"cudamem {cudamem.__version__} installed (mode {cudamem.torch.install_mode()}), torch {torch.__version__}")
    print("\n--- (1) history through torch's patched API, training, OOM, dump")
    check(torch.cuda.memory._record_memory_history is cudamem.torch._torch_record_memory_history
          and torch.cuda.memory._snapshot is cudamem.torch._torch_snapshot,
          "torch.cuda.memory._record_memory_history/_snapshot/_dump_snapshot are cudamem's")  # fmt: skip
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=100000)
    t0 = time.perf_counter()
    losses, oom = workload(torch)
    dt = time.perf_counter() - t0
    print(f"  {STEPS} steps + OOM in {dt:.2f} s; losses {[round(v, 4) for v in losses]}")
    check(oom is not None and oom.startswith("torch.OutOfMemoryError"), f"OOM caught: {oom}")
    path = os.path.join(out, "cudamem_snapshot.pickle")
    with cudamem.annotate_region("dump"):
        snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._dump_snapshot(path)
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"  wrote {path} ({os.path.getsize(path)} bytes)")

    print("\n--- (2) the snapshot")
    try:
        with open(path, "rb") as f:
            dumped = pickle.load(f)
        check_snapshot(dumped, path, here_file)
    except Exception:
        check(False, "reading and checking the dumped snapshot", traceback.format_exc())
        dumped = snap

    print("\n--- (3) PyTorch's tools on cudamem's snapshot")
    cudamem_stats = check_tools(dumped, path, out, "cudamem")

    print("\n--- (4) cudamem's reports on it")
    try:
        leaks = cudamem.report_leaks(path, top=3, frames=4)
        print(head(leaks, 12))
        check(bool(leaks), "cudamem.report_leaks(snapshot)")
        print(head(cudamem.report_why(path, top=3), 8))
        check(True, "cudamem.report_why(snapshot)")
        viz = cudamem.viz(path, os.path.join(out, "cudamem_viz.html"), title="cudamem history_check")
        check(os.path.getsize(viz) > 1000, f"cudamem.viz(snapshot) wrote {os.path.getsize(viz) / 1e3:.0f} kB")
    except Exception:
        check(False, "cudamem's reports", traceback.format_exc())

    print("\n--- (5) the same workload with PyTorch's allocator (subprocess), for comparison")
    native = os.path.join(out, "native_snapshot.pickle")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDAMEM_")}
    try:
        r = subprocess.run([sys.executable, __file__, "--native", native], capture_output=True, text=True,
                           timeout=90, env=env)  # fmt: skip
        print(r.stdout.rstrip())
        ok = check(r.returncode == 0 and os.path.exists(native), "PyTorch's own _record_memory_history + _dump_snapshot",
                   "\n".join("  " + l for l in r.stderr.splitlines()[-30:]))  # fmt: skip
    except subprocess.TimeoutExpired:
        ok = check(False, "PyTorch's own _record_memory_history + _dump_snapshot (timed out)")
    if ok:
        with open(native, "rb") as f:
            nsnap = pickle.load(f)
        native_stats_ok, native_stats, detail = run_memviz(["stats", native], os.path.join(out, "native_memviz_stats.txt"))
        check(native_stats_ok, "[native] python3 -m torch.cuda._memory_viz stats", detail)
        print()
        side_by_side(native_stats, cudamem_stats or "(failed)", "stats: PyTorch's allocator", "stats: cudamem")
        nc, cc = action_counts(nsnap), action_counts(dumped)
        print(f"\n  {'action':<16} {'native':>8} {'cudamem':>8}")
        for a in sorted(set(nc) | set(cc)):
            print(f"  {a:<16} {nc[a]:>8} {cc[a]:>8}")
        nf = sum(1 for d in nsnap["device_traces"] for e in d if e["action"] == "alloc" and e.get("frames"))
        na = nc["alloc"]
        print(f"  alloc entries with frames: native {nf}/{na}, cudamem "
              f"{sum(1 for d in dumped['device_traces'] for e in d if e['action'] == 'alloc' and e.get('frames'))}/{cc['alloc']}")  # fmt: skip
        print(f"  snapshot sizes: native {os.path.getsize(native)} bytes, cudamem {os.path.getsize(path)} bytes")
        # Schema differences (information, not failures: a newer torch may add keys).
        def missing(native_keys, ours):
            gone = sorted(set(native_keys) - set(ours))
            return f"missing in cudamem's: {gone}" if gone else "cudamem's has all of them"

        print(f"  top-level keys: native {sorted(nsnap)}; {missing(nsnap, dumped)}")
        if nsnap["segments"] and dumped["segments"]:
            ns, cs = nsnap["segments"][0], dumped["segments"][0]
            print(f"  segment keys: native {sorted(ns)}; {missing(ns, cs)}")
            if ns["blocks"] and cs["blocks"]:
                print(f"  block keys: native {sorted(ns['blocks'][0])}; {missing(ns['blocks'][0], cs['blocks'][0])}")
        ne = next((e for d in nsnap["device_traces"] for e in d if e["action"] == "alloc"), None)
        ce = next((e for d in dumped["device_traces"] for e in d if e["action"] == "alloc"), None)
        if ne and ce:
            print(f"  alloc entry keys: native {sorted(ne)}; {missing(ne, ce)}")
        print(f"  allocator_settings keys: native {sorted(nsnap.get('allocator_settings', {}))}; "
              f"{missing(nsnap.get('allocator_settings', {}), dumped['allocator_settings'])}")  # fmt: skip

    print(f"\nhistory_check: {len(passes)} passed, {len(failures)} failed ({time.perf_counter() - t_start:.0f} s)")
    for f in failures:
        print("  FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--native":
        native_main(sys.argv[2])
        sys.exit(0)
    sys.exit(main())
