"""Writes the fixtures of crates/estimate/tests: a small GPT-shaped decoder (fit_models.py's
Transformer with 2 layers, 128 wide, 4 heads, vocabulary 1000, 128 tokens) trained for 2 steps
with bf16 autocast and AdamW, recorded without a GPU by cudamem.estimate at batch 1, 2, 3
(the scaling inputs) and 8 (the truth the prediction is checked against).

    python3 crates/estimate/tests/data/make.py      # needs torch and the cudamem package

The resnet50_cudnn_b*.pickle.gz fixtures are real traces, not made here: fit_models.resnet50
(cudnn.benchmark, bf16 autocast, 3 steps) recorded on an H200 with torch 2.11 at batch 8, 16,
24, 64 and 900 by `python3 scripts/gpu/torch/fit_check.py --child run resnet50 B --trace F`.
"""

import gzip
import pickle
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[3] / "scripts" / "gpu" / "torch"))
import cudamem.estimate as est  # noqa: E402
from fit_models import Transformer  # noqa: E402


def job(batch):
    torch.manual_seed(0)
    m = Transformer(1000, d=128, heads=4, layers=2, seq=128).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(2):
        ids = torch.randint(0, 1000, (batch, 128), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = m(ids)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), ids.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, loss


for b in (1, 2, 3, 8):
    with est.recording() as rec:
        job(b)
    with gzip.open(HERE / f"tiny_gpt_b{b}.pickle.gz", "wb", compresslevel=9) as f:
        pickle.dump(rec.builder.snapshot(), f, protocol=4)
