#!/usr/bin/env bash
# The two-GPU run of the scale-out issue: GPT-2 small under DDP on 2 GPUs, once with PyTorch's
# allocator and once with cudamem in every rank; prints a table (loss, step time, peak
# reserved per rank, memory outside the allocator per rank). Needs a machine with 2 GPUs and the
# wheel from scripts/gpu/torch/build.sh in gpu-out/. NVLink multicast stays off (it can put the
# host's GPUs out of service).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
wheel=$(ls -t gpu-out/cudamem-*.whl | head -n 1)
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site "$wheel" || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
timeout 120 python3 scripts/gpu/ddp/two_devices.py 2>&1
out=$(mktemp)
for a in native cudamem; do
    timeout 300 torchrun --standalone --nproc_per_node 2 scripts/gpu/ddp/train_ddp.py --allocator $a 2>&1 | tee -a "$out" | grep -v '^RESULT'
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l[7:]) for l in open(sys.argv[1]) if l.startswith("RESULT ")]
print("| allocator | rank | final loss | median step ms | peak allocated GB | peak reserved GB | outside allocator GB |")
print("|---|---|---|---|---|---|---|")
losses = {(r["allocator"], r["rank"]): r["losses"] for r in rows}
for r in sorted(rows, key=lambda r: (r["allocator"], r["rank"])):
    print(f"| {r['allocator']} | {r['rank']} | {r['losses'][-1]:.6f} | {r['median_step_ms']:.2f} | "
          f"{r['peak_allocated']/1e9:.2f} | {r['peak_reserved']/1e9:.2f} | {r['outside_allocator']/1e9:.2f} |")
for rank in sorted({r["rank"] for r in rows}):
    n, c = losses.get(("native", rank)), losses.get(("cudamem", rank))
    if n and c:
        rel = max(abs(x - y) / abs(x) for x, y in zip(n, c))
        print(f"rank {rank}: loss curves over {len(n)} steps, largest relative difference {rel:.2e}")
PY
