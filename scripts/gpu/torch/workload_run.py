"""One workload in one process, with native torch or with cudamem; run by workloads.py.

    python3 workload_run.py WORKLOAD VARIANT
    WORKLOAD: gpt2 | resnet50 | bert | alloc
    VARIANT:  native | cudamem | cudamem:<policy>    (policy: cudamem, pytorch, pytorch-expandable)

Prints one line `RESULT {json}` at the end: step times, peaks, per-step losses (and their
float.hex() for bitwise comparison), allocator counters.

Workloads (fixed seeds; deterministic algorithms where the model allows, warn-only elsewhere):
* gpt2: GPT2LMHeadModel(GPT2Config()) randomly initialised, batch 8 x 1024 random tokens, bf16
  autocast, AdamW, 12 steps; the figure is the median step time of steps 5-12.
* resnet50: torchvision resnet50(), batch 64 x 3 x 224 x 224 random images, bf16 autocast, SGD
  with momentum, 12 steps; median of steps 5-12.
* bert: BertModel(BertConfig()) in fp16, inference on 60 batches of random size 1-64 and length
  8-512 (the same sequence in every run); the figure is the median time per batch, the "losses"
  are per-batch checksums of the output.
* alloc: the allocator alone: 20,000 torch.empty of random sizes (512 B - 64 MiB, log-uniform)
  with 64 live at a time; the figure is microseconds per allocation + free.
"""

import json
import random
import statistics
import os
import sys
import time
import warnings

WORKLOAD, VARIANT = sys.argv[1], sys.argv[2]
USE_CUDAMEM = VARIANT.startswith("cudamem")

t_start = time.perf_counter()
if USE_CUDAMEM:
    import cudamem
    import cudamem.torch

    policy = VARIANT.split(":", 1)[1] if ":" in VARIANT else None
    cudamem.torch.install(policy=policy)

import torch  # noqa: E402

warnings.filterwarnings("once")
torch.manual_seed(0)
random.seed(0)
if os.environ.get("CUDAMEM_WORKLOAD_CUDNN_BENCHMARK") == "1":
    torch.backends.cudnn.benchmark = True  # autotuning asks the allocator's cacheInfo
else:
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
try:
    # Filling every torch.empty with NaN (the deterministic mode's default) costs time and is not
    # needed for reproducible results of these models.
    import torch.utils.deterministic

    torch.utils.deterministic.fill_uninitialized_memory = False
except (ImportError, AttributeError):
    pass
dev = torch.device("cuda")


def sync_time():
    torch.cuda.synchronize()
    return time.perf_counter()


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config()).to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    times, losses = [], []
    for _ in range(12):
        ids = torch.randint(0, model.config.vocab_size, (8, 1024), generator=gen).to(dev)
        t0 = sync_time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = sync_time()
        times.append(t1 - t0)
        losses.append(loss.item())
    return times[4:], losses


def resnet50():
    import torchvision

    model = torchvision.models.resnet50().to(dev)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    times, losses = [], []
    for _ in range(12):
        x = torch.randn(64, 3, 224, 224, generator=gen).to(dev)
        y = torch.randint(0, 1000, (64,), generator=gen).to(dev)
        t0 = sync_time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = sync_time()
        times.append(t1 - t0)
        losses.append(loss.item())
    return times[4:], losses


def bert():
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).to(dev).half().eval()
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(1)
    shapes = [(rng.randint(1, 64), rng.randint(8, 512)) for _ in range(60)]
    times, sums = [], []
    with torch.inference_mode():
        for b, n in shapes:
            ids = torch.randint(0, model.config.vocab_size, (b, n), generator=gen).to(dev)
            mask = torch.ones(b, n, dtype=torch.long).to(dev)
            t0 = sync_time()
            out = model(input_ids=ids, attention_mask=mask).last_hidden_state
            s = out.double().sum()
            t1 = sync_time()
            times.append(t1 - t0)
            sums.append(s.item())
    return times, sums


def alloc():
    rng = random.Random(1)
    sizes = [int(2 ** rng.uniform(9, 26)) for _ in range(20000)]
    live = [None] * 64
    for i in range(2000):  # warm-up: fill the cache
        live[i % 64] = torch.empty(sizes[i], dtype=torch.uint8, device=dev)
    t0 = sync_time()
    for i, s in enumerate(sizes):
        live[i % 64] = torch.empty(s, dtype=torch.uint8, device=dev)
    t1 = sync_time()
    del live
    per_op = (t1 - t0) / len(sizes)
    return [per_op], []


RUNS = {"gpt2": gpt2, "resnet50": resnet50, "bert": bert, "alloc": alloc}
times, losses = RUNS[WORKLOAD]()
torch.cuda.synchronize()

if USE_CUDAMEM:
    stats = cudamem.memory_stats()
    peak_alloc, peak_res = cudamem.max_memory_allocated(), cudamem.max_memory_reserved()
    extra = {"install_mode": cudamem.torch.install_mode(), "policy": cudamem.info()["allocators"][0]["policy"]}
else:
    stats = torch.cuda.memory_stats()
    peak_alloc, peak_res = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    extra = {"policy": "native", "backend": torch.cuda.get_allocator_backend()}
free, total = torch.cuda.mem_get_info()
result = {
    "workload": WORKLOAD,
    "variant": VARIANT,
    "median_s": statistics.median(times),
    "times_s": times,
    "peak_allocated": peak_alloc,
    "peak_reserved": peak_res,
    "device_used_end": total - free,
    "num_device_alloc": stats.get("num_device_alloc"),
    "num_device_free": stats.get("num_device_free"),
    "num_alloc_retries": stats.get("num_alloc_retries"),
    "num_ooms": stats.get("num_ooms"),
    "losses": losses,
    "losses_hex": [float(v).hex() for v in losses],
    "wall_s": time.perf_counter() - t_start,
    "torch": torch.__version__,
    "install_mode": cudamem.torch.install_mode() if USE_CUDAMEM else "none",
    **extra,
}
print("RESULT " + json.dumps(result))
