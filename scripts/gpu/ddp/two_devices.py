"""Two GPUs in one process with cudamem installed: per-device allocators and peer copies.

Run on a machine with two GPUs (run.sh does, before the DDP runs). Prints one line per check
and `TWO_DEVICES PASS` or `TWO_DEVICES FAIL`; exits non-zero on failure.
"""

import sys

import cudamem.torch

cudamem.torch.install()
import torch  # noqa: E402

failures = 0


def check(name, ok, detail=""):
    global failures
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
    failures += 0 if ok else 1


assert torch.cuda.device_count() >= 2, "needs two GPUs"
mib = 1 << 20
a = torch.arange(64 * mib // 4, dtype=torch.float32, device="cuda:0")
b = torch.empty(32 * mib // 4, dtype=torch.float32, device="cuda:1")
s0, s1 = torch.cuda.memory_allocated(0), torch.cuda.memory_allocated(1)
check("each device counts its own tensors", s0 == 64 * mib and s1 == 32 * mib, f"cuda:0 {s0} B, cuda:1 {s1} B")
check("pointers lie on their own devices", a.device.index == 0 and b.device.index == 1)

# Peer copies both ways (NVLink or PCIe), then compare on the host.
c = a.to("cuda:1")
d = c.to("cuda:0")
torch.cuda.synchronize(0)
torch.cuda.synchronize(1)
check("copy cuda:0 -> cuda:1 -> cuda:0 is exact", torch.equal(a, d))
check("the copy on cuda:1 is counted on cuda:1", torch.cuda.memory_allocated(1) == 96 * mib,
      f"{torch.cuda.memory_allocated(1)} B")

p0, p1 = torch.cuda.max_memory_allocated(0), torch.cuda.max_memory_allocated(1)
# Peaks are per device: at least what lives there now (torch's copies may add temporaries),
# and cuda:1's does not include cuda:0's 128 MiB.
check("per-device peaks", p0 >= 128 * mib and 96 * mib <= p1 < 96 * mib + 128 * mib, f"{p0} / {p1} B")

# A cross-device computation and frees on each side.
e = (c * 2).to("cuda:0") - a * 2
check("computation across devices", float(e.abs().max()) == 0.0)
del a, b, c, d, e
torch.cuda.synchronize(0)
torch.cuda.synchronize(1)
check("all freed", torch.cuda.memory_allocated(0) == 0 and torch.cuda.memory_allocated(1) == 0,
      f"{torch.cuda.memory_allocated(0)} / {torch.cuda.memory_allocated(1)} B")
r1 = torch.cuda.memory_reserved(1)
torch.cuda.empty_cache()
check("empty_cache returns each device's cache", torch.cuda.memory_reserved(0) == 0 and torch.cuda.memory_reserved(1) == 0,
      f"cuda:1 reserved {r1} -> {torch.cuda.memory_reserved(1)} B")
st0, st1 = torch.cuda.memory_stats(0), torch.cuda.memory_stats(1)
check("memory_stats per device", st0["num_device_alloc"] > 0 and st1["num_device_alloc"] > 0
      and st0["allocated_bytes.all.current"] == 0 and st1["allocated_bytes.all.current"] == 0)
print("TWO_DEVICES", "PASS" if failures == 0 else f"FAIL ({failures})")
sys.exit(1 if failures else 0)
