"""GPT-2 small under DDP (NCCL), one process per GPU, with PyTorch's allocator or cudamem's.

Run by run.sh through `torchrun --nproc_per_node 2 train_ddp.py --allocator native|cudamem`.
Each rank prints one `RESULT {json}` line: losses, median step time of steps 5-12, peak
allocated / reserved of the allocator in use, and the device memory in use outside the allocator
(context, NCCL buffers) from mem_get_info.

To enable cudamem in your own torchrun job, the same two lines as on one GPU, in every rank,
before the first CUDA tensor (torchrun starts one process per rank, and each gets its own
allocator for its device):

    import cudamem.torch
    cudamem.torch.install()
"""

import argparse
import json
import os
import statistics
import time

parser = argparse.ArgumentParser()
parser.add_argument("--allocator", choices=["native", "cudamem"], required=True)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()

if args.allocator == "cudamem":
    import cudamem.torch

    cudamem.torch.install()

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import GPT2Config, GPT2LMHeadModel

rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config()).cuda()
model = DDP(model, device_ids=[rank])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
g = torch.Generator(device="cuda").manual_seed(1000 + rank)
losses, times = [], []
for step in range(args.steps):
    x = torch.randint(0, 50257, (8, 1024), device="cuda", generator=g)
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    losses.append(loss.item())
free, total = torch.cuda.mem_get_info()
reserved = torch.cuda.memory_reserved()
result = {
    "rank": rank,
    "allocator": args.allocator,
    "losses": losses,
    "median_step_ms": 1000 * statistics.median(times[4:]),
    "peak_allocated": torch.cuda.max_memory_allocated(),
    "peak_reserved": torch.cuda.max_memory_reserved(),
    "device_used": total - free,
    "outside_allocator": total - free - reserved,
}
print("RESULT " + json.dumps(result), flush=True)
dist.destroy_process_group()
