"""What the zoo's jobs share: the training loop, the sizes, and plain-torch building blocks.

Every job is ``run(batch, dev, dry=False)``: it builds its model on ``dev`` with random weights,
makes its data on ``dev``, runs its steps and reads no tensor value, so that the same function
runs on the GPU, under ``torch.cuda.memory._record_memory_history`` and under
``cudamem.estimate`` (meta tensors, no GPU). ``dry=True`` builds the same job at a tiny size, for
trying the runner on a machine without a GPU. Library imports (transformers, timm, torchvision,
torchaudio, peft) happen inside the jobs, so the registry imports with torch alone.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


#: Optimizer steps of a training job when its ``train`` call names none; a runner that times
#: steps raises it (the memory of steps after the second is the second's).
STEPS = 3
#: Called after every optimizer step when set (a runner's step timer); None: nothing.
on_step = None


def train(model, make_batch, loss_of, *, steps=None, opt="adamw", lr=1e-4, amp=torch.bfloat16, accumulate=1):
    """``steps`` (default :data:`STEPS`) optimizer steps over the trainable parameters, each
    over ``accumulate`` micro-batches (``make_batch()``, loss ``loss_of(model, batch)`` under
    autocast ``amp``; None: no autocast); :data:`on_step` hears the end of each."""
    steps = STEPS if steps is None else steps
    params = [p for p in model.parameters() if p.requires_grad]
    if opt == "adamw":
        optim = torch.optim.AdamW(params, lr=lr)
    elif opt == "sgd":
        optim = torch.optim.SGD(params, lr=lr, momentum=0.9)
    else:
        raise ValueError(f"opt: 'adamw' or 'sgd', got {opt!r}")
    for _ in range(steps):
        for _ in range(accumulate):
            batch = make_batch()
            with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                loss = loss_of(model, batch)
            (loss / accumulate if accumulate > 1 else loss).backward()
            del loss, batch
        optim.step()
        optim.zero_grad(set_to_none=True)
        if on_step is not None:
            on_step()


def freeze(module):
    for p in module.parameters():
        p.requires_grad_(False)
    return module


class Block(nn.Module):
    """A pre-norm transformer block (attention through scaled_dot_product_attention)."""

    def __init__(self, d, heads, ff=4, causal=True):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, ff * d), nn.Linear(ff * d, d)
        self.heads, self.causal = heads, causal

    def attend(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attend(x)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """A decoder-only language model of ``Block``s, for the jobs that need no library."""

    def __init__(self, vocab, d, heads, layers, seq):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1), device=ids.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def lm_loss(logits, ids):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
