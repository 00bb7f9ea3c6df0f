"""Torch's allocator trace trackers with cudamem as torch's native allocator, checked on a GPU
through their main user: ProcessGroupNCCL's tensor registration
(TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1 registers every segment with the communicator
when it is made, and deregisters it when it is freed).

    python3 tracker_check.py

One single-rank NCCL process group per allocator, each in its own process with NCCL_DEBUG=INFO:
torch's allocator, cudamem with its `pytorch` policy (whole segments, as torch's) and with its
default policy (mapped pages: torch's hook registers whole segments, as with torch's expandable
segments). Tensors are allocated after the communicator exists, all-reduced, freed and the cache
emptied. The lines NCCL logs about registration are counted; the checks pass when the
all_reduce is right with cudamem and, with whole segments, cudamem's registrations are seen as
torch's are.
The last line is "N passed, M failed".
"""

import os
import re
import subprocess
import sys
import tempfile

CHILD = r"""
import os, sys
mode = sys.argv[1]
if mode.startswith("cudamem"):
    import cudamem.torch as ct
    ct.install(native=True, policy=mode.split(":")[1] if ":" in mode else None)
import torch
import torch.distributed as dist
store = dist.FileStore(sys.argv[2], 1)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)  # creates the communicator: existing segments are registered then
big = [torch.full((8 << 20,), 2.0, device="cuda") for _ in range(3)]  # new segments: the hook
for t in big:
    dist.all_reduce(t)
torch.cuda.synchronize()
ok = all(t.sum().item() == 2.0 * t.numel() for t in big) and x.sum().item() == x.numel()
del big
torch.cuda.empty_cache()  # segment frees: deregistration
dist.destroy_process_group()
print("RESULT", "ok" if ok else "wrong", flush=True)
"""

REG = re.compile(r"regist", re.I)


def run(mode):
    env = dict(os.environ, TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK="1", NCCL_DEBUG="INFO",
               NCCL_DEBUG_SUBSYS="ALL")
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-c", CHILD, mode, os.path.join(d, "store")], env=env,
                           capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    lines = [ln for ln in out.splitlines() if "NCCL INFO" in ln and REG.search(ln)]
    return r.returncode, "RESULT ok" in out, lines, out


def main():
    modes = ("native", "cudamem:pytorch", "cudamem")
    results = {m: run(m) for m in modes}
    passed = failed = 0
    for m, (rc, ok, lines, out) in results.items():
        print(f"{m}: rc={rc} all_reduce {'right' if ok else 'WRONG or missing'}; "
              f"{len(lines)} NCCL log lines about registration")
        for ln in lines[:6]:
            print("    " + ln[:200])
        if rc != 0 or not ok:
            print("   output tail:\n" + "\n".join("    " + x for x in out.splitlines()[-25:]))
    for m in modes[1:]:
        rc, ok = results[m][:2]
        if rc == 0 and ok:
            passed += 1
            print(f"PASS NCCL process group with the registration hook runs on {m}")
        else:
            failed += 1
            print(f"FAIL NCCL process group with the registration hook on {m}")
    n, c = len(results["native"][2]), len(results["cudamem:pytorch"][2])
    if c >= n:
        passed += 1
        print(f"PASS registrations seen: cudamem:pytorch {c}, torch's allocator {n}")
    else:
        failed += 1
        print(f"FAIL registrations seen: cudamem:pytorch {c} < torch's allocator {n}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
