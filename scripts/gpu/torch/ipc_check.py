"""CUDA tensors sent to another process with torch.multiprocessing, with cudamem as torch's
native allocator on either side, checked on a GPU.

    python3 ipc_check.py            # every case, each in a fresh parent process

A case is (sender's allocator, receiver's allocator, memory): the sender makes tensors of 512 B,
1 MiB and 64 MiB + 4 KiB, sends them to a spawned child, which checks their values, adds 1 in
place and answers; the sender then sees the child's writes in its own tensors (the memory is
shared, not copied). Memory is "plain" (whole segments: cudamem's `pytorch` policy, torch's
default) or "vmm" (mapped pages: cudamem's default policy, torch's expandable segments).
Each case prints "PASS case" or "FAIL case: why", or "INFO case: ..." for a combination cudamem
documents as unsupported (torch's allocator cannot open cudamem's mapped memory unless all its
physical allocations have one size); the last line is "N passed, M failed".
"""

import os
import subprocess
import sys
import traceback

SIZES = [512, 1 << 20, (64 << 20) + 4096]


def child(mode, q_in, q_out):
    try:
        if mode == "cudamem":
            import cudamem.torch as ct

            ct.install(native=True)
        import torch

        tensors = q_in.get()
        sums = []
        for i, t in enumerate(tensors):
            expect = float(t.numel() * (i + 1))
            got = t.float().sum().item()
            if got != expect:
                raise AssertionError(f"tensor {i}: sum {got}, expected {expect}")
            t.add_(1)
            sums.append(got)
        torch.cuda.synchronize()
        del tensors, t
        q_out.put(("ok", sums, torch.cuda.memory_allocated()))
    except Exception as e:  # reported to the parent, which fails the case
        q_out.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}", 0))


def parent(sender, receiver, memory):
    if sender == "cudamem":
        os.environ["CUDAMEM_POLICY"] = "pytorch" if memory == "plain" else "cudamem"
        import cudamem.torch as ct

        ct.install(native=True)
    elif memory == "vmm":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    import torch.multiprocessing as mp

    tensors = [torch.full((n // 4,), float(i + 1), device="cuda") for i, n in enumerate(SIZES)]
    if sender == "cudamem":
        seg = [s for s in torch.cuda.memory_snapshot() if s["total_size"] > 0]
        kinds = {s["is_expandable"] for s in seg}
        want = memory == "vmm"
        if want not in kinds:
            raise AssertionError(f"the sender's segments are not {memory}: is_expandable {kinds}")
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(receiver, q_in, q_out))
    p.start()
    q_in.put(tensors)
    status, detail, child_allocated = q_out.get(timeout=120)
    p.join(60)
    if status != "ok":
        raise RuntimeError(f"the receiver failed: {detail}")
    torch.cuda.synchronize()
    for i, t in enumerate(tensors):
        want = float(t.numel() * (i + 2))
        got = t.float().sum().item()
        if got != want:
            raise AssertionError(f"tensor {i}: the sender sees sum {got} after the receiver's add, expected {want}")
    if child_allocated != 0:
        raise AssertionError(f"received memory counted as the receiver's own: memory_allocated() = {child_allocated}")
    del tensors
    torch.cuda.ipc_collect()
    torch.cuda.empty_cache()
    print(f"  sender {sender} ({memory}) -> receiver {receiver}: sums {detail}; "
          f"sender reserved after release {torch.cuda.memory_reserved()}")


CASES = [
    ("cudamem", "cudamem", "plain"),
    ("cudamem", "cudamem", "vmm"),
    ("cudamem", "native", "plain"),
    ("native", "cudamem", "plain"),
    ("native", "cudamem", "vmm"),
    ("cudamem", "native", "vmm"),
]
# torch's allocator opens cudamem's mapped memory only when every physical allocation behind a
# tensor has one size (torch's "e" handle); otherwise it cannot: informational.
INFO_ONLY = {("cudamem", "native", "vmm")}


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--case":
        parent(*sys.argv[2:5])
        return
    passed = failed = 0
    for case in CASES:
        name = "%s -> %s, %s memory" % case
        r = subprocess.run([sys.executable, __file__, "--case", *case], capture_output=True, text=True, timeout=300)
        out = (r.stdout + r.stderr).strip()
        if r.returncode == 0:
            passed += 1
            print(f"PASS {name}\n{r.stdout.rstrip()}", flush=True)
        elif case in INFO_ONLY:
            print(f"INFO {name}: not supported by torch's allocator: {out.splitlines()[-1] if out else ''}", flush=True)
        else:
            failed += 1
            print(f"FAIL {name}:\n{out[-3000:]}", flush=True)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
